"""Which shard will most likely read each data file in the first epoch, guessed from the store's listing alone.

The ranks of a job split between them the reading of the footers that planning needs
(:mod:`petastorm.reading.job_plan`). A rank that read a file's footer then reads the file's rows without another
request; any other rank pays one more (pyarrow takes no footer it is given). So each footer is best read by the
rank that will read the file's rows. That depends on the row groups, which only the footers tell, so it is
guessed: each file is taken to be one row group whose rows are in proportion to its listed bytes, as the many
small files of Spark, DuckDB or Ray are. The guess goes through the same layout every reader makes
(:func:`~petastorm.plan.items.layout_items`, :func:`~petastorm.plan.order.epoch_order`,
:func:`~petastorm.plan.runs.share_bounds`), so where the guess holds, every rank reads the rows of exactly the
files whose footers it read, but for the files its share begins or ends in. Where it does not hold (files of many
row groups, say), a rank reads some files' rows with one request more, as it would had another rank read every
footer; each footer is still read by one rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petastorm.plan.items import layout_items
from petastorm.plan.order import epoch_order
from petastorm.plan.runs import share_bounds
from petastorm.plan.shard import ShardSpec

__all__ = ['likely_readers']


def likely_readers(sizes: Sequence[int | None], shard: ShardSpec, *, seed: int | None, shuffle_row_groups: bool,
                   drop_partitions: int) -> np.ndarray:
    """For each file, in the store's order, the shard (``0 .. shard.count - 1``) likely to read its rows first.

    Args:
        sizes: each file's listed bytes (None: not listed; taken as the median of the others).
        shard: the shards' spec (its count, mode and remainder policy; which shard this is does not matter).
        seed: the readers' seed (with ``shard_mode='rows'`` and shuffled row groups it orders the files).
        shuffle_row_groups: whether the readers shuffle row groups.
        drop_partitions: the readers' ``shuffle_row_drop_partitions``.

    Returns:
        An int64 array of one shard per file.
    """
    count = len(sizes)
    if shard.mode != 'rows' or shard.count < 2 or count < 2:
        # Row groups go to the shards in turn (and one row group per file is the guess).
        return np.arange(count, dtype=np.int64) % max(shard.count, 1)
    rows = _guessed_rows(sizes)
    items = layout_items(np.arange(count, dtype=np.int64), rows, None, None, drop_partitions)
    order = epoch_order(items, 0, seed if seed is not None else 0, shuffle_row_groups)
    total = int(rows.sum())
    starts = np.array([share_bounds(total, shard.count, index, shard.remainder)[0] for index in range(shard.count)],
                      dtype=np.int64)
    # The shard whose share holds an item's first row reads it first; the rows past the last share are the last's.
    by_position = np.clip(np.searchsorted(starts, order.bases, side='right') - 1, 0, shard.count - 1)
    by_item = np.empty(len(items), dtype=np.int64)
    by_item[order.item_indexes] = by_position
    # A file split by drop partitions is several items (its parts, one after another), each read by whichever
    # shard: the file goes to the reader of one of them, taken in turn, so that the shards read equal shares of
    # the footers. Every file has an item, since it is guessed to have rows.
    files, first, parts = np.unique(items.piece_index, return_index=True, return_counts=True)
    return by_item[first + files % parts]


def _guessed_rows(sizes: Sequence[int | None]) -> np.ndarray:
    """A file's rows taken as its bytes (at least one); an unlisted size as the median of the listed ones."""
    listed = [size for size in sizes if size is not None]
    fallback = int(np.median(listed)) if listed else 1
    return np.maximum(np.array([fallback if size is None else size for size in sizes], dtype=np.int64), 1)
