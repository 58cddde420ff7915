"""Tables on S3 (moto's server on loopback): the same ``storage_options`` as Parquet URLs read the log and the files.

The tables are written to the server by the table libraries themselves (delta-rs with its own storage options,
pyiceberg through its file IO); our readers get s3fs-style options only (``key``, ``secret``, ``endpoint_url``),
translated for delta-rs and pyiceberg where they read the log. The server (``moto``) is the one of
``tests/storage/conftest.py``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader
from petastorm.errors import StorageCredentialsError

pytest.importorskip('s3fs')
pytest.importorskip('moto')
deltalake = pytest.importorskip('deltalake')
pytest.importorskip('pyiceberg')

from support.s3_loopback import BUCKET, SECRET_KEY, MotoServer  # noqa: E402
from support.tables_util import reader_rows, rows_of_table  # noqa: E402


def _delta_options(server) -> dict[str, str]:
    options = server.storage_options()
    return {'AWS_ACCESS_KEY_ID': options['key'], 'AWS_SECRET_ACCESS_KEY': options['secret'],
            'AWS_ENDPOINT_URL': server.endpoint, 'AWS_ALLOW_HTTP': 'true', 'AWS_REGION': 'us-east-1',
            'AWS_S3_ALLOW_UNSAFE_RENAME': 'true'}


def _rows(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({'id': ids, 'part': [f'p{i % 3}' for i in ids]})


def test_delta_table_on_s3(moto):
    url = f's3://{BUCKET}/delta-table'
    options = _delta_options(moto)
    deltalake.write_deltalake(url, _rows(0, 60), partition_by=['part'], storage_options=options)
    deltalake.write_deltalake(url, _rows(60, 90), partition_by=['part'], mode='append', storage_options=options)
    deltalake.DeltaTable(url, storage_options=options).delete("part = 'p1'")
    expected = rows_of_table(pa.table(deltalake.DeltaTable(url, storage_options=options).scan().read_all()),
                             ['id', 'part'])
    with make_batch_reader(url, storage_options=moto.storage_options(), reader_pool_type='thread',
                           workers_count=2) as reader:
        assert reader.dataset.version.version == 2
        assert reader_rows(reader, ['id', 'part']) == expected
    with make_batch_reader(url, storage_options=moto.storage_options(), table_version=0) as reader:
        assert len(reader_rows(reader, ['id'])) == 60


def test_refused_credentials_are_a_clear_error_without_the_secret():
    with MotoServer(enforce_auth=True) as strict:
        url = f's3://{BUCKET}/delta-table'
        with pytest.raises(StorageCredentialsError, match='refused the credentials') as raised:
            make_batch_reader(url, storage_options=strict.storage_options(), table_format='delta')
        assert SECRET_KEY not in str(raised.value)
        # The log itself is read by delta-rs, with the options translated: its refusal is the same error.
        from petastorm.tables.delta import open_delta_table

        with pytest.raises(StorageCredentialsError, match='refused the credentials') as raised:
            open_delta_table(_location(url, moto_options=strict.storage_options()), strict.storage_options())
        assert SECRET_KEY not in str(raised.value)


def _location(url, moto_options):
    import pyarrow.fs as pafs

    from petastorm.fs import ResolvedLocation

    del moto_options  # the data files are not reached: the log is refused first
    return ResolvedLocation(pafs.LocalFileSystem(), f'{BUCKET}/delta-table', url)


def test_iceberg_table_on_s3(moto, tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    options = moto.storage_options()
    catalog = SqlCatalog('s3', uri=f'sqlite:///{tmp_path}/catalog.db', warehouse=f's3://{BUCKET}/warehouse',
                         **{'s3.endpoint': moto.endpoint, 's3.access-key-id': options['key'],
                            's3.secret-access-key': options['secret'], 's3.region': 'us-east-1'})
    catalog.create_namespace('ns')
    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    table.append(_rows(0, 50))
    table.delete('id >= 40')
    expected = rows_of_table(table.scan().to_arrow(), ['id', 'part'])
    # The catalog's table reads its files with its own file IO settings ...
    with make_batch_reader(table, reader_pool_type='dummy') as reader:
        assert reader_rows(reader, ['id', 'part']) == expected
    # ... and the table's directory URL with the storage options of any Parquet URL.
    with make_batch_reader(f's3://{BUCKET}/warehouse/ns/t', storage_options=options) as reader:
        assert reader_rows(reader, ['id', 'part']) == expected


def test_write_dataset_appends_to_a_delta_table_on_s3(moto):
    from petastorm import make_reader, write_dataset
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField

    schema = Unischema('S3Table', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                                   UnischemaField('matrix', np.float32, (2, 2), NdarrayCodec(), False)])
    url = f's3://{BUCKET}/written-table'
    options = moto.storage_options()
    for start in (0, 10):
        rows = [{'id': i, 'matrix': np.full((2, 2), i, np.float32)} for i in range(start, start + 10)]
        write_dataset(url, schema, rows, mode='append', storage_options=options, table_format='delta')
    with make_reader(url, storage_options=options, reader_pool_type='dummy') as reader:
        rows = sorted(reader, key=lambda row: row.id)
    assert [int(row.id) for row in rows] == list(range(20))
    np.testing.assert_array_equal(rows[7].matrix, np.full((2, 2), 7, np.float32))
    assert deltalake.DeltaTable(url, storage_options=_delta_options(moto)).version() == 2


def test_storage_options_translated_for_the_table_libraries():
    from petastorm.fs.settings import delta_storage_options, iceberg_io_properties

    options = {'key': 'K', 'secret': 'S', 'token': 'T', 'client_kwargs': {'endpoint_url': 'http://127.0.0.1:1',
                                                                          'region_name': 'eu-west-1'},
               'AWS_S3_ALLOW_UNSAFE_RENAME': 'true'}
    assert delta_storage_options('s3://b/t', options) == {
        'AWS_ACCESS_KEY_ID': 'K', 'AWS_SECRET_ACCESS_KEY': 'S', 'AWS_SESSION_TOKEN': 'T',
        'AWS_ENDPOINT_URL': 'http://127.0.0.1:1', 'AWS_ALLOW_HTTP': 'true', 'AWS_REGION': 'eu-west-1',
        'AWS_S3_ALLOW_UNSAFE_RENAME': 'true'}
    assert iceberg_io_properties('s3a://b/t', {'key': 'K', 'secret': 'S', 'anon': True}) == {
        's3.access-key-id': 'K', 's3.secret-access-key': 'S', 's3.anonymous': 'true'}
    assert delta_storage_options('file:///t', {'key': 'K'}) == {}
