"""petastorm.fs: dataset URLs to filesystems: schemes, the ``filesystem`` argument, lists of URLs, S3 clients and
their options, and options a filesystem refuses.

Everything here runs without a server: ``memory://`` and fsspec filesystems made in the test (see
:mod:`support.fake_storage`) stand in for remote storage.
"""

from __future__ import annotations

import re
import socket
import sys
from urllib.parse import urlparse

import fsspec
import numpy as np
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.memory import MemoryFileSystem

from petastorm import make_batch_reader, make_reader
from petastorm.errors import MissingDependencyError, StorageError
from petastorm.fs import StorageHandler, normalize_dir_url, path_to_url, resolve_location, resolve_url
from support.fake_storage import SECRET, assert_secret_hidden


def test_normalize_dir_url_strips_one_slash_and_takes_absolute_paths_as_file_urls():
    assert normalize_dir_url('s3://bucket/path/') == 's3://bucket/path'
    assert normalize_dir_url('file:///a//') == 'file:///a/'
    for bad in (None, 123, ['file:///a']):
        with pytest.raises(ValueError, match='directory url must be a string'):
            normalize_dir_url(bad)
    assert normalize_dir_url('/tmp/dataset/') == 'file:///tmp/dataset'
    assert normalize_dir_url('bucket/dataset', filesystem=object()) == 'bucket/dataset', 'a path on that filesystem'
    with pytest.raises(ValueError, match="relative path.*'file:///"):
        normalize_dir_url('tmp/dataset')


def test_file_urls_resolve_to_the_local_filesystem(tmp_path):
    fs, path = resolve_url(path_to_url(str(tmp_path)) + '/')
    assert isinstance(fs, pafs.LocalFileSystem)
    assert path == str(tmp_path)
    assert resolve_url('file://localhost/tmp')[1] == '/tmp'
    with pytest.raises(ValueError, match='names host'):
        resolve_url('file://otherhost/tmp')


def test_memory_url_round_trip_through_both_readers(memory_dataset):
    with make_reader(memory_dataset, reader_pool_type='thread', workers_count=3) as reader:
        rows = sorted((row.id, row.vector[0]) for row in reader)
    assert rows == [(i, float(i)) for i in range(200)]
    with make_batch_reader(memory_dataset, schema_fields=['id'], reader_pool_type='dummy') as reader:
        ids = np.concatenate([batch.id for batch in reader])
    assert sorted(ids.tolist()) == list(range(200))


def test_unknown_scheme_is_a_value_error_naming_the_url():
    with pytest.raises(ValueError, match=r"cannot open nosuchfs://bucket/x: unknown URL scheme 'nosuchfs'"):
        resolve_url('nosuchfs://bucket/x')
    with pytest.raises(ValueError, match='unknown URL scheme'):
        make_reader('nosuchfs://bucket/x')


@pytest.mark.parametrize(('url', 'module', 'extra'), [
    ('s3://bucket/data', 's3fs', 'neo-petastorm[s3]'),
    ('s3a://bucket/data', 's3fs', 'neo-petastorm[s3]'),
    ('gs://bucket/data', 'gcsfs', 'neo-petastorm[gcs]'),
    ('gcs://bucket/data', 'gcsfs', 'neo-petastorm[gcs]'),
    ('abfs://container/data', 'adlfs', 'neo-petastorm[azure]'),
])
def test_missing_optional_package_names_the_pip_extra(monkeypatch, url, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    for protocol in ('s3', 's3a', 'gs', 'gcs', 'abfs'):  # forget classes imported before
        monkeypatch.delitem(sys.modules['fsspec.registry']._registry, protocol, raising=False)
    # Options only the fsspec client takes: pyarrow's own GCS and Azure clients need no package.
    options = {'gs': {'token': 'anon', 'requester_pays': True}, 'gcs': {'token': 'anon', 'requester_pays': True},
               'abfs': {'account_name': 'acc', 'location_mode': 'secondary'}}.get(url.split(':')[0])
    with pytest.raises(MissingDependencyError, match=re.escape(f"pip install '{extra}'")) as raised:
        resolve_url(url, options)
    assert url in str(raised.value)
    assert isinstance(raised.value, ImportError)


def test_azure_schemes_use_adlfs():
    from petastorm.fs._resolve import fsspec_class

    try:
        import adlfs  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match='adlfs'):
            fsspec_class('abfss', 'abfss://container@account.dfs.core.windows.net/data')
    else:
        assert fsspec_class('abfss', 'abfss://c@a.dfs.core.windows.net/d').__name__ == 'AzureBlobFileSystem'


def test_filesystem_argument_accepts_pyarrow_and_fsspec_filesystems(memory_dataset):
    memory = fsspec.filesystem('memory')
    fs, path = resolve_url(memory_dataset, filesystem=memory)
    assert isinstance(fs, pafs.PyFileSystem)
    assert isinstance(fs.handler, StorageHandler)
    assert fs.get_file_info(path).type == pafs.FileType.Directory
    local = pafs.LocalFileSystem()
    assert resolve_url('file:///tmp', filesystem=local) == (local, '/tmp')
    assert resolve_url('file:///tmp', filesystem=ArrowFSWrapper(local))[0] is local
    assert resolve_url('s3://bucket/key', filesystem=pafs.SubTreeFileSystem('/tmp', local))[1] == 'bucket/key'
    with pytest.raises(TypeError, match='pyarrow.fs.FileSystem or an fsspec filesystem'):
        resolve_url('file:///tmp', filesystem=object())
    with make_reader(memory_dataset, filesystem=memory, reader_pool_type='dummy') as reader:
        assert sum(1 for _ in reader) == 200


def test_url_lists_share_scheme_and_host(memory_dataset):
    files = [f for f in fsspec.filesystem('memory').find(urlparse(memory_dataset).path) if f.endswith('.parquet')]
    location = resolve_location([f'memory://{f}' for f in files])
    assert location.is_file_list
    assert location.path == files
    with pytest.raises(ValueError, match='same scheme and netloc'):
        resolve_location(['s3://a/x', 's3://b/y'])
    with pytest.raises(ValueError, match='non-empty'):
        resolve_location([])


def test_s3_options_pyarrow_can_take_get_its_own_client():
    import pyarrow as pa

    with socket.socket() as listening:  # resolving checks that something listens at the endpoint
        listening.bind(('127.0.0.1', 0))
        listening.listen()
        endpoint = f'http://127.0.0.1:{listening.getsockname()[1]}'
        fs, path = resolve_url('s3a://bucket/data', {'key': 'k', 'secret': SECRET, 'endpoint_url': endpoint})
    assert isinstance(fs, pafs.S3FileSystem)
    assert path == 'bucket/data'
    assert fs.region == 'us-east-1'
    assert pa.io_thread_count() >= 64  # its connections: as many as pyarrow's I/O threads


def test_s3fs_gets_standard_retries_and_more_connections_unless_the_user_sets_them():
    pytest.importorskip('s3fs')
    with socket.socket() as listening:  # resolving checks that something listens at the endpoint
        listening.bind(('127.0.0.1', 0))
        listening.listen()
        endpoint = f'http://127.0.0.1:{listening.getsockname()[1]}'
        # a read timeout is for s3fs: pyarrow's client applies its own on Windows and macOS only
        fs, path = resolve_url('s3a://bucket/data', {'key': 'k', 'secret': SECRET, 'endpoint_url': endpoint,
                                                     'config_kwargs': {'read_timeout': 30}})
    assert path == 'bucket/data'
    assert fs.handler.fs.config_kwargs['retries'] == {'max_attempts': 5, 'mode': 'standard'}
    mine = {'key': 'k', 'secret': SECRET, 'config_kwargs': {'retries': {'max_attempts': 2}, 'read_timeout': 5}}
    fs, _ = resolve_url('s3://bucket/data', mine)
    assert fs.handler.fs.config_kwargs == {'retries': {'max_attempts': 2}, 'read_timeout': 5,
                                           'max_pool_connections': 64}
    fs, _ = resolve_url('s3://bucket/data', {**mine, 'config_kwargs': {'max_pool_connections': 3}})
    assert fs.handler.fs.config_kwargs['max_pool_connections'] == 3
    assert mine == {'key': 'k', 'secret': SECRET, 'config_kwargs': {'retries': {'max_attempts': 2}, 'read_timeout': 5}}


class _PickyFileSystem(MemoryFileSystem):
    """Refuses its options, quoting them (as a careless library might)."""

    protocol = 'pickytest'

    def __init__(self, **options):
        raise ValueError(f'unsupported options {options}')


def test_bad_storage_options_name_the_url_and_hide_secrets(monkeypatch):
    monkeypatch.setitem(sys.modules['fsspec.registry']._registry, 'pickytest', _PickyFileSystem)
    with pytest.raises(StorageError, match=r'cannot create the pickytest:// filesystem for pickytest://x/y') as raised:
        resolve_url('pickytest://x/y', {'token': SECRET, 'no_such_option': 1})
    assert "'token': '***'" in str(raised.value)
    assert_secret_hidden(raised.value)
