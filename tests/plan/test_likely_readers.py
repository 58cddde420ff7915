"""The guess of which rank reads each file: exact where its supposition holds, balanced, a shard for every file."""

from __future__ import annotations

import numpy as np
import pytest

from petastorm.plan import ShardSpec, Stage, make_layout
from petastorm.plan.likely_readers import likely_readers
from petastorm.store.pieces import RowGroupPiece


def _files_read(rows: list[int], shard: ShardSpec, **layout) -> set[int]:
    """The files whose rows ``shard`` reads in epoch 0, from the layout every reader makes."""
    pieces = [RowGroupPiece(f'part-{i}.parquet', 0, count) for i, count in enumerate(rows)]
    units, _ = make_layout(pieces, range(len(pieces)), shard, shuffle_rows=False, **layout).units(Stage(0))
    return {unit.item.piece_index for unit in units}


@pytest.mark.parametrize('mode', ['rows', 'row_groups'])
@pytest.mark.parametrize('shuffle_row_groups', [True, False])
@pytest.mark.parametrize('remainder', ['spread', 'drop_last', 'pad'])
def test_files_of_one_row_group_go_to_the_rank_that_reads_them(mode, shuffle_row_groups, remainder):
    world, count = 8, 203
    rng = np.random.default_rng(5)
    rows = rng.integers(50, 150, size=count).tolist()
    sizes = [r * 37 for r in rows]  # bytes in proportion to rows, as the guess supposes
    guess = likely_readers(sizes, ShardSpec(0, world, mode, remainder), seed=11,
                           shuffle_row_groups=shuffle_row_groups, drop_partitions=1)
    assert guess.shape == (count,)
    assert set(guess.tolist()) == set(range(world))
    strays = 0
    for rank in range(world):
        read = _files_read(rows, ShardSpec(rank, world, mode, remainder), seed=11,
                           shuffle_row_groups=shuffle_row_groups, drop_partitions=1)
        strays += sum(1 for index in read if guess[index] != rank)
    # By rows, a file that a share begins in is also read by the rank before (and with 'pad' the last rank reads
    # the first rows again); the shares' bounds, counted in bytes, may also fall a row to either side.
    assert strays <= (world if mode == 'rows' else 0)


def test_the_footers_are_shared_evenly_when_files_are_split_by_drop_partitions():
    guess = likely_readers([4000] * 1000, ShardSpec(0, 8, 'rows', 'spread'), seed=1, shuffle_row_groups=True,
                           drop_partitions=3)
    shares = np.bincount(guess, minlength=8)
    assert shares.min() >= 90, shares
    assert shares.max() <= 160, shares


def test_unlisted_sizes_and_single_shards():
    assert likely_readers([10, None, 30], ShardSpec(0, 1), seed=None, shuffle_row_groups=True,
                          drop_partitions=1).tolist() == [0, 0, 0]
    guess = likely_readers([10, None, 30, 20], ShardSpec(1, 2, 'rows', 'spread'), seed=None, shuffle_row_groups=False,
                           drop_partitions=1)
    # The unlisted file is taken as the median's 20 bytes: the third file then begins at 30 of 80, in the first share.
    assert guess.tolist() == [0, 0, 0, 1]
    assert likely_readers([], ShardSpec(0, 4, 'rows'), seed=1, shuffle_row_groups=True, drop_partitions=1).size == 0
