"""``storage_options`` read once for every client: each alias means the same to pyarrow's S3 client, s3fs, delta-rs
and pyiceberg; a key no client takes is refused by name, with the closest name, before any request.

The entry points are run against the loopback S3 server of :mod:`petastorm.test_util.s3_server`, which counts the
requests it answers.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import pathlib
import sys

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import ScalarCodec
from petastorm.errors import PetastormError, StorageOptionsError
from petastorm.fs import resolve_url
from petastorm.fs.settings import delta_storage_options, fsspec_options, iceberg_io_properties, native_s3_options
from petastorm.fs.settings.s3 import S3_SETTINGS, read_s3_settings
from petastorm.test_util.s3_server import S3DirectoryServer
from petastorm.unischema import Unischema, UnischemaField

URL = 's3://bucket/ds'
ENDPOINT = 'http://127.0.0.1:9000'
DOCS = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'storage.md'

#: For each setting of the table: the other options it is tried with (so that pyarrow's client takes them), the
#: value, and what pyarrow's client calls it.
SETTING_CASES = {
    'key': ({'secret': 'S', 'endpoint_url': ENDPOINT}, 'K', ('access_key', 'K')),
    'secret': ({'key': 'K', 'endpoint_url': ENDPOINT}, 'S', ('secret_key', 'S')),
    'token': ({'key': 'K', 'secret': 'S', 'endpoint_url': ENDPOINT}, 'T', ('session_token', 'T')),
    'endpoint_url': ({'key': 'K', 'secret': 'S'}, ENDPOINT, ('endpoint_override', '127.0.0.1:9000')),
    'region': ({'endpoint_url': ENDPOINT}, 'eu-x', ('region', 'eu-x')),
    'anon': ({'endpoint_url': ENDPOINT}, True, ('anonymous', True)),
    'use_ssl': ({'endpoint_url': '127.0.0.1:9000'}, False, ('scheme', 'http')),
}


def _with(options: dict, name: str, value) -> dict:
    """``options`` with ``name`` set (``'client_kwargs.x'``: key x of ``client_kwargs``)."""
    parent, dot, key = name.partition('.')
    return {**options, parent: {key: value}} if dot else {**options, name: value}


def _every_client(options: dict) -> dict:
    return {'pyarrow': native_s3_options(options, {}), 's3fs': fsspec_options('s3', URL, options),
            'delta-rs': delta_storage_options(URL, options), 'pyiceberg': iceberg_io_properties(URL, options)}


def test_the_table_covers_every_setting():
    assert set(SETTING_CASES) == {setting.field for setting in S3_SETTINGS}


@pytest.mark.parametrize(('field', 'alias'), [(s.field, name) for s in S3_SETTINGS for name in s.names])
def test_every_alias_means_the_same_to_every_client(field, alias):
    [setting] = [s for s in S3_SETTINGS if s.field == field]
    base, value, (pyarrow_name, pyarrow_value) = SETTING_CASES[field]
    canonical = _every_client(_with(base, setting.names[0], value))
    assert _every_client(_with(base, alias, value)) == canonical
    assert canonical['pyarrow'][pyarrow_name] == pyarrow_value
    parent, dot, key = setting.names[0].partition('.')
    assert (canonical['s3fs'][parent][key] if dot else canonical['s3fs'][parent]) == value
    for library, properties in (('delta', canonical['delta-rs']), ('iceberg', canonical['pyiceberg'])):
        if getattr(setting, library) is not None:
            assert properties[getattr(setting, library)] in (str(value), 'true')


def test_the_libraries_get_full_endpoints_and_their_own_keys():
    options = {'key': 'K', 'secret': 'S', 'endpoint_url': '127.0.0.1:9000', 'use_ssl': False,
               'AWS_S3_ALLOW_UNSAFE_RENAME': 'true', 's3.connect-timeout': '5'}
    assert delta_storage_options(URL, options) == {
        'AWS_ACCESS_KEY_ID': 'K', 'AWS_SECRET_ACCESS_KEY': 'S', 'AWS_ENDPOINT_URL': 'http://127.0.0.1:9000',
        'AWS_ALLOW_HTTP': 'true', 'AWS_S3_ALLOW_UNSAFE_RENAME': 'true'}
    assert iceberg_io_properties(URL, options) == {
        's3.access-key-id': 'K', 's3.secret-access-key': 'S', 's3.endpoint': 'http://127.0.0.1:9000',
        's3.connect-timeout': '5'}
    # Keys in a library's own form are for that library only: s3fs and pyarrow's client never see them.
    assert fsspec_options('s3', URL, options)['endpoint_url'] == '127.0.0.1:9000'
    assert 'AWS_S3_ALLOW_UNSAFE_RENAME' not in fsspec_options('s3', URL, options)
    assert native_s3_options(options, {}) == {'access_key': 'K', 'secret_key': 'S', 'scheme': 'http',
                                              'endpoint_override': '127.0.0.1:9000', 'region': 'us-east-1'}


def test_every_name_s3fs_takes_is_accepted():
    s3fs = pytest.importorskip('s3fs')
    from aiobotocore.session import AioSession

    names = {name for function in (s3fs.S3FileSystem.__init__, AioSession.__init__)
             for name, parameter in inspect.signature(function).parameters.items()
             if name != 'self' and parameter.kind is parameter.POSITIONAL_OR_KEYWORD}
    names |= {'skip_instance_cache', 'use_listings_cache', 'listings_expiry_time', 'max_paths'}
    for name in sorted(names):
        read_s3_settings({name: {} if name.endswith('_kwargs') else 1})


@pytest.mark.parametrize(('options', 'where', 'words'), [
    ({'endpont_url': ENDPOINT}, 'storage_options', "did you mean 'endpoint_url'?"),
    ({'endpoint': ENDPOINT}, 'storage_options', "'endpoint' is pyarrow's name; storage_options are s3fs's names: "
                                                "write 'endpoint_url'"),
    ({'endpoint_override': '127.0.0.1:9000'}, 'storage_options', "write 'endpoint_url'"),
    ({'access_key': 'K', 'secret': 'S'}, 'storage_options', "write 'key' instead"),
    pytest.param({'client_kwargs': {'region': 'eu-x'}}, "storage_options['client_kwargs']",
                 "did you mean 'region_name'?", marks=pytest.mark.skipif(
                     importlib.util.find_spec('botocore') is None, reason='client_kwargs are checked by botocore')),
])
def test_an_unknown_key_is_refused_by_name_with_the_closest(options, where, words):
    with pytest.raises(StorageOptionsError) as raised:
        read_s3_settings(options, URL)
    message = str(raised.value)
    assert f'{where} for {URL} has the key {next(iter(_innermost(options)))!r}' in message
    assert words in message
    assert 'Accepted: ' in message
    assert 'endpoint_url' in message
    assert isinstance(raised.value, PetastormError)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, TypeError)  # what s3fs's unexpected keyword argument was


def _innermost(options: dict) -> dict:
    value = next(iter(options.values()))
    return value if isinstance(value, dict) else options


def test_one_setting_under_two_names_must_agree_and_values_are_not_shown():
    assert read_s3_settings({'key': 'K', 'username': 'K'}).key == 'K'
    with pytest.raises(StorageOptionsError, match=r"as 'key' and as 'client_kwargs'\['aws_access_key_id'\]") as raised:
        read_s3_settings({'key': 'AAA111', 'client_kwargs': {'aws_access_key_id': 'BBB222'}})
    assert 'AAA111' not in str(raised.value)
    assert 'BBB222' not in str(raised.value)


def test_other_schemes_refuse_only_what_their_client_cannot_take(tmp_path, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    with pytest.raises(StorageOptionsError, match="did you mean 'kerb_ticket'"):
        resolve_url('hdfs://namenode:8020/x', {'kerb_tiket': '/tmp/krb5cc'})
    # fsspec's own filesystems take any keyword: nothing is refused
    assert isinstance(resolve_url('memory://settings/x', {'anything': 1})[0], pafs.PyFileSystem)
    assert resolve_url(tmp_path.as_uri(), {'anything': 1})[1] == str(tmp_path)  # file:// takes no options

    class Strict(MemoryFileSystem):
        def __init__(self, depth=1):
            super().__init__()

    monkeypatch.setitem(sys.modules['fsspec.registry']._registry, 'strictsettings', Strict)
    resolve_url('strictsettings://x', {'depth': 2})
    with pytest.raises(StorageOptionsError, match=r"has the key 'deepth'.*did you mean 'depth'"):
        resolve_url('strictsettings://x', {'deepth': 2})


def test_the_docs_name_every_accepted_name():
    text = DOCS.read_text()
    for setting in S3_SETTINGS:
        for name in setting.names:
            shown = "client_kwargs['{}']".format(name.partition('.')[2]) if '.' in name else name
            assert f'`{shown}`' in text, name


# -- the entry points: refused before any request ---------------------------------------------------------------

BUCKET = 'settings'
SCHEMA = Unischema('Settings', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False)])


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


def _refusal(call):
    """The message of the error an API call raises."""
    def run(url, options, capsys):
        with pytest.raises(StorageOptionsError) as raised:
            call(url, options)
        return str(raised.value)
    return run


def _cli_refusal(url, options, capsys):
    """What a command-line tool prints when ``--storage-options`` has a key no client takes (exit code 2)."""
    from petastorm.tools.inspect import main

    with pytest.raises(SystemExit) as raised:
        main([url, '--storage-options', json.dumps(options)])
    assert raised.value.code == 2
    return capsys.readouterr().err


def _filesystem_resolver(url, options):
    from petastorm.fs_utils import FilesystemResolver

    return FilesystemResolver(url, storage_options=options)


ENTRY_POINTS = {
    'make_reader': _refusal(lambda url, options: make_reader(url, storage_options=options)),
    'make_batch_reader': _refusal(lambda url, options: make_batch_reader(url, storage_options=options)),
    'make_batch_reader of a Delta table': _refusal(
        lambda url, options: make_batch_reader(url, storage_options=options, table_format='delta')),
    'write_dataset': _refusal(lambda url, options: write_dataset(url, SCHEMA, [{'id': 1}], storage_options=options)),
    'write_dataset of a Delta table': _refusal(
        lambda url, options: write_dataset(url, SCHEMA, [{'id': 1}], storage_options=options, table_format='delta')),
    'fs_utils.FilesystemResolver': _refusal(_filesystem_resolver),
    'petastorm-inspect --storage-options': _cli_refusal,
}


@pytest.mark.parametrize('entry', sorted(ENTRY_POINTS))
def test_every_entry_point_refuses_an_unknown_key_before_any_request(server, entry, capsys):
    pytest.importorskip('s3fs')
    options = {**server.storage_options(), 'endpoint': server.endpoint}
    server.reset_stats()
    message = ENTRY_POINTS[entry](f's3://{BUCKET}/ds', options, capsys)
    assert "has the key 'endpoint'" in message
    assert "write 'endpoint_url'" in message
    assert server.stats().total_requests == 0
    # the same options spelt right reach the server
    resolve_url(f's3://{BUCKET}/ds', server.storage_options())[0].get_file_info(f'{BUCKET}/ds')
    assert server.stats().total_requests > 0
