"""Reading nested, ragged and null columns with ``make_batch_reader`` and ``make_reader``.

The files are written by pyarrow; every delivered row equals pyarrow's ``to_pylist()`` row, through every pool
kind, with shuffles, shards, predicates and transforms on.
"""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import TransformSpec, make_batch_reader, make_reader
from petastorm.codecs import ScalarCodec
from petastorm.columns import ListColumn, MapColumn, StructColumn
from petastorm.predicates import in_lambda
from support.nested_tables import assert_rows_equal, batch_rows, every_type_table, expected_rows

ROWS = 60


@pytest.fixture(scope='module')
def table():
    return every_type_table(ROWS, seed=3)


@pytest.fixture(scope='module')
def url(table, tmp_path_factory):
    path = tmp_path_factory.mktemp('nested')
    pq.write_table(table.slice(0, 35), path / 'part-0.parquet', row_group_size=10)
    pq.write_table(table.slice(35), path / 'part-1.parquet', row_group_size=10)
    return 'file://' + str(path)


def _row_reader(url, **kwargs):
    return make_reader(url, **kwargs)


@pytest.mark.parametrize('pool', ['dummy', 'thread', 'process'])
def test_batch_reader_gives_pyarrows_rows(url, table, pool):
    with make_batch_reader(url, reader_pool_type=pool, workers_count=2, shuffle_row_groups=True, shuffle_rows=True,
                           seed=5) as reader:
        rows = [row for batch in reader for row in batch_rows(batch)]
    assert_rows_equal(rows, expected_rows(table))


@pytest.mark.parametrize('pool', ['dummy', 'process'])
def test_row_reader_gives_pyarrows_rows_in_every_shard(url, table, pool):
    rows = []
    for shard in range(2):
        with _row_reader(url, reader_pool_type=pool, workers_count=2, cur_shard=shard, shard_count=2,
                         shuffle_row_groups=True, shuffle_rows=True, seed=1) as reader:
            rows.extend(row._asdict() for row in reader)
    assert_rows_equal(rows, expected_rows(table))


def test_the_inferred_schema_says_what_the_columns_hold(url):
    with make_batch_reader(url) as reader:
        fields = reader.schema.fields
    assert (fields['nint'].numpy_dtype, fields['nint'].shape, fields['nint'].codec, fields['nint'].nullable) == \
        (np.int32, (), None, True)
    assert (fields['ids'].numpy_dtype, fields['ids'].shape, fields['ids'].codec) == (np.int64, (None,), None)
    assert (fields['nested'].numpy_dtype, fields['nested'].shape) == (np.int16, (None, None))
    assert fields['nested'].codec == ScalarCodec(pa.list_(pa.list_(pa.int16())))
    assert (fields['boxes'].numpy_dtype, fields['boxes'].shape) == (np.float32, (None, 4))
    assert (fields['fixed'].numpy_dtype, fields['fixed'].shape, fields['fixed'].codec) == (np.int32, (3,), None)
    assert fields['point'].numpy_dtype is dict
    assert fields['point'].shape == ()
    assert pa.types.is_struct(fields['point'].codec.arrow_type())
    assert fields['objects'].numpy_dtype is dict
    assert fields['objects'].shape == (None,)
    assert pa.types.is_map(fields['attrs'].codec.arrow_type())
    assert fields['when'].codec.arrow_type() == pa.timestamp('ns', tz='Europe/Paris')
    assert fields['day'].codec.arrow_type() == pa.date32()
    assert fields['clock'].numpy_dtype is np.timedelta64
    assert fields['price'].numpy_dtype is decimal.Decimal
    assert fields['price'].codec.arrow_type() == pa.decimal128(9, 2)
    assert fields['label'].numpy_dtype is np.str_
    assert fields['half'].numpy_dtype is np.float16


def test_batches_hold_values_offsets_and_masks(url):
    with make_batch_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    assert isinstance(batch.nint, np.ma.MaskedArray)
    assert batch.nint.dtype == np.int32
    assert batch.nint.mask.tolist() == [i % 5 == 3 for i in range(10)]
    assert isinstance(batch.ids, ListColumn)
    assert batch.ids.values.dtype == np.int64
    assert batch.ids.offsets[0] == 0
    assert len(batch.ids.offsets) == 11
    assert isinstance(batch.point, StructColumn)
    assert set(batch.point) == {'x', 'y', 'tags', 'inner'}
    assert isinstance(batch.attrs, MapColumn)
    assert batch.fixed.shape == (10, 3)
    assert batch.when.dtype == np.dtype('datetime64[ns]')
    assert batch.day.dtype == np.dtype('datetime64[D]')
    assert batch.clock.dtype == np.dtype('timedelta64[us]')


def test_equal_length_lists_are_one_array_as_in_petastorm(tmp_path):
    pq.write_table(pa.table({'v': pa.array([[1, 2], [3, 4]], pa.list_(pa.int32()))}), tmp_path / 'a.parquet')
    with make_batch_reader('file://' + str(tmp_path)) as reader:
        batch = next(iter(reader))
    assert batch.v.shape == (2, 2)
    assert batch.v.dtype == np.int32


def test_a_struct_leaf_is_read_alone(url, table):
    with make_batch_reader(url, schema_fields=['id', 'point.inner.z', 'point.x'], reader_pool_type='dummy') as reader:
        assert reader.schema.fields['point'].codec.arrow_type() == pa.struct(
            [('x', pa.float64()), ('inner', pa.struct([('z', pa.int8())]))])
        rows = [row for batch in reader for row in batch_rows(batch)]
    expected = [{'id': row['id'], 'point': None if row['point'] is None else
                 {'x': row['point']['x'], 'inner': row['point']['inner']}} for row in expected_rows(table)]
    assert_rows_equal(rows, expected)


def test_a_struct_leaf_that_does_not_exist_is_named(url):
    with pytest.raises(ValueError, match=r"'point.inner' has no field 'w' \(its fields: z\)"):
        make_batch_reader(url, schema_fields=['point.inner.w'])


def test_a_batch_transform_sees_nullable_and_zoned_columns_and_keeps_units(url, table):
    seen = {}

    def fill(frame):
        seen['nint'] = str(frame['nint'].dtype)
        seen['when'] = str(frame['when'].dtype)
        frame['nint'] = frame['nint'].fillna(-1)
        return frame

    spec = TransformSpec(fill)
    with make_batch_reader(url, schema_fields=['id', 'nint', 'when', 'day', 'ids', 'point'], transform_spec=spec,
                           reader_pool_type='dummy') as reader:
        batches = list(reader)
    assert seen == {'nint': 'Int32', 'when': 'datetime64[ns, Europe/Paris]'}
    assert all(batch.day.dtype == np.dtype('datetime64[D]') for batch in batches)
    rows = [row for batch in batches for row in batch_rows(batch)]
    expected = [{**{k: row[k] for k in ('id', 'when', 'day', 'ids', 'point')},
                 'nint': -1 if row['nint'] is None else row['nint']} for row in expected_rows(table)]
    assert_rows_equal(rows, expected)


def test_a_row_transform_may_return_nulls_and_lists(url, table):
    def edit(row):
        return {'id': row['id'], 'nint': None if row['id'] % 2 else row['nint'],
                'ids': None if row['ids'] is None else list(row['ids']) + [0]}

    spec = TransformSpec(edit)
    with _row_reader(url, schema_fields=['id', 'nint', 'ids'], transform_spec=spec, reader_pool_type='dummy') as reader:
        rows = [row._asdict() for row in reader]
    expected = [{'id': row['id'], 'nint': None if row['id'] % 2 else row['nint'],
                 'ids': None if row['ids'] is None else row['ids'] + [0]} for row in expected_rows(table)]
    assert_rows_equal(rows, expected)


def test_predicates_see_nulls_as_none(url, table):
    predicate = in_lambda(['nint'], lambda value: value is None)
    with _row_reader(url, predicate=predicate, reader_pool_type='dummy') as reader:
        ids = sorted(row.id for row in reader)
    assert ids == [row['id'] for row in expected_rows(table) if row['nint'] is None]


def test_large_nested_batches_cross_the_process_pool_in_shared_memory(tmp_path):
    lengths = np.random.default_rng(0).integers(0, 40, 20_000)
    valid = np.arange(20_000) % 11 != 0
    lengths[~valid] = 0  # null lists hold no values: pyarrow before 26 cannot write ones that do to Parquet
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.arange(offsets[-1], dtype=np.int64))
    table = pa.table({'id': np.arange(20_000),
                      'ids': pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~valid))})
    pq.write_table(table, tmp_path / 'a.parquet', row_group_size=10_000)
    with make_batch_reader('file://' + str(tmp_path), reader_pool_type='process', workers_count=2,
                           shuffle_row_groups=False) as reader:
        batches = list(reader)
    assert sum(len(b.id) for b in batches) == 20_000
    rows = [row for batch in batches for row in batch_rows(batch)]
    assert_rows_equal(rows, table.to_pylist())


@pytest.mark.parametrize('cache_type', ['local-disk', 'local-disk-decoded'])
def test_struct_leaves_through_the_row_group_caches(url, table, tmp_path, cache_type):
    for _ in range(2):  # the second pass reads the cache
        with make_batch_reader(url, schema_fields=['id', 'point.x', 'objects'], reader_pool_type='dummy',
                               cache_type=cache_type, cache_location=str(tmp_path), cache_size_limit=10**9,
                               cache_row_size_estimate=100, cache_extra_settings={'cleanup': False}) as reader:
            rows = [row for batch in reader for row in batch_rows(batch)]
        expected = [{'id': row['id'], 'objects': row['objects'],
                     'point': None if row['point'] is None else {'x': row['point']['x']}}
                    for row in expected_rows(table)]
        assert_rows_equal(rows, expected)
