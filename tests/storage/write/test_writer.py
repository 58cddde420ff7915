"""write_dataset: Parquet files plus metadata, without Spark."""

from __future__ import annotations

import json
import os
import uuid

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import write_dataset
from petastorm.codecs import CompressedImageCodec, DataframeColumnCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import DatasetWriteError, SchemaError
from petastorm.fs import path_to_url
from petastorm.metadata.schema_json import unischema_from_json
from petastorm.unischema import Unischema, UnischemaField

MB = 1024 * 1024

Schema = Unischema('WriterSchema', [
    UnischemaField('id', np.int32, (), None, False),
    UnischemaField('matrix', np.float32, (10, 10), NdarrayCodec(), False),
    UnischemaField('image', np.uint8, (4, 5, 3), CompressedImageCodec('png'), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), True),
    UnischemaField('values', np.int64, (None,), None, True),
    UnischemaField('maybe', np.float64, (3,), NdarrayCodec(), True),
])


def _row(i: int) -> dict:
    return {
        'id': i,
        'matrix': np.full((10, 10), i, np.float32),
        'image': np.full((4, 5, 3), i % 256, np.uint8),
        'label': None if i % 3 == 0 else f'label_{i}',
        'values': None if i % 4 == 0 else np.arange(i % 5, dtype=np.int64),
        'maybe': None if i % 2 else np.array([i, i + 1, i + 2], np.float64),
    }


def _data_files(root) -> list[str]:
    return sorted(str(p) for p in root.rglob('*') if p.is_file() and not p.name.startswith(('_', '.')))


def _read_back(root) -> list[dict]:
    """Rows decoded with plain pyarrow and the codecs, in file order."""
    rows = []
    for path in _data_files(root):
        for record in pq.read_table(path).to_pylist():
            decoded = {}
            for name, field in Schema.fields.items():
                value = record[name]
                if value is not None and field.codec is not None:
                    value = field.codec.decode(field, value)
                decoded[name] = value
            rows.append(decoded)
    return rows


def _assert_rows_equal(actual: list[dict], expected: list[dict]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got['id'] == want['id']
        assert np.array_equal(got['matrix'], want['matrix'])
        assert got['matrix'].dtype == np.float32
        assert np.array_equal(got['image'], want['image'])
        assert got['label'] == want['label']
        if want['values'] is None:
            assert got['values'] is None
        else:
            assert got['values'] == want['values'].tolist()
        if want['maybe'] is None:
            assert got['maybe'] is None
        else:
            assert np.array_equal(got['maybe'], want['maybe'])


def _common_metadata(root) -> dict[bytes, bytes]:
    return pq.read_metadata(str(root / '_common_metadata')).metadata


def test_round_trip_from_dicts(tmp_path):
    root = tmp_path / 'ds'
    rows = [_row(i) for i in range(40)]
    result = write_dataset(path_to_url(str(root)), Schema, iter(rows))
    assert result.num_rows == 40
    assert result.url == path_to_url(str(root))
    assert sorted(result.files) == _data_files(root)
    _assert_rows_equal(_read_back(root), rows)
    # Arrow types and nullability of the stored columns follow the schema.
    stored = pq.read_schema(_data_files(root)[0])
    for field in Schema.as_pyarrow_schema():
        assert stored.field(field.name).type == field.type
        assert stored.field(field.name).nullable == field.nullable


def test_metadata_keys_and_counts(tmp_path):
    root = tmp_path / 'ds'
    result = write_dataset(path_to_url(str(root)), Schema, (_row(i) for i in range(300)),
                           row_group_size_mb=0.02, file_size_mb=0.08)
    kv = _common_metadata(root)
    assert unischema_from_json(kv[b'petastorm.unischema.json']) == Schema
    row_groups = json.loads(kv[b'petastorm.row_groups.json'])
    per_file = json.loads(kv[b'dataset-toolkit.num_row_groups_per_file.v1'])
    footers = {os.path.relpath(p, root): pq.read_metadata(p) for p in _data_files(root)}
    assert row_groups['format_version'] == 1
    assert set(row_groups['files']) == set(per_file) == set(footers) == set(result.row_groups)
    for name, footer in footers.items():
        counts = [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
        assert row_groups['files'][name] == counts == result.row_groups[name]
        assert per_file[name] == footer.num_row_groups
    assert sum(sum(c) for c in row_groups['files'].values()) == 300
    assert pq.read_metadata(str(root / '_common_metadata')).num_row_groups == 0
    assert not (root / '._common_metadata.crc').exists()


def test_row_groups_honour_row_group_size(tmp_path):
    root = tmp_path / 'ds'
    limit_mb = 0.02
    write_dataset(path_to_url(str(root)), Schema, (_row(i) for i in range(300)), row_group_size_mb=limit_mb,
                  file_size_mb=1000)
    files = _data_files(root)
    assert len(files) == 1
    footer = pq.read_metadata(files[0])
    sizes = [footer.row_group(i).total_byte_size for i in range(footer.num_row_groups)]
    total_in_memory = pq.read_table(files[0]).nbytes
    assert footer.num_row_groups >= total_in_memory // int(limit_mb * MB)  # several groups, none much too big
    assert max(sizes) <= 1.5 * limit_mb * MB
    one_group = tmp_path / 'one'
    write_dataset(path_to_url(str(one_group)), Schema, (_row(i) for i in range(300)), row_group_size_mb=64)
    assert pq.read_metadata(_data_files(one_group)[0]).num_row_groups == 1


def test_files_split_by_file_size(tmp_path):
    root = tmp_path / 'ds'
    result = write_dataset(path_to_url(str(root)), Schema, (_row(i) for i in range(300)),
                           row_group_size_mb=0.02, file_size_mb=0.06)
    files = _data_files(root)
    assert len(files) >= 3
    assert len(result.files) == len(files)
    for path in files[:-1]:
        assert pq.read_table(path).nbytes <= 0.06 * MB + 0.03 * MB  # at most one row group past the limit
    _assert_rows_equal(_read_back(root), [_row(i) for i in range(300)])  # file order is row order


def test_input_as_arrow_table(tmp_path):
    rows = [_row(i) for i in range(10)]
    table = pa.table({
        'id': pa.array([r['id'] for r in rows], pa.int32()),
        'matrix': [r['matrix'].tolist() for r in rows],
        'image': [r['image'].tolist() for r in rows],
        'label': [r['label'] for r in rows],
        'values': [None if r['values'] is None else r['values'].tolist() for r in rows],
        'maybe': [None if r['maybe'] is None else r['maybe'].tolist() for r in rows],
    })
    root = tmp_path / 'ds'
    result = write_dataset(path_to_url(str(root)), Schema, table)
    assert result.num_rows == 10
    _assert_rows_equal(_read_back(root), rows)


def test_input_as_pandas_dataframe(tmp_path):
    rows = [_row(i) for i in range(10)]
    frame = pd.DataFrame(rows)
    root = tmp_path / 'ds'
    result = write_dataset(path_to_url(str(root)), Schema, frame)
    assert result.num_rows == 10
    _assert_rows_equal(_read_back(root), rows)


def test_nullable_fields_store_nulls(tmp_path):
    root = tmp_path / 'ds'
    rows = [_row(i) for i in range(12)]
    for row in rows[:3]:
        del row['label']  # missing nullable field == None
    write_dataset(path_to_url(str(root)), Schema, rows)
    table = pa.concat_tables([pq.read_table(p) for p in _data_files(root)])
    assert table.column('label').null_count == sum(1 for i in range(12) if i < 3 or i % 3 == 0)
    assert table.column('maybe').null_count == 6
    assert table.column('values').null_count == 3


def test_mode_error_refuses_non_empty_directory(tmp_path):
    root = tmp_path / 'ds'
    root.mkdir()
    (root / 'something').write_text('x')
    with pytest.raises(FileExistsError, match='overwrite'):
        write_dataset(path_to_url(str(root)), Schema, [_row(0)])
    assert sorted(os.listdir(root)) == ['something']


def test_mode_error_accepts_empty_directory(tmp_path):
    root = tmp_path / 'ds'
    root.mkdir()
    write_dataset(path_to_url(str(root)), Schema, [_row(0)])
    assert len(_data_files(root)) == 1


def test_target_that_is_a_file(tmp_path):
    target = tmp_path / 'file.txt'
    target.write_text('x')
    with pytest.raises(FileExistsError):
        write_dataset(path_to_url(str(target)), Schema, [_row(0)], mode='overwrite')
    assert target.read_text() == 'x'


def test_mode_overwrite_replaces(tmp_path):
    root = tmp_path / 'ds'
    write_dataset(path_to_url(str(root)), Schema, [_row(i) for i in range(20)])
    old_files = _data_files(root)
    (root / 'stray.txt').write_text('old')
    write_dataset(path_to_url(str(root)), Schema, [_row(i) for i in range(100, 105)], mode='overwrite')
    new_files = _data_files(root)
    assert not set(old_files) & set(new_files)
    assert not (root / 'stray.txt').exists()
    _assert_rows_equal(_read_back(root), [_row(i) for i in range(100, 105)])
    assert sum(sum(c) for c in json.loads(_common_metadata(root)[b'petastorm.row_groups.json'])['files']
               .values()) == 5


def _bad_rows(n: int = 300, bad_at: int = 150):
    for i in range(n):
        row = _row(i)
        if i == bad_at:
            row['matrix'] = np.zeros((10, 11), np.float32)
        yield row


def test_bad_row_mid_stream_leaves_nothing(tmp_path):
    root = tmp_path / 'ds'
    with pytest.raises(SchemaError) as info:
        write_dataset(path_to_url(str(root)), Schema, _bad_rows(), row_group_size_mb=0.01, file_size_mb=0.02)
    message = str(info.value)
    assert 'row 150' in message
    assert 'matrix' in message
    assert not root.exists()


def test_bad_row_in_existing_empty_directory_leaves_it_empty(tmp_path):
    root = tmp_path / 'ds'
    root.mkdir()
    with pytest.raises(SchemaError, match='row 150'):
        write_dataset(path_to_url(str(root)), Schema, _bad_rows(), row_group_size_mb=0.01, file_size_mb=0.02)
    assert os.listdir(root) == []  # no _common_metadata, no data files, no staging directory


def test_failed_overwrite_keeps_the_old_dataset(tmp_path):
    root = tmp_path / 'ds'
    write_dataset(path_to_url(str(root)), Schema, [_row(i) for i in range(7)])
    before = sorted(os.listdir(root))
    with pytest.raises(SchemaError, match='row 150'):
        write_dataset(path_to_url(str(root)), Schema, _bad_rows(), mode='overwrite', row_group_size_mb=0.01)
    assert sorted(os.listdir(root)) == before
    _assert_rows_equal(_read_back(root), [_row(i) for i in range(7)])


def test_wrong_type_in_a_later_row_names_row_and_field(tmp_path):
    rows = [_row(i) for i in range(5)]
    rows[3]['id'] = 'three'
    with pytest.raises(SchemaError) as info:
        write_dataset(path_to_url(str(tmp_path / 'ds')), Schema, rows, workers_count=1)
    assert 'row 3' in str(info.value)
    assert "'id'" in str(info.value)
    assert not (tmp_path / 'ds').exists()


def test_no_rows_writes_nothing(tmp_path):
    with pytest.raises(SchemaError, match='no rows'):
        write_dataset(path_to_url(str(tmp_path / 'ds')), Schema, [])
    assert not (tmp_path / 'ds').exists()


@pytest.mark.parametrize(('options', 'name'), [
    ({'row_group_size_mb': 0}, 'row_group_size_mb'),
    ({'row_group_size_mb': -1}, 'row_group_size_mb'),
    ({'row_group_size_mb': '32'}, 'row_group_size_mb'),
    ({'file_size_mb': 1, 'row_group_size_mb': 2}, 'file_size_mb'),
    ({'mode': 'x'}, 'mode'),
    ({'mode': 'append'}, 'mode'),
    ({'workers_count': 0}, 'workers_count'),
    ({'workers_count': 2.5}, 'workers_count'),
    ({'compression': 5}, 'compression'),
])
def test_bad_options(tmp_path, options, name):
    with pytest.raises(ValueError, match=name):
        write_dataset(path_to_url(str(tmp_path / 'ds')), Schema, [_row(0)], **options)
    assert not (tmp_path / 'ds').exists()


def test_bad_inputs(tmp_path):
    url = path_to_url(str(tmp_path / 'ds'))
    with pytest.raises(SchemaError, match='Unischema'):
        write_dataset(url, {'id': np.int32}, [_row(0)])
    with pytest.raises(SchemaError, match='iterable of row dicts'):
        write_dataset(url, Schema, _row(0))
    with pytest.raises(ValueError, match='relative path'):
        write_dataset('relative/ds', Schema, [_row(0)])
    assert not os.path.exists('relative')


def test_an_absolute_path_is_a_local_url(tmp_path):
    write_dataset(str(tmp_path / 'ds'), Schema, [_row(0)])
    _assert_rows_equal(_read_back(tmp_path / 'ds'), [_row(0)])


def test_workers_count_does_not_change_the_order(tmp_path):
    rows = [_row(i) for i in range(200)]
    for workers in (1, 4):
        root = tmp_path / f'w{workers}'
        write_dataset(path_to_url(str(root)), Schema, rows, workers_count=workers, row_group_size_mb=0.02)
        _assert_rows_equal(_read_back(root), rows)


def test_compression_option(tmp_path):
    root = tmp_path / 'ds'
    write_dataset(path_to_url(str(root)), Schema, [_row(i) for i in range(5)], compression='zstd')
    footer = pq.read_metadata(_data_files(root)[0])
    assert footer.row_group(0).column(0).compression == 'ZSTD'
    plain = tmp_path / 'plain'
    write_dataset(path_to_url(str(plain)), Schema, [_row(i) for i in range(5)], compression=None)
    assert pq.read_metadata(_data_files(plain)[0]).row_group(0).column(0).compression == 'UNCOMPRESSED'


def test_memory_url():
    base = f'memory://petastorm-writer-test-{uuid.uuid4().hex}'
    fs = fsspec.filesystem('memory')
    try:
        result = write_dataset(f'{base}/ds', Schema, [_row(i) for i in range(6)])
        assert result.num_rows == 6
        names = fs.ls(f'{base}/ds', detail=False)
        assert any(n.endswith('/_common_metadata') for n in names)
        [data_file] = [n for n in names if n.endswith('.parquet')]
        with fs.open(data_file, 'rb') as f:
            table = pq.read_table(f)
        assert table.column('id').to_pylist() == list(range(6))
        with fs.open(f'{base}/ds/_common_metadata', 'rb') as f:
            assert b'petastorm.unischema.json' in pq.read_metadata(f).metadata
    finally:
        if fs.exists(base):
            fs.rm(base, recursive=True)


def test_a_scalar_codec_field_with_a_shape_is_refused_before_any_row_is_read(tmp_path):
    with pytest.warns(UserWarning, match='must be an empty tuple'):
        schema = Unischema('S', [UnischemaField('v', np.int32, (3,), ScalarCodec(pa.int32()), False)])
    consumed = []

    def rows():
        consumed.append(1)
        yield {'v': np.zeros(3, np.int32)}

    with pytest.raises(SchemaError, match=r"The shape field of a scalar field 'v' must be an empty tuple.*Got \(3,\)"):
        write_dataset(path_to_url(str(tmp_path / 'ds')), schema, rows())
    assert not consumed
    assert not (tmp_path / 'ds').exists()


class _UpperCaseCodec(DataframeColumnCodec):
    """A user's codec written against the base class alone: it encodes one value at a time."""

    codec_name = 'test_upper_case'

    def encode(self, unischema_field, value):
        if not isinstance(value, str):
            raise SchemaError(f'field {unischema_field.name}: expected a str, got {type(value).__name__}')
        return value.upper()

    def decode(self, unischema_field, value):
        return value.lower()

    def spark_dtype(self):
        raise NotImplementedError

    def arrow_type(self):
        return pa.string()


class _RunTaggingCodec(_UpperCaseCodec):
    """A codec that builds whole columns: each cell records its position in the run of rows it was encoded with."""

    codec_name = 'test_run_tagging'

    def check_value(self, unischema_field, value):
        return self.encode(unischema_field, value)

    def encode_column(self, unischema_field, values):
        return pa.array([None if v is None else f'{i}/{len(values)}:{v}' for i, v in enumerate(values)],
                        type=pa.string())


def _words_schema(codec):
    return Unischema('Words', [UnischemaField('id', np.int32, (), None, False),
                               UnischemaField('word', np.str_, (), codec, True)])


def test_a_codec_with_the_default_protocol_encodes_each_value(tmp_path):
    root = tmp_path / 'ds'
    rows = [{'id': i, 'word': None if i == 3 else f'w{i}'} for i in range(10)]
    write_dataset(path_to_url(str(root)), _words_schema(_UpperCaseCodec()), rows, legacy_metadata=False)
    stored = pq.read_table(_data_files(root)).to_pydict()
    assert stored['word'] == [None if i == 3 else f'W{i}' for i in range(10)]
    with pytest.raises(SchemaError, match='row 4: field word: expected a str, got int'):
        write_dataset(path_to_url(str(tmp_path / 'bad')), _words_schema(_UpperCaseCodec()),
                      [{'id': i, 'word': i if i == 4 else 'ok'} for i in range(6)], legacy_metadata=False)


def test_the_writer_hands_whole_runs_of_rows_to_encode_column(tmp_path):
    root = tmp_path / 'ds'
    rows = [{'id': i, 'word': f'w{i}'} for i in range(100)]
    write_dataset(path_to_url(str(root)), _words_schema(_RunTaggingCodec()), rows, legacy_metadata=False)
    table = pq.read_table(_data_files(root))
    cells = dict(zip(table.column('id').to_pylist(), table.column('word').to_pylist(), strict=True))
    runs = [int(cells[i].split(':')[0].split('/')[1]) for i in range(100)]
    assert all(cells[i].endswith(f':W{i}') for i in range(100))
    assert sum(runs[i] for i in range(100) if cells[i].startswith('0/')) == 100  # the runs cover every row once
    assert max(runs) > 1  # encoded a run at a time, not cell by cell


def test_a_failed_commit_is_rolled_back(tmp_path, monkeypatch):
    import petastorm.writing.staged

    def failing_metadata_write(*args, **kwargs):
        raise OSError('the storage refused _common_metadata')

    monkeypatch.setattr(petastorm.writing.staged, 'write_dataset_metadata', failing_metadata_write)
    root = tmp_path / 'ds'
    with pytest.raises(DatasetWriteError, match='rolled back: the storage refused _common_metadata'):
        write_dataset(path_to_url(str(root)), Schema, [_row(i) for i in range(5)])
    assert not root.exists()  # the data files already moved into place are gone with the directory
