"""Iceberg tables written by pyiceberg (SQL catalog on SQLite, in-memory catalog), read by our readers.

Rows are compared, as multisets, with what pyiceberg's own scan returns for the same snapshot. Delete files are
committed as merge-on-read engines write them (pyiceberg reads position deletes but writes none, and reads no
equality deletes: those rows are checked against the rule of the format instead).
"""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader
from petastorm.errors import TableVersionError, UnsupportedTableFeatureError
from petastorm.predicates import in_set

pyiceberg = pytest.importorskip('pyiceberg')

from pyiceberg.catalog.memory import InMemoryCatalog  # noqa: E402
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402
from pyiceberg.types import DoubleType  # noqa: E402

from support.tables_util import (  # noqa: E402
    iceberg_equality_deletes,
    iceberg_position_deletes,
    iceberg_rows,
    reader_rows,
)

COLUMNS = ['id', 'name', 'score']


def _rows(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({'id': ids, 'name': [f'n{i % 4}' for i in ids], 'score': (ids * 0.5).astype(np.float64)})


@pytest.fixture(params=['sql', 'memory'])
def catalog(request, tmp_path):
    warehouse = f'file://{tmp_path}/warehouse'
    (tmp_path / 'warehouse').mkdir()
    if request.param == 'sql':
        made = SqlCatalog('test', uri=f'sqlite:///{tmp_path}/catalog.db', warehouse=warehouse)
    else:
        made = InMemoryCatalog('test', warehouse=warehouse)
    made.create_namespace('ns')
    return made


def _read(table, columns=COLUMNS, **kwargs):
    kwargs.setdefault('reader_pool_type', 'dummy')
    with make_batch_reader(table, **kwargs) as reader:
        return reader_rows(reader, columns)


def test_appends_overwrites_and_deletes(catalog):
    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    table.append(_rows(0, 100))
    table.append(_rows(100, 200))
    table.delete('id < 50')
    table.overwrite(_rows(1000, 1010))
    table.append(_rows(2000, 2005))
    assert _read(table) == iceberg_rows(table)
    assert sorted(r[0] for r in _read(table)) == list(range(1000, 1010)) + list(range(2000, 2005))
    for snapshot in table.snapshots():
        assert _read(table, table_version=snapshot.snapshot_id) == iceberg_rows(table, snapshot.snapshot_id)


def test_table_directory_and_metadata_file_urls(catalog):
    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    table.append(_rows(0, 30))
    table.delete('id >= 20')
    assert _read(table.metadata_location) == iceberg_rows(table)
    assert _read(table.location()) == iceberg_rows(table)
    with make_batch_reader(table.location()) as reader:
        assert reader.dataset.version.format == 'iceberg'


def test_snapshots_tags_and_timestamps(catalog):
    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    table.append(_rows(0, 10))
    first = table.current_snapshot()
    table.manage_snapshots().create_tag(first.snapshot_id, 'first').commit()
    table.append(_rows(10, 20))
    assert _read(table, table_version='first') == iceberg_rows(table, first.snapshot_id)
    when = datetime.datetime.fromtimestamp(first.timestamp_ms / 1000 + 0.0005, datetime.timezone.utc)
    assert _read(table, table_version=when) == iceberg_rows(table, first.snapshot_id)
    with pytest.raises(TableVersionError, match='no snapshot 12345'):
        make_batch_reader(table, table_version=12345)
    with pytest.raises(TableVersionError, match='not a branch or tag'):
        make_batch_reader(table, table_version='no-such-tag')
    with pytest.raises(TableVersionError, match='no snapshot at'):
        make_batch_reader(table, table_version=datetime.datetime(2000, 1, 1))


def test_partitioned_with_spec_evolution_and_partition_predicates(catalog):
    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    with table.update_spec() as update:
        update.add_identity('name')
    table.append(_rows(0, 40))
    assert _read(table) == iceberg_rows(table)
    with make_batch_reader(table, predicate=in_set({'n2'}, 'name'), reader_pool_type='dummy') as reader:
        assert reader.dataset.partition_names == ['name']
        assert len(reader.work_items) == 1
        assert sorted(r[0] for r in reader_rows(reader, ['id'])) == list(range(2, 40, 4))
    # A spec without the identity partition: `name` is no longer constant per file, so not a partition column.
    with table.update_spec() as update:
        update.remove_field('name')
    table.append(_rows(40, 50))
    with make_batch_reader(table, reader_pool_type='dummy') as reader:
        assert reader.dataset.partition_names == []
        assert reader_rows(reader, COLUMNS) == iceberg_rows(table)


def test_schema_evolution_renames_added_columns_and_promoted_types(catalog):
    schema = pa.schema([('id', pa.int32()), ('name', pa.string())])
    table = catalog.create_table('ns.t', schema=schema)
    table.append(pa.table({'id': pa.array(range(10), pa.int32()), 'name': [f'n{i}' for i in range(10)]}))
    with table.update_schema() as update:
        update.add_column('score', DoubleType())
        update.rename_column('name', 'label')
        update.update_column('id', pyiceberg.types.LongType())
    table.append(pa.table({'id': pa.array(range(10, 15), pa.int64()), 'label': [f'n{i}' for i in range(10, 15)],
                           'score': pa.array([1.5] * 5)}))
    columns = ['id', 'label', 'score']
    with make_batch_reader(table, reader_pool_type='dummy') as reader:
        assert list(reader.schema.fields) == columns
        assert reader.schema.fields['id'].numpy_dtype is np.int64
        rows = reader_rows(reader, columns)
    assert rows == iceberg_rows(table, columns=columns)
    assert sum(1 for r in rows if r[2] is None) == 10


@pytest.fixture
def deleted_table(catalog):
    """200 rows in two files of 100 (row groups of 16), position deletes in both, then an append."""
    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema,
                                 properties={'write.parquet.row-group-limit': '16'})
    table.append(_rows(0, 100))
    table.append(_rows(100, 200))
    paths = sorted(task.file.file_path for task in table.scan().plan_files())
    iceberg_position_deletes(table, {paths[0]: [0, 1, 17, 99], paths[1]: list(range(16, 32))})
    table = catalog.load_table('ns.t')
    table.append(_rows(200, 210))
    return catalog.load_table('ns.t')


def test_position_deletes(deleted_table):
    expected = iceberg_rows(deleted_table)
    assert len(expected) == 210 - 4 - 16  # pyiceberg honours the delete file
    with make_batch_reader(deleted_table, reader_pool_type='dummy') as reader:
        assert len(reader.dataset.pieces) > 2
        assert reader.dataset.deleted_rows == 20
        assert reader_rows(reader, COLUMNS) == expected
    for snapshot in deleted_table.snapshots():
        assert _read(deleted_table, table_version=snapshot.snapshot_id) == iceberg_rows(deleted_table,
                                                                                       snapshot.snapshot_id)


def test_equal_row_shards_and_shuffles_over_deletes(deleted_table):
    expected = iceberg_rows(deleted_table)
    shards = [_read(deleted_table, seed=5, shuffle_rows=True, cur_shard=k, shard_count=4, shard_mode='rows')
              for k in range(4)]
    assert {len(s) for s in shards} == {-(-len(expected) // 4)}  # 'pad': equal shares, a few rows repeated
    assert {row for shard in shards for row in shard} == set(expected)


def test_filters_prune_by_bounds(deleted_table):
    with make_batch_reader(deleted_table, filters=[('id', '>=', 200)], reader_pool_type='dummy') as reader:
        assert len(reader.work_items) == 1
        assert sorted(r[0] for r in reader_rows(reader, ['id'])) == list(range(200, 210))


def test_equality_deletes_follow_sequence_numbers_partitions_and_nulls(catalog):
    table = catalog.create_table('ns.t', schema=pa.schema([('id', pa.int64()), ('name', pa.string()),
                                                           ('score', pa.float64())]))
    data = _rows(0, 40)
    data = data.set_column(1, 'name', pa.array([None if i % 10 == 0 else f'n{i % 4}' for i in range(40)]))
    table.append(data)
    # Delete every row named n1, every row without a name, and rows (id, name) = (2, n2) and (6, n3).
    iceberg_equality_deletes(table, pa.table({'name': pa.array(['n1', None])}))
    table = catalog.load_table('ns.t')
    iceberg_equality_deletes(table, pa.table({'id': pa.array([2, 6], pa.int64()), 'name': ['n2', 'n3']}))
    table = catalog.load_table('ns.t')
    # Rows appended after the deletes are not deleted by them, even with the same keys.
    table.append(pa.table({'id': pa.array([100, 101], pa.int64()), 'name': ['n1', None], 'score': [1.0, 2.0]}))
    ids = sorted(r[0] for r in _read(table))
    expected = [i for i in range(40) if i % 10 != 0 and i % 4 != 1 and i != 2] + [100, 101]
    assert ids == expected


def test_resume_records_the_snapshot(deleted_table):
    with make_batch_reader(deleted_table, reader_pool_type='dummy', seed=2) as reader:
        first = reader_rows([next(reader)], COLUMNS)
        state = reader.state_dict()
    assert state['table'] == ['iceberg', deleted_table.current_snapshot().snapshot_id]
    with make_batch_reader(deleted_table, reader_pool_type='dummy', seed=2) as reader:
        reader.load_state_dict(state)
        rest = reader_rows(reader, COLUMNS)
    assert sorted(first + rest, key=repr) == iceberg_rows(deleted_table)
    deleted_table.append(_rows(500, 501))
    with make_batch_reader(deleted_table, reader_pool_type='dummy', seed=2) as reader, \
            pytest.raises(ValueError, match='iceberg table version'):
        reader.load_state_dict(state)


def test_delete_files_of_formats_we_do_not_read_are_refused(catalog):
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from support.tables_util import _commit_delete_file

    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    table.append(_rows(0, 10))
    puffin = DataFile.from_args(content=DataFileContent.POSITION_DELETES, file_path=f'{table.location()}/x.puffin',
                                file_format=FileFormat.PUFFIN, partition=Record(), record_count=1,
                                file_size_in_bytes=1)
    puffin.spec_id = 0
    _commit_delete_file(table, puffin)
    with pytest.raises(UnsupportedTableFeatureError, match='PUFFIN'):
        make_batch_reader(catalog.load_table('ns.t'))


def test_partitioned_equality_deletes_apply_to_their_partition_only(catalog):
    from pyiceberg.typedef import Record

    table = catalog.create_table('ns.t', schema=_rows(0, 1).schema)
    with table.update_spec() as update:
        update.add_identity('name')
    table.append(_rows(0, 16))
    spec_id = table.spec().spec_id
    # Keys 2 and 3 in partition n2: only id 2 is there (id 3 is in partition n3 and stays).
    iceberg_equality_deletes(table, pa.table({'id': pa.array([2, 3], pa.int64())}), spec_id=spec_id,
                             partition=Record('n2'))
    ids = sorted(r[0] for r in _read(catalog.load_table('ns.t')))
    assert ids == [i for i in range(16) if i != 2]
