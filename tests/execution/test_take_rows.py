"""petastorm.shuffle.take_rows and ramps: shuffled rows of an Arrow table, and positions of packed token rows.

Whatever the path (the kernel's ranges, pyarrow's take for the other columns, numpy-only installs), the table is
the one pyarrow's ``take`` gives: same values, same types, same nulls.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.shuffle import ramps, take_rows


def _ragged(rng, rows, value_type, large=False, empty_every=5):
    lengths = rng.integers(0, 40, rows)
    lengths[::empty_every] = 0
    values = pa.array(rng.integers(0, 120, int(lengths.sum())), type=pa.int64()).cast(value_type)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    if large:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _table(rng, rows):
    return pa.table({
        'ids': _ragged(rng, rows, pa.int32()),
        'weights': _ragged(rng, rows, pa.float64(), large=True),
        'small': _ragged(rng, rows, pa.uint8()),
        'label': pa.array(rng.integers(0, 9, rows)),
        'name': pa.array([f'row{i}' for i in range(rows)]),
        'nested': pa.array([[[i], [i, i]] for i in range(rows)]),
    })


@pytest.mark.parametrize('kernel', ['on', 'off'])
@pytest.mark.parametrize('rows', [0, 1, 7, 300])
def test_take_rows_is_pyarrows_take(monkeypatch, kernel, rows):
    monkeypatch.setenv('PETASTORM_NO_COMPILED_SHUFFLE', '1' if kernel == 'off' else '0')
    rng = np.random.default_rng(rows)
    table = _table(rng, rows)
    for order in (rng.permutation(rows), rng.integers(0, max(rows, 1), rows) if rows else np.arange(0)):
        taken = take_rows(table, order)
        assert taken.schema == table.schema
        assert taken.equals(table.take(pa.array(order, pa.int64())))


def test_sliced_columns_and_sliced_values_are_gathered_from_their_own_rows(monkeypatch):
    monkeypatch.delenv('PETASTORM_NO_COMPILED_SHUFFLE', raising=False)
    rng = np.random.default_rng(1)
    base = _ragged(rng, 50, pa.int16())
    shifted_values = pa.ListArray.from_arrays(pa.array([0, 2, 5, 9], pa.int32()), pa.array(np.arange(20))[3:])
    for array in (base.slice(13, 20), shifted_values):
        table = pa.table({'x': array})
        order = rng.permutation(len(array))
        assert take_rows(table, order).equals(table.take(pa.array(order)))


def test_lists_with_nulls_keep_their_nulls(monkeypatch):
    monkeypatch.delenv('PETASTORM_NO_COMPILED_SHUFFLE', raising=False)
    table = pa.table({'x': pa.array([[1, 2], None, [3], [None, 4]], pa.list_(pa.int32()))})
    order = np.array([3, 1, 0, 2])
    assert take_rows(table, order).to_pydict() == {'x': [[None, 4], None, [1, 2], [3]]}


def test_an_index_out_of_range_is_refused(monkeypatch):
    monkeypatch.delenv('PETASTORM_NO_COMPILED_SHUFFLE', raising=False)
    table = pa.table({'x': pa.array([[1], [2, 3]], pa.list_(pa.int32()))})
    with pytest.raises(IndexError, match='out of bounds'):
        take_rows(table, np.array([0, 2]))


def test_a_reader_shuffling_rows_of_token_lists_delivers_each_row_once(tmp_path):
    rng = np.random.default_rng(3)
    rows = 400
    ids = _ragged(rng, rows, pa.int32())
    pq.write_table(pa.table({'row': np.arange(rows), 'ids': ids}), str(tmp_path / 'part.parquet'),
                   row_group_size=100)
    expected = ids.to_pylist()
    with make_batch_reader(tmp_path.as_uri(), shuffle_rows=True, seed=5, reader_pool_type='dummy',
                           num_epochs=1) as reader:
        got = {}
        orders = []
        for batch in reader:
            orders.extend(int(r) for r in batch.row)
            got.update({int(r): [int(v) for v in cell] for r, cell in zip(batch.row, batch.ids, strict=True)})
    assert sorted(orders) == list(range(rows))  # each row once
    assert orders != list(range(rows))  # shuffled
    assert got == {r: expected[r] for r in range(rows)}


@pytest.mark.parametrize('kernel', ['on', 'off'])
def test_ramps_count_up_from_every_start(monkeypatch, kernel):
    monkeypatch.setenv('PETASTORM_NO_COMPILED_SHUFFLE', '1' if kernel == 'off' else '0')
    rng = np.random.default_rng(7)
    for size in (1, 5, 1000):
        starts = np.unique(np.concatenate(([0], rng.integers(0, size, size // 3))))
        out = np.full((size,), -5, dtype=np.int64)
        ramps(out, starts)
        expected = np.arange(size) - starts[np.searchsorted(starts, np.arange(size), side='right') - 1]
        assert out.tolist() == expected.tolist()
    block = np.empty((2, 4), dtype=np.int64)
    assert ramps(block, np.array([0, 3, 5], dtype=np.int64)).tolist() == [[0, 1, 2, 0], [1, 0, 1, 2]]
