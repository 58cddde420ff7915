"""The worker function on its own: one work item read, filtered, ordered and decoded into a ColumnBatch."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm.plan import ScheduledItem, WorkItem, row_permutation
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.worker import ReadContext, read_item
from petastorm.store.pieces import RowGroupPiece
from petastorm.unischema import UnischemaField


@pytest.fixture(scope='module')
def piece(tmp_path_factory):
    path = str(tmp_path_factory.mktemp('read') / 'part-0.parquet')
    pq.write_table(pa.table({'id': np.arange(20, dtype=np.int64), 'x': np.arange(20, dtype=np.float64) / 2}), path)
    return RowGroupPiece(path, 0, 20)


def _context(piece, fields, **settings):
    return ReadContext(filesystem=pafs.LocalFileSystem(), pieces=(piece,), fields=tuple(fields), **settings)


ID = UnischemaField('id', np.int64, (), None, False)


def test_a_filter_keeps_its_rows_and_says_where_they_were(piece):
    wanted = pc.is_in(pc.field('id'), pa.array([6, 9, 12, 30]))
    ctx = _context(piece, [ID], filter_expression=wanted, filter_columns=('id',))
    batch = read_item(ctx, ScheduledItem(WorkItem(0, 5, 15), 0, 0))
    assert isinstance(batch, ColumnBatch)
    assert batch.columns['id'].tolist() == [6, 9, 12]
    assert batch.num_rows == 3
    assert batch.positions.tolist() == [1, 4, 7]
    assert not batch.untracked
    assert batch.item == WorkItem(0, 5, 15)


def test_rows_come_in_the_units_order(piece):
    ctx = _context(piece, [ID], shuffle_rows=True)
    batch = read_item(ctx, ScheduledItem(WorkItem(0, 0, 20), 0, shuffle_seed=11, order_range=(2, 6)))
    assert batch.columns['id'].tolist() == row_permutation(20, 11)[2:6].tolist()


def test_a_read_without_columns_still_counts_the_rows_a_filter_keeps(piece):
    # Counting rows (Ray's count()) reads no field; rows kept by a filter must still be counted.
    ctx = _context(piece, [], filter_expression=pc.field('id') < 4, filter_columns=('id',))
    batch = read_item(ctx, ScheduledItem(WorkItem(0, 0, 20), 0, 0))
    assert batch.num_rows == 4
    assert batch.columns == {}
    shuffled = read_item(_context(piece, [], shuffle_rows=True), ScheduledItem(WorkItem(0, 0, 20), 0, 3))
    assert shuffled.num_rows == 20


def test_batches_carry_their_columns_for_the_process_pool(piece):
    batch = read_item(_context(piece, [ID]), ScheduledItem(WorkItem(0, 0, 4), 0, 0))
    moved = batch.with_carried_arrays({'id': batch.carried_arrays()['id'].copy()})
    assert moved.columns['id'].tolist() == [0, 1, 2, 3]
    assert (moved.num_rows, moved.item) == (4, batch.item)
