"""The first epoch made as row groups are found equals the one planned from every row group (issue 45)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm.errors import NoDataAvailableError
from petastorm.plan import ShardSpec, Stage, make_layout, streamed_first_epoch
from petastorm.store.pieces import RowGroupPiece


def _pieces(rows):
    return [RowGroupPiece(f'/d/part-{i:03d}.parquet', 0, n, ()) for i, n in enumerate(rows)]


def _planned(rows, shard, seed, drop, shuffle_rows, head_rows):
    pieces = _pieces(rows)
    layout = make_layout(pieces, list(range(len(pieces))), shard, seed=seed, shuffle_row_groups=False,
                         shuffle_rows=shuffle_rows, drop_partitions=drop)
    return layout.units(Stage(0), head_rows)[0]


def _streamed(rows, shard, seed, drop, head_rows, taken=None):
    def piece_rows():
        for index, n in enumerate(rows):
            if taken is not None:
                taken.append(index)
            yield index, n

    return streamed_first_epoch(piece_rows(), shard, seed=seed, drop_partitions=drop, head_rows=head_rows)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.integers(0, 40), max_size=30), count=st.integers(1, 5), data=st.data(),
       seed=st.integers(0, 2**40), drop=st.integers(1, 3), shuffle_rows=st.booleans(),
       head_rows=st.integers(0, 12))
def test_streamed_first_epoch_is_the_planned_one(rows, count, data, seed, drop, shuffle_rows, head_rows):
    shard = ShardSpec(data.draw(st.integers(0, count - 1)), count)
    try:
        planned = _planned(rows, shard, seed, drop, shuffle_rows, head_rows)
    except NoDataAvailableError:
        with pytest.raises(NoDataAvailableError):
            list(_streamed(rows, shard, seed, drop, head_rows))
        return
    assert list(_streamed(rows, shard, seed, drop, head_rows)) == planned


def test_the_first_items_need_only_the_first_row_groups():
    taken: list[int] = []
    units = _streamed([10] * 1000, ShardSpec(1, 4), 7, 1, 0, taken)
    first = next(units)
    assert (first.item.piece_index, first.item_base) == (1, 0)
    assert len(taken) == 4  # the first shard_count row groups decide how shards split
    next(units)
    assert len(taken) == 6


def test_shards_splitting_rows_refuse_to_stream():
    with pytest.raises(ValueError, match='shard_mode'):
        next(streamed_first_epoch(iter([(0, 5)]), ShardSpec(0, 2, mode='rows'), seed=0, drop_partitions=1))
