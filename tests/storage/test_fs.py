"""petastorm.fs: URL resolution, errors, retries, ranged reads, HDFS namenodes and Petastorm's fs_utils API.

Everything here runs without a server: ``memory://`` and fsspec filesystems made in the test stand in for remote
storage, and HDFS is resolved from Hadoop XML files written to a temporary ``$HADOOP_HOME``.
"""

from __future__ import annotations

import pickle
import re
import socket
import sys
import uuid
from urllib.parse import urlparse

import cloudpickle
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.memory import MemoryFileSystem

import petastorm.fs.hadoop as hadoop
from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.errors import (
    MissingDependencyError,
    StorageCredentialsError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
)
from petastorm.fs import (
    RetryPolicy,
    StorageHandler,
    normalize_dir_url,
    path_to_url,
    resolve_location,
    resolve_url,
)
from petastorm.fs._errors import classify, is_transient, redact, secrets_of
from petastorm.fs.compat import FilesystemResolver
from petastorm.fs_utils import get_dataset_path, get_filesystem_and_path_or_paths
from petastorm.hdfs.namenode import (
    HAHdfsClient,
    HdfsConnectError,
    HdfsConnector,
    HdfsNamenodeResolver,
    MaxFailoversExceeded,
)
from petastorm.unischema import Unischema, UnischemaField

SECRET = 'sup3r-s3cret-value-xyz'

Schema = Unischema('FsSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vector', np.float32, (8,), NdarrayCodec(), False),
])


def _rows(n: int):
    return ({'id': i, 'vector': np.full(8, i, np.float32)} for i in range(n))


@pytest.fixture
def memory_url():
    """A fresh ``memory://`` dataset URL, removed afterwards."""
    root = f'/petastorm-tests/{uuid.uuid4().hex}'
    yield f'memory://{root}'
    memory = fsspec.filesystem('memory')
    if memory.exists(root):
        memory.rm(root, recursive=True)


@pytest.fixture
def memory_dataset(memory_url):
    write_dataset(memory_url, Schema, _rows(200), row_group_size_mb=0.002)
    return memory_url


class _ClientError(Exception):
    """Looks like botocore's ClientError: a ``response`` dict with the error code and HTTP status."""

    def __init__(self, code: str, status: int, message: str = ''):
        super().__init__(f'An error occurred ({code}): {message}')
        self.response = {'Error': {'Code': code, 'Message': message}, 'ResponseMetadata': {'HTTPStatusCode': status}}


class _FakeStore(MemoryFileSystem):
    """The shared in-memory store, with injectable failures and a log of byte ranges read."""

    protocol = 'memory'

    def __init__(self, *args, info_error=None, cat_errors=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.info_error = info_error
        self.cat_errors = list(cat_errors)  # raised by successive cat_file calls (None: succeed)
        self.ranges: list[tuple[str, int | None, int | None]] = []

    def info(self, path, **kwargs):
        if self.info_error is not None:
            raise self.info_error
        return super().info(path, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        if self.cat_errors:
            error = self.cat_errors.pop(0)
            if error is not None:
                raise error
        self.ranges.append((path, start, end))
        return super().cat_file(path, start=start, end=end, **kwargs)


def _fake(**kwargs) -> _FakeStore:
    return _FakeStore(skip_instance_cache=True, **kwargs)


# -- URLs ----------------------------------------------------------------------------------------------------------

def test_normalize_dir_url_strips_one_slash_and_requires_a_scheme():
    assert normalize_dir_url('s3://bucket/path/') == 's3://bucket/path'
    assert normalize_dir_url('file:///a//') == 'file:///a/'
    for bad in (None, 123, ['file:///a']):
        with pytest.raises(ValueError, match='directory url must be a string'):
            normalize_dir_url(bad)
    with pytest.raises(ValueError, match='Please prepend "file://"'):
        normalize_dir_url('/tmp/dataset')


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
])
def test_missing_optional_package_names_the_pip_extra(monkeypatch, url, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    for protocol in ('s3', 's3a', 'gs', 'gcs'):  # forget classes imported before
        monkeypatch.delitem(sys.modules['fsspec.registry']._registry, protocol, raising=False)
    with pytest.raises(MissingDependencyError, match=re.escape(f"pip install '{extra}'")) as raised:
        resolve_url(url)
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
    _assert_secret_hidden(raised.value)


# -- errors --------------------------------------------------------------------------------------------------------

def _assert_secret_hidden(error: BaseException) -> None:
    """No exception that a traceback of ``error`` would print shows the secret."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        assert SECRET not in f'{error!s} {error!r}', f'secret shown by {type(error).__name__}'
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def test_missing_dataset_is_file_not_found_naming_the_url(memory_url):
    with pytest.raises(FileNotFoundError, match=memory_url):
        make_reader(memory_url)
    fs, path = resolve_url(memory_url)
    with pytest.raises(StorageNotFoundError, match=f'{memory_url}/nope.parquet does not exist'):
        fs.open_input_file(path + '/nope.parquet')


@pytest.mark.parametrize(('error', 'expected', 'words'), [
    (PermissionError(f'Forbidden (token {SECRET})'), StoragePermissionError, 'permission denied'),
    (_ClientError('AccessDenied', 403, 'Access Denied'), StoragePermissionError, 'permission denied'),
    (_ClientError('InvalidAccessKeyId', 403, 'The AWS Access Key Id you provided does not exist'),
     StorageCredentialsError, 'refused the credentials'),
    (_ClientError('SignatureDoesNotMatch', 403, f'bad signature for {SECRET}'), StorageCredentialsError,
     'refused the credentials'),
    (type('NoCredentialsError', (Exception,), {})('Unable to locate credentials'), StorageCredentialsError,
     'refused the credentials'),
    (_ClientError('NoSuchBucket', 404, 'The specified bucket does not exist'), StorageNotFoundError, 'does not exist'),
])
def test_storage_errors_are_translated_with_the_url_and_no_secret(memory_url, error, expected, words):
    fs = _fake(info_error=error, secret=SECRET)
    with pytest.raises(expected, match=words) as raised:
        make_reader(memory_url, filesystem=fs, storage_options={'secret': SECRET})
    assert memory_url in str(raised.value)
    if SECRET not in str(error):
        assert raised.value.__cause__ is error
    _assert_secret_hidden(raised.value)


def test_classify_reads_codes_statuses_types_and_messages():
    assert classify(FileNotFoundError('x')) == 'not_found'
    assert classify(_ClientError('ExpiredToken', 400)) == 'credentials'
    assert classify(_ClientError('SlowDown', 503)) == 'transient'
    assert classify(_ClientError('Weird', 500)) == 'transient'
    assert classify(ValueError('bad')) == 'other'
    wrapped = OSError('We encountered an internal error')
    wrapped.__cause__ = _ClientError('InternalError', 500)
    assert classify(wrapped) == 'transient'
    assert is_transient(ConnectionResetError('reset'))
    assert is_transient(TimeoutError())
    assert is_transient(type('ClientPayloadError', (Exception,), {})('Response payload is not completed'))
    assert not is_transient(PermissionError('Throttling of permissions'))
    assert not is_transient(FileNotFoundError('timed out'))


def test_redact_hides_secrets_and_url_passwords():
    options = {'key': 'AKIA1234', 'secret': SECRET, 'client_kwargs': {'aws_session_token': 'tok-9876'},
               'endpoint_url': 'http://127.0.0.1:9000', 'anon': False}
    assert set(secrets_of(options)) == {'AKIA1234', SECRET, 'tok-9876'}
    text = f'failed with {SECRET} and tok-9876 at ftp://alice:pa55word@host/x and http://127.0.0.1:9000'
    assert redact(text, secrets_of(options)) == ('failed with *** and *** at ftp://alice:***@host/x and '
                                                 'http://127.0.0.1:9000')


# -- retries -------------------------------------------------------------------------------------------------------

def test_transient_read_errors_are_retried_and_every_row_arrives_once(memory_dataset, monkeypatch):
    monkeypatch.setattr(StorageHandler, '__init__', _fast_retry_init(StorageHandler.__init__))
    flaky = [ConnectionResetError('Connection reset by peer'), TimeoutError('read timed out'),
             _ClientError('SlowDown', 503, 'Please reduce your request rate.'), None,
             _ClientError('InternalError', 500, 'We encountered an internal error.'), None]
    fs = _fake(cat_errors=flaky)
    with make_reader(memory_dataset, filesystem=fs, reader_pool_type='dummy') as reader:
        ids = sorted(row.id for row in reader)
    assert ids == list(range(200))
    assert fs.cat_errors == []  # the reads met every failure above and got past it


def _fast_retry_init(original):
    def init(self, fs, scheme, retry=None):
        original(self, fs, scheme, RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.002))
    return init


def test_non_transient_errors_are_not_retried(memory_dataset):
    fs = _fake(cat_errors=[ValueError('corrupt'), None])
    handler = StorageHandler(fs, 'memory', RetryPolicy(attempts=5, base_delay=0))
    path = urlparse(memory_dataset).path + '/_common_metadata'
    with pytest.raises(StorageError, match='corrupt'):
        pafs.PyFileSystem(handler).open_input_file(path).read()
    assert fs.cat_errors == [None]  # one call, not five


def test_exhausted_retries_say_how_many_attempts_were_made(memory_dataset):
    fs = _fake(cat_errors=[TimeoutError('timed out')] * 3)
    handler = StorageHandler(fs, 'memory', RetryPolicy(attempts=3, base_delay=0))
    path = urlparse(memory_dataset).path + '/_common_metadata'
    with pytest.raises(StorageError, match=r'memory://.*_common_metadata still failed after 3 attempts'):
        pafs.PyFileSystem(handler).open_input_file(path).read()


def test_retry_policy_validates_and_caps_delays():
    with pytest.raises(ValueError, match='attempts'):
        RetryPolicy(attempts=0)
    policy = RetryPolicy(base_delay=1.0, max_delay=3.0)
    assert 0.5 <= policy.delay(1) <= 1.0
    assert 1.5 <= policy.delay(10) <= 3.0
    assert pickle.loads(pickle.dumps(policy)) == policy


# -- ranged reads --------------------------------------------------------------------------------------------------

WideSchema = Unischema('WideSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('a', np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField('b', np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField('c', np.float64, (), ScalarCodec(pa.float64()), False),
])


def test_projection_reads_byte_ranges_and_each_footer_once(memory_url):
    rng = np.random.default_rng(0)
    n = 60_000
    rows = pa.table({'id': np.arange(n), 'a': rng.random(n), 'b': rng.random(n), 'c': rng.random(n)})
    written = write_dataset(memory_url, WideSchema, rows, row_group_size_mb=0.5, compression=None)
    assert len(written.files) == 1
    assert len(written.row_groups[next(iter(written.row_groups))]) > 1
    fs = _fake()
    with make_reader(memory_url, schema_fields=['a'], filesystem=fs, reader_pool_type='thread',
                     workers_count=3) as reader:
        assert sum(1 for _ in reader) == n
    data_file = urlparse(written.files[0]).path if '://' in written.files[0] else written.files[0]
    size = fsspec.filesystem('memory').size(data_file)
    reads = [(start, end) for path, start, end in fs.ranges if path == data_file]
    assert all(start is not None and end is not None for start, end in reads)
    fetched = sum(end - start for start, end in reads)
    assert fetched < 0.4 * size, f'read {fetched} of {size} bytes for one column of four'
    tails = [r for r in reads if r[1] >= size]  # a tail read asks for one byte more: a file that grew has it
    assert len(tails) == 1, f'the footer was fetched {len(tails)} times'
    assert tails[0][1] == size + 1


def test_opened_files_seek_and_read_like_files(memory_dataset):
    fs, root = resolve_url(memory_dataset)
    path = root + '/_common_metadata'
    expected = fsspec.filesystem('memory').cat_file(path)
    with fs.open_input_file(path) as f:
        assert f.size() == len(expected)
        assert f.read_at(10, 5) == expected[5:15]
        f.seek(-4, 2)
        assert f.read() == b'PAR1'
        f.seek(0)
        assert f.read(4) == b'PAR1'
    assert pq.read_metadata(fs.open_input_file(path)).num_columns == 2
    with fs.open_input_stream(path) as stream:
        assert stream.read() == expected


def test_handler_pickles_without_its_caches(memory_dataset):
    fs, root = resolve_url(memory_dataset)
    fs.get_file_info(pafs.FileSelector(root))
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.handler == fs.handler
    assert clone.handler.scheme == 'memory'
    assert clone.get_file_info(root + '/_common_metadata').type == pafs.FileType.File


def test_object_store_directories_vanish_with_their_last_object(memory_url):
    fs = pafs.PyFileSystem(StorageHandler(fsspec.filesystem('memory'), 's3'))
    fs.delete_dir('/petastorm-tests/never-existed')  # an empty prefix: nothing to delete
    local = pafs.PyFileSystem(StorageHandler(fsspec.filesystem('memory'), 'memory'))
    with pytest.raises(FileNotFoundError):
        local.delete_dir('/petastorm-tests/never-existed')


# -- HDFS ----------------------------------------------------------------------------------------------------------

def _site_xml(properties: dict[str, str]) -> str:
    body = ''.join(f'<property><name>{k}</name><value>{v}</value></property>' for k, v in properties.items())
    return f'<?xml version="1.0"?><configuration>{body}</configuration>'


HA_SITE = {
    'dfs.nameservices': 'ns1',
    'dfs.ha.namenodes.ns1': 'nn1, nn2',
    'dfs.namenode.rpc-address.ns1.nn1': 'nn1.example.com:8020',
    'dfs.namenode.rpc-address.ns1.nn2': 'nn2.example.com:8020',
}


@pytest.fixture
def hadoop_home(tmp_path, monkeypatch):
    """A ``$HADOOP_HOME`` whose configuration has ``fs.defaultFS=hdfs://ns1``, an HA nameservice."""
    conf = tmp_path / 'hadoop' / 'etc' / 'hadoop'
    conf.mkdir(parents=True)
    (conf / 'core-site.xml').write_text(_site_xml({'fs.defaultFS': 'hdfs://ns1'}))
    (conf / 'hdfs-site.xml').write_text(_site_xml(HA_SITE))
    for variable in hadoop.HADOOP_ENV_VARS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv('HADOOP_HOME', str(tmp_path / 'hadoop'))
    return conf


@pytest.fixture
def connections(monkeypatch):
    """Record what ``connect_hadoop`` is asked to connect to, and hand out local filesystems instead."""
    calls = []

    def connect(host, port, user=None, **options):
        calls.append({'host': host, 'port': port, 'user': user, **options})
        return pafs.LocalFileSystem()

    monkeypatch.setattr(hadoop, 'connect_hadoop', connect)
    return calls


def test_namenode_resolver_reads_the_xml_under_hadoop_home(hadoop_home):
    resolver = HdfsNamenodeResolver()
    assert resolver.resolve_hdfs_name_service('ns1') == ['nn1.example.com:8020', 'nn2.example.com:8020']
    assert resolver.resolve_hdfs_name_service('other') is None
    assert resolver.resolve_default_hdfs_service() == ('ns1', ['nn1.example.com:8020', 'nn2.example.com:8020'])


def test_hadoop_conf_dir_wins_and_hadoop_prefix_is_a_fallback(hadoop_home, tmp_path, monkeypatch):
    other = tmp_path / 'conf'
    other.mkdir()
    (other / 'core-site.xml').write_text(_site_xml({'fs.defaultFS': 'hdfs://single-host:9000'}))
    monkeypatch.setenv('HADOOP_CONF_DIR', str(other))
    assert HdfsNamenodeResolver().resolve_default_hdfs_service() == ('single-host:9000', ['single-host:9000'])
    monkeypatch.delenv('HADOOP_CONF_DIR')
    monkeypatch.delenv('HADOOP_HOME')
    monkeypatch.setenv('HADOOP_PREFIX', str(hadoop_home.parent.parent))
    assert HdfsNamenodeResolver().resolve_hdfs_name_service('ns1') is not None


def test_missing_default_fs_is_a_runtime_error(monkeypatch):
    for variable in hadoop.HADOOP_ENV_VARS:
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(RuntimeError, match='fs.defaultFS is not set'):
        HdfsNamenodeResolver().resolve_default_hdfs_service()
    with pytest.raises(RuntimeError, match='fs.defaultFS'):
        resolve_url('hdfs:///data')
    assert HdfsNamenodeResolver({'fs.defaultFS': 'hdfs://h:1'}).resolve_default_hdfs_service() == ('h:1', ['h:1'])


def test_malformed_hadoop_xml_names_the_file(tmp_path, monkeypatch):
    (tmp_path / 'core-site.xml').write_text('<configuration><property>')
    monkeypatch.setenv('HADOOP_CONF_DIR', str(tmp_path))
    with pytest.raises(ValueError, match='core-site.xml is not a valid Hadoop configuration file'):
        HdfsNamenodeResolver()


@pytest.mark.parametrize(('url', 'host', 'port', 'user', 'path'), [
    ('hdfs://namenode:9000/data/set', 'namenode', 9000, None, '/data/set'),
    ('hdfs://plainhost/data', 'plainhost', 8020, None, '/data'),
    ('hdfs://alice@namenode:9000/data', 'namenode', 9000, 'alice', '/data'),
    ('hdfs://ns1/data', 'ns1', 0, None, '/data'),
    ('hdfs:///data', 'ns1', 0, None, '/data'),
])
def test_hdfs_urls_connect_to_the_right_namenode(hadoop_home, connections, url, host, port, user, path):
    fs, resolved = resolve_url(url)
    assert resolved == path
    assert isinstance(fs, pafs.LocalFileSystem)
    [call] = connections
    assert (call['host'], call['port'], call['user']) == (host, port, user)
    if port == 0:  # an HA nameservice: the client gets its namenodes and fails over itself
        assert call['extra_conf'] == {
            'dfs.nameservices': 'ns1',
            'dfs.ha.namenodes.ns1': 'nn1,nn2',
            'dfs.client.failover.proxy.provider.ns1':
                'org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider',
            'dfs.namenode.rpc-address.ns1.nn1': 'nn1.example.com:8020',
            'dfs.namenode.rpc-address.ns1.nn2': 'nn2.example.com:8020',
        }
    else:
        assert 'extra_conf' not in call


def test_hdfs_storage_options_and_configuration_reach_the_client(connections):
    resolve_url('hdfs://ns9/x', {'user': 'bob', 'kerb_ticket': '/tmp/krb5cc', 'extra_conf': {'a': 'b'}},
                hadoop_configuration={**{k.replace('ns1', 'ns9'): v for k, v in HA_SITE.items()}})
    [call] = connections
    assert call['host'] == 'ns9'
    assert call['user'] == 'bob'
    assert call['kerb_ticket'] == '/tmp/krb5cc'
    assert call['extra_conf']['a'] == 'b'
    assert call['extra_conf']['dfs.ha.namenodes.ns9'] == 'nn1,nn2'


def test_hdfs_driver_is_accepted_and_checked(connections):
    resolve_url('hdfs://h:1/x', hdfs_driver='libhdfs')
    resolve_url('hdfs://h:1/x', hdfs_driver='libhdfs3')
    with pytest.raises(ValueError, match="hdfs_driver must be 'libhdfs3' or 'libhdfs'"):
        resolve_url('hdfs://h:1/x', hdfs_driver='webhdfs')


def test_hdfs_connection_failure_says_what_the_client_needs(monkeypatch):
    def refuse(host, port, user=None, **options):
        raise OSError('Unable to load libhdfs: libhdfs.so: cannot open shared object file')

    monkeypatch.setattr(hadoop, 'connect_hadoop', refuse)
    with pytest.raises(StorageError, match=r'cannot connect to HDFS namenode:9000 for hdfs://namenode:9000/x.*'
                                           r'CLASSPATH'):
        resolve_url('hdfs://namenode:9000/x')


class _StubConnector(HdfsConnector):
    """Connects to local filesystems; namenodes listed in ``down`` refuse, those in ``broken`` fail every call."""

    down: set[str] = set()
    broken: set[str] = set()
    connected: list[str] = []

    @classmethod
    def hdfs_connect_namenode(cls, url, driver='libhdfs3', user=None):
        cls.connected.append(url.netloc)
        if url.netloc in cls.down:
            raise OSError(f'{url.netloc} refused the connection')
        if url.netloc in cls.broken:
            return pafs.PyFileSystem(pafs.FSSpecHandler(_fake(info_error=OSError('StandbyException'))))
        return pafs.LocalFileSystem()


@pytest.fixture
def stub_connector():
    _StubConnector.down, _StubConnector.broken, _StubConnector.connected = set(), set(), []
    return _StubConnector


def test_ha_client_fails_over_to_the_next_namenode(stub_connector, tmp_path):
    stub_connector.broken = {'nn1:8020'}
    fs = stub_connector.connect_to_either_namenode(['nn1:8020', 'nn2:8020'])
    assert fs.get_file_info(str(tmp_path)).type == pafs.FileType.Directory
    assert stub_connector.connected == ['nn1:8020', 'nn2:8020']
    assert fs.handler.namenode == 'nn2:8020'
    with pytest.raises(FileNotFoundError):  # about the path, not the namenode: no failover
        fs.open_input_file(str(tmp_path / 'missing'))
    assert fs.handler.namenode == 'nn2:8020'


def test_ha_client_gives_up_after_max_failovers(stub_connector, tmp_path):
    stub_connector.broken = {'nn1:8020', 'nn2:8020'}
    fs = stub_connector.connect_to_either_namenode(['nn1:8020', 'nn2:8020'])
    with pytest.raises(MaxFailoversExceeded, match=r'maximum \(3\) for action "get_file_info"') as raised:
        fs.get_file_info(str(tmp_path))
    assert len(raised.value.failed_exceptions) == 4
    stub_connector.down = {'a:1', 'b:2'}
    with pytest.raises(HdfsConnectError, match='Unable to connect'):
        HAHdfsClient(stub_connector, ['a:1', 'b:2'])


# -- Petastorm's fs_utils ------------------------------------------------------------------------------------------

def test_filesystem_resolver_for_local_urls(tmp_path):
    resolver = FilesystemResolver(path_to_url(str(tmp_path)))
    assert resolver.get_dataset_path() == str(tmp_path)
    assert resolver.parsed_dataset_url().scheme == 'file'
    fs = resolver.filesystem()
    assert fs.exists(str(tmp_path))
    assert fs.isdir(str(tmp_path))
    factory = resolver.filesystem_factory()
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(factory))().exists(str(tmp_path))
    with pytest.raises(RuntimeError, match='Pickling FilesystemResolver is not supported'):
        pickle.dumps(resolver)
    assert FilesystemResolver(urlparse('file:///tmp')).get_dataset_path() == '/tmp'


def test_filesystem_resolver_rejects_bad_urls():
    with pytest.raises(ValueError, match='scheme-less'):
        FilesystemResolver('/tmp/data')
    with pytest.raises(ValueError, match='URLs must be of the form <scheme>://bucket/path'):
        FilesystemResolver('s3:///path')


def test_filesystem_resolver_for_object_stores_returns_the_fsspec_filesystem():
    s3fs = pytest.importorskip('s3fs')
    resolver = FilesystemResolver('s3://bucket/data', storage_options={'key': 'k', 'secret': SECRET,
                                                                        'endpoint_url': 'http://127.0.0.1:9'})
    assert isinstance(resolver.filesystem(), s3fs.S3FileSystem)
    assert resolver.get_dataset_path() == 'bucket/data'
    assert resolver.filesystem().storage_options['endpoint_url'] == 'http://127.0.0.1:9'
    assert isinstance(pickle.loads(cloudpickle.dumps(resolver.filesystem_factory()))(), s3fs.S3FileSystem)


def test_filesystem_resolver_for_hdfs_uses_the_connector(hadoop_home, stub_connector):
    ha = FilesystemResolver('hdfs://ns1/data', connector=stub_connector)
    assert stub_connector.connected == ['nn1.example.com:8020']
    assert ha.get_dataset_path() == '/data'
    assert ha.filesystem().exists('/')
    direct = FilesystemResolver('hdfs://host:9000/data', connector=stub_connector)
    assert stub_connector.connected[-1] == 'host:9000'
    default = FilesystemResolver('hdfs:///data', connector=stub_connector, user='alice')
    assert default.filesystem_factory().namenodes == ('nn1.example.com:8020', 'nn2.example.com:8020')
    assert pickle.loads(pickle.dumps(direct.filesystem_factory()))().exists('/')


def test_get_filesystem_and_path_or_paths(tmp_path, memory_dataset):
    fs, path = get_filesystem_and_path_or_paths(path_to_url(str(tmp_path)) + '/')
    assert path == str(tmp_path)
    assert fs.exists(path)
    urls = ['memory:///x/a.parquet', 'memory:///x/b.parquet']
    fs, paths = get_filesystem_and_path_or_paths(urls)
    assert paths == ['/x/a.parquet', '/x/b.parquet']
    assert isinstance(fs, MemoryFileSystem)
    mine = fsspec.filesystem('memory')
    assert get_filesystem_and_path_or_paths(memory_dataset, filesystem=mine)[0] is mine
    with pytest.raises(ValueError, match='same scheme and netloc'):
        get_filesystem_and_path_or_paths(['s3://a/x', 'gs://a/x'])


def test_get_dataset_path():
    assert get_dataset_path(urlparse('file:///a/b')) == '/a/b'
    assert get_dataset_path(urlparse('hdfs://nn:8020/a/b')) == '/a/b'
    assert get_dataset_path(urlparse('s3://bucket/a/b')) == 'bucket/a/b'
    assert get_dataset_path(urlparse('gs://bucket/a')) == 'bucket/a'


# -- --storage-options of the command-line tools ------------------------------------------------------------------


def test_storage_options_flag_takes_json_key_value_pairs_or_a_file(tmp_path):
    from petastorm.cli import parse_storage_options

    assert parse_storage_options(None) is None
    assert parse_storage_options('{"client_kwargs": {"endpoint_url": "http://h:9000"}}') == {
        'client_kwargs': {'endpoint_url': 'http://h:9000'}}
    assert parse_storage_options('anon=true, endpoint_url=http://h:9000,max_concurrency=4') == {
        'anon': True, 'endpoint_url': 'http://h:9000', 'max_concurrency': 4}
    options_file = tmp_path / 'options.json'
    options_file.write_text('{"key": "k", "secret": "s"}')
    assert parse_storage_options(f'@{options_file}') == {'key': 'k', 'secret': 's'}


@pytest.mark.parametrize(('text', 'message'), [
    ('{"secret": "hunter2"', 'is not valid JSON'),
    ('@{list_file}', 'must be a JSON object, got a JSON list'),
    ('endpoint_url', 'has no "="'),
    ('=hunter2', 'a pair has an empty key'),
    ('@/nonexistent/options.json', "'/nonexistent/options.json' cannot be read"),
    # A file that is not UTF-8 text escaped as a UnicodeDecodeError traceback.
    ('@{binary_file}', 'options.bin\' is not UTF-8 text (an invalid byte at position 19)'),
])
def test_bad_storage_options_flag_is_a_usage_error_without_the_values(text, message, tmp_path):
    from petastorm.cli import UsageError, parse_storage_options

    list_file = tmp_path / 'list.json'
    list_file.write_text('["hunter2"]')
    binary_file = tmp_path / 'options.bin'
    binary_file.write_bytes(b'{"secret": "hunter2\xff"}')
    with pytest.raises(UsageError, match=re.escape(message)) as raised:
        parse_storage_options(text.replace('{list_file}', str(list_file)).replace('{binary_file}', str(binary_file)))
    assert 'hunter2' not in str(raised.value)


def test_a_refused_connection_is_reported_at_once_not_retried():
    from petastorm.fs._errors import classify, is_transient, translate

    refused = OSError('Could not connect to the endpoint URL')
    refused.__cause__ = ConnectionRefusedError(111, 'Connection refused')
    assert classify(refused) == 'refused'
    assert not is_transient(refused)
    assert is_transient(ConnectionResetError(104, 'Connection reset by peer'))
    error = translate(refused, 'listing', 's3://bucket/data', attempts=1)
    assert 'listing on s3://bucket/data failed: the storage endpoint refused the connection' in str(error)
    attempts = []

    def call():
        attempts.append(1)
        raise refused

    with pytest.raises(OSError, match='Could not connect'):
        RetryPolicy(attempts=3, base_delay=0).call(call, 'listing s3://bucket/data')
    assert len(attempts) == 1


def test_each_retry_is_logged_as_a_warning_with_the_url_and_without_secrets(caplog):
    failures = [ConnectionResetError(104, f'reset while sending {SECRET}'), TimeoutError('timed out')]

    def call():
        if failures:
            raise failures.pop(0)
        return 'ok'

    with caplog.at_level('WARNING', logger='petastorm.fs'):
        assert RetryPolicy(attempts=3, base_delay=0).call(call, 'reading s3://bucket/data/part-0', [SECRET]) == 'ok'
    warnings_logged = [r for r in caplog.records if r.levelname == 'WARNING']
    assert len(warnings_logged) == 2
    assert all('reading s3://bucket/data/part-0 failed with a transient error' in r.getMessage()
               for r in warnings_logged)
    assert SECRET not in caplog.text


def test_resolving_an_s3_url_refuses_an_endpoint_that_refuses_connections():
    pytest.importorskip('s3fs')
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    with pytest.raises(StorageError, match=rf'cannot reach s3://bucket/data: the S3 endpoint http://127.0.0.1:{port} '
                                           rf'refused the connection \(nothing listens at 127.0.0.1:{port}\)'):
        resolve_url('s3://bucket/data', {'key': 'k', 'secret': SECRET, 'endpoint_url': f'http://127.0.0.1:{port}'})
