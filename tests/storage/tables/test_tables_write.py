"""``write_dataset`` into Delta tables: new tables, appends, overwrites in one commit each; nothing left on failure."""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.errors import DatasetWriteError, SchemaError
from petastorm.unischema import Unischema, UnischemaField

deltalake = pytest.importorskip('deltalake')

Schema = Unischema('TableSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False),
])


def _rows(start: int, stop: int) -> list[dict]:
    return [{'id': i, 'matrix': np.full((2, 3), i, np.float32)} for i in range(start, stop)]


def _ids(url: str, **kwargs) -> list[int]:
    with make_reader(url, reader_pool_type='dummy', **kwargs) as reader:
        rows = list(reader)
    for row in rows:
        np.testing.assert_array_equal(row.matrix, np.full((2, 3), row.id, np.float32))
    return sorted(int(row.id) for row in rows)


def test_new_table_appends_and_overwrites(tmp_path):
    root = str(tmp_path / 'table')
    url = f'file://{root}'
    result = write_dataset(url, Schema, _rows(0, 20), table_format='delta', row_group_size_mb=0.0005)
    assert result.num_rows == 20
    write_dataset(url, Schema, _rows(20, 30), mode='append')
    assert _ids(url) == list(range(30))
    table = deltalake.DeltaTable(root)
    assert table.version() == 2  # the table and its schema, then one commit per write
    assert 'petastorm.unischema.json' in table.metadata().configuration
    assert sorted(pa.table(table.scan().read_all()).column('id').to_pylist()) == list(range(30))
    with make_reader(url) as reader:
        assert reader.schema.fields['matrix'].codec.__class__ is NdarrayCodec
    write_dataset(url, Schema, _rows(100, 105), mode='overwrite')
    assert _ids(url) == list(range(100, 105))
    assert _ids(url, table_version=2) == list(range(30))  # older versions keep their rows


def test_statistics_of_the_commit_prune_files(tmp_path):
    url = f'file://{tmp_path}/table'
    for start in range(0, 40, 10):
        write_dataset(url, Schema, _rows(start, start + 10), mode='append', table_format='delta')
    with make_batch_reader(url, filters=[('id', '>=', 25)], schema_fields=['id']) as reader:
        assert len(reader.work_items) == 2
        assert sorted(int(i) for batch in reader for i in batch.id) == list(range(25, 40))


def _files(root: str) -> set[str]:
    return set(glob.glob(os.path.join(root, '*.parquet')))


def test_a_failed_write_leaves_the_table_at_its_last_version(tmp_path):
    root = str(tmp_path / 'table')
    url = f'file://{root}'
    write_dataset(url, Schema, _rows(0, 10), table_format='delta')
    before = _files(root)
    bad = _rows(10, 400) + [{'id': 400, 'matrix': 'not an array'}]
    with pytest.raises((SchemaError, TypeError, ValueError)):
        write_dataset(url, Schema, bad, mode='append', row_group_size_mb=0.001)
    assert _files(root) == before
    assert deltalake.DeltaTable(root).version() == 1
    assert _ids(url) == list(range(10))


def test_a_refused_commit_removes_its_files(tmp_path, monkeypatch):
    root = str(tmp_path / 'table')
    url = f'file://{root}'
    write_dataset(url, Schema, _rows(0, 10), table_format='delta')
    before = _files(root)

    def refuse(*args, **kwargs):
        raise deltalake.exceptions.CommitFailedError('another writer committed first')

    monkeypatch.setattr(deltalake.DeltaTable, 'create_write_transaction', refuse)
    with pytest.raises(DatasetWriteError, match='another writer committed first'):
        write_dataset(url, Schema, _rows(10, 20), mode='append')
    assert _files(root) == before
    monkeypatch.undo()
    assert _ids(url) == list(range(10))


def test_a_failed_first_write_leaves_no_table(tmp_path, monkeypatch):
    root = str(tmp_path / 'table')

    def refuse(*args, **kwargs):
        raise OSError('the storage went away')

    monkeypatch.setattr(deltalake.DeltaTable, 'create_write_transaction', refuse)
    with pytest.raises(DatasetWriteError):
        write_dataset(f'file://{root}', Schema, _rows(0, 10), table_format='delta')
    assert not os.path.exists(root)


def test_targets_that_are_refused(tmp_path):
    url = f'file://{tmp_path}/table'
    write_dataset(url, Schema, _rows(0, 5), table_format='delta')
    with pytest.raises(FileExistsError, match="mode='append'"):
        write_dataset(url, Schema, _rows(5, 10))
    other = Unischema('Other', [UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False)])
    with pytest.raises(SchemaError, match='columns of the Delta table'):
        write_dataset(url, other, [{'id': 1}], mode='append')
    with pytest.raises(ValueError, match="table_format='delta'"):
        write_dataset(f'file://{tmp_path}/plain', Schema, _rows(0, 5), mode='append', table_format='parquet')
    (tmp_path / 'occupied').mkdir()
    (tmp_path / 'occupied' / 'x.txt').write_text('x')
    with pytest.raises(FileExistsError, match='not a Delta table'):
        write_dataset(f'file://{tmp_path}/occupied', Schema, _rows(0, 5), table_format='delta')


def test_appending_to_a_table_another_tool_made(tmp_path):
    root = str(tmp_path / 'foreign')
    arrow = Schema.as_pyarrow_schema()
    deltalake.write_deltalake(root, pa.table({'id': pa.array([1000], pa.int64()),
                                              'matrix': pa.array([b''], pa.binary())}, schema=arrow))
    write_dataset(f'file://{root}', Schema, _rows(0, 5), mode='append')
    table = deltalake.DeltaTable(root)
    assert 'petastorm.unischema.json' in table.metadata().configuration
    with make_batch_reader(f'file://{root}', schema_fields=['id']) as reader:
        assert sorted(int(i) for batch in reader for i in batch.id) == [0, 1, 2, 3, 4, 1000]


def test_inspect_shows_the_version_files_and_deletes(tmp_path, capsys):
    from petastorm.tools.inspect import main
    from support.tables_util import add_deletion_vector, current_adds

    root = str(tmp_path / 'table')
    write_dataset(f'file://{root}', Schema, _rows(0, 10), table_format='delta')
    deltalake.DeltaTable(root).alter.set_table_properties(
        {'delta.enableDeletionVectors': 'true'})
    (path,) = current_adds(root)
    add_deletion_vector(root, path, [2, 3])
    main([f'file://{root}'])
    report = capsys.readouterr().out
    assert 'delta version 3' in report
    assert 'deletionVectors' in report
    assert '2 rows deleted, 8 live' in report
    assert 'metadata: json (' in report
    main([f'file://{root}', '--files'])
    assert '10 rows (2 deleted)' in capsys.readouterr().out
    main([f'file://{root}', '--table-version', '1', '--json'])
    import json

    described = json.loads(capsys.readouterr().out)
    assert described['table']['version'] == 1
    assert described['table']['deleted_rows'] == 0
    assert [f['name'] for f in described['fields']] == ['id', 'matrix']


def test_decoded_cache_of_a_table_with_deletes(tmp_path):
    from support.tables_util import add_deletion_vector, current_adds

    root = str(tmp_path / 'table')
    url = f'file://{root}'
    write_dataset(url, Schema, _rows(0, 40), table_format='delta', row_group_size_mb=0.0005)
    deltalake.DeltaTable(root).alter.set_table_properties({'delta.enableDeletionVectors': 'true'})
    (path,) = current_adds(root)
    add_deletion_vector(root, path, [0, 7, 8, 39])
    settings = {'cache_type': 'local-disk-decoded', 'cache_location': str(tmp_path / 'cache'),
                'cache_size_limit': 1 << 30, 'cache_row_size_estimate': 100,
                'cache_extra_settings': {'cleanup': False}}
    expected = [i for i in range(40) if i not in (0, 7, 8, 39)]
    for _ in range(2):  # the first pass fills the cache with decoded row groups, the second reads them
        assert _ids(url, **settings) == expected
