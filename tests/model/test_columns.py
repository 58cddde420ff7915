"""The column kinds of ``petastorm.columns``: Arrow to columns and back, and the whole-column operations.

Every column of a table of every Parquet type must come back from ``from_arrow`` with pyarrow's own rows, and
slicing, gathering, joining and flattening must be the same as doing it to the rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from petastorm.columns import (
    ListColumn,
    MapColumn,
    MaskedColumn,
    StructColumn,
    concat_columns,
    densified,
    flatten_columns,
    from_arrow,
    num_rows,
    row_values,
    slice_column,
    take_column,
    to_arrow,
    unflatten_columns,
)
from support.nested_tables import every_type_table, expected_rows, plain

TABLE = every_type_table(23)
NAMES = TABLE.column_names


def _rows(column):
    return [plain(value) for value in row_values(column)]


def _expected(name):
    return [row[name] for row in expected_rows(TABLE.select([name]))]


@pytest.mark.parametrize('name', NAMES)
def test_from_arrow_gives_pyarrows_rows(name):
    column = from_arrow(TABLE.column(name))
    assert num_rows(column) == TABLE.num_rows
    assert _rows(column) == _expected(name)


@pytest.mark.parametrize('name', NAMES)
def test_to_arrow_is_the_inverse(name):
    stored = TABLE.column(name).combine_chunks()
    if pa.types.is_dictionary(stored.type):
        stored = stored.dictionary_decode()
    back = to_arrow(from_arrow(stored), stored.type)
    assert back.type == stored.type
    assert back.to_pylist() == stored.to_pylist()


@pytest.mark.parametrize('name', NAMES)
def test_slices_gathers_and_joins_act_on_rows(name):
    column = from_arrow(TABLE.column(name))
    rows = _expected(name)
    assert _rows(slice_column(column, 5, 17)) == rows[5:17]
    order = np.random.default_rng(1).permutation(len(rows))
    assert _rows(take_column(column, order)) == [rows[i] for i in order]
    parts = [slice_column(column, 0, 4), slice_column(column, 4, 4), take_column(column, np.array([9, 2])),
             slice_column(column, 10, 23)]
    assert _rows(concat_columns(parts)) == rows[:4] + [rows[9], rows[2]] + rows[10:]


def test_flattened_columns_rebuild_from_their_keys_alone():
    columns = {name: from_arrow(TABLE.column(name)) for name in NAMES}
    flat = flatten_columns(columns)
    assert all(type(array) is np.ndarray for array in flat.values())
    rebuilt = unflatten_columns({key: array.copy() for key, array in flat.items()})
    assert list(rebuilt) == NAMES
    for name in NAMES:
        assert type(rebuilt[name]) is type(columns[name])
        assert _rows(rebuilt[name]) == _expected(name)


def test_object_columns_of_arrays_flatten_to_one_buffer_and_rebuild_as_views():
    rng = np.random.default_rng(0)
    clips = np.empty(5, dtype=object)
    clips[:] = [rng.standard_normal((2, n)).astype(np.float32) for n in (7, 0, 3, 9, 1)]
    clips[3] = None
    mixed = np.empty(2, dtype=object)
    mixed[:] = [np.zeros(2, np.float32), np.zeros(2, np.int16)]  # two dtypes: left as it is
    flat = flatten_columns({'clips': clips, 'mixed': mixed, 'words': np.array(['a', None], dtype=object)})
    assert flat['mixed'] is mixed
    assert flat['words'].tolist() == ['a', None]
    clip_keys = [key for key in flat if key.startswith('clips')]
    assert len(clip_keys) == 4
    assert all(flat[key].dtype != object for key in clip_keys)
    rebuilt = unflatten_columns({key: array.copy() for key, array in flat.items()})['clips']
    assert rebuilt.dtype == object
    assert rebuilt[3] is None
    for got, expected in zip(rebuilt.tolist(), clips.tolist(), strict=True):
        if expected is not None:
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)


def test_kinds_are_views_of_the_arrow_buffers():
    ids = pa.array([[1, 2], [3], None, []], pa.list_(pa.int64()))
    column = from_arrow(ids)
    assert isinstance(column, ListColumn)
    assert column.values.base is not None
    assert not column.values.flags.writeable
    assert column.offsets.tolist() == [0, 2, 3, 3, 3]
    assert column.valid.tolist() == [True, True, False, True]
    sliced = from_arrow(ids.slice(1, 2))
    assert sliced.offsets.tolist() == [0, 1, 1]
    assert sliced.values.tolist() == [3]
    nulls = from_arrow(pa.array([1.5, None], pa.float32()))
    assert isinstance(nulls, MaskedColumn)
    assert nulls.values.tolist() == [1.5, 0.0]
    assert nulls.valid.tolist() == [True, False]


def test_structs_are_dicts_of_their_fields():
    column = from_arrow(TABLE.column('point'))
    assert isinstance(column, StructColumn)
    assert list(column) == ['x', 'y', 'tags', 'inner']
    assert isinstance(column['tags'], ListColumn)
    assert isinstance(column['inner'], StructColumn)
    assert column.num_rows == TABLE.num_rows
    assert column.valid.tolist() == [i % 5 != 3 for i in range(TABLE.num_rows)]


def test_maps_keep_their_keys_and_values_apart():
    column = from_arrow(pa.array([[('a', 1), ('b', 2)], [], [('a', 3)]], pa.map_(pa.string(), pa.int64())))
    assert isinstance(column, MapColumn)
    assert column.keys.tolist() == ['a', 'b', 'a']
    assert column.items.tolist() == [1, 2, 3]
    assert column.offsets.tolist() == [0, 2, 2, 3]
    assert _rows(column) == [[('a', 1), ('b', 2)], [], [('a', 3)]]


def test_fixed_size_lists_are_dense_and_nested_lists_densify_when_lengths_agree():
    fixed = from_arrow(pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.int32(), 3)))
    assert isinstance(fixed, np.ndarray)
    assert fixed.shape == (2, 3)
    with_null_row = from_arrow(pa.array([[1, 2, 3], None], pa.list_(pa.int32(), 3)))
    assert isinstance(with_null_row, MaskedColumn)
    assert with_null_row.values.shape == (2, 3)
    with_null_element = from_arrow(pa.array([[1, None, 3]], pa.list_(pa.int32(), 3)))
    assert isinstance(with_null_element, ListColumn)
    assert isinstance(with_null_element.values, MaskedColumn)
    square = from_arrow(pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]]))
    assert densified(square).shape == (2, 2, 2)
    ragged = from_arrow(pa.array([[[1, 2]], [[5, 6], [7, 8]]]))
    assert densified(ragged) is ragged


def test_temporal_columns_keep_their_unit():
    assert from_arrow(pa.array([1], pa.timestamp('ms', tz='UTC'))).dtype == np.dtype('datetime64[ms]')
    assert from_arrow(pa.array([1], pa.date32())).dtype == np.dtype('datetime64[D]')
    assert from_arrow(pa.array([1], pa.date64())).dtype == np.dtype('datetime64[ms]')
    assert from_arrow(pa.array([1], pa.time32('s'))).dtype == np.dtype('timedelta64[s]')
    assert from_arrow(pa.array([1], pa.duration('ns'))).dtype == np.dtype('timedelta64[ns]')


def test_types_without_a_column_form_are_named():
    with pytest.raises(TypeError, match='month_day_nano_interval'):
        from_arrow(pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval()))
