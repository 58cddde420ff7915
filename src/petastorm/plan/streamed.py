"""The first epoch of a shard made while its row groups are still being found, item by item.

A plain store without a ``_metadata`` summary learns its row groups from its files' footers, one request each.
When the order of an epoch does not depend on the number of row groups, the first items can be read before the
last footer is: :func:`streamed_first_epoch` makes the scheduled items of a fresh first epoch from the row groups
as they become known, in piece order, and they are exactly the items
:meth:`~petastorm.plan.layout.ShardLayout.units` gives for ``Stage(0)`` of the layout :func:`make_layout` makes
once every row group is known (a test holds the two equal). That holds when:

* row groups are not shuffled (a permutation of every row group needs their number);
* shards split row groups, not rows (equal shares of rows need the total), by position among the non-empty row
  groups (``position % shard_count == shard``, known in order); the first ``shard_count`` non-empty row groups are
  awaited first, since with fewer than that a store's rows are split by range instead;
* each item's row-shuffle seed is the next draw of the epoch's generator: the draws of a generator come out the
  same whether they are made at once or a few at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from petastorm.plan.items import ScheduledItem, WorkItem, shard_items, split_drop_partitions, split_head
from petastorm.plan.order import epoch_rng
from petastorm.plan.shard import ShardSpec

__all__ = ['streamed_first_epoch']

#: row-shuffle seeds drawn at a time.
_SEED_CHUNK = 1024


def streamed_first_epoch(piece_rows: Iterable[tuple[int, int]], shard: ShardSpec, *, seed: int,
                         drop_partitions: int, head_rows: int = 0) -> Iterator[ScheduledItem]:
    """The scheduled items of epoch 0 of a layout that keeps row groups in order, as the row groups come.

    Args:
        piece_rows: ``(piece_index, num_rows)`` of every selected row group, in piece order, as they are known
            (the iteration may wait for each).
        shard: this reader's shard (its mode ``'row_groups'``, or one shard).
        seed: the layout's seed.
        drop_partitions: ``shuffle_row_drop_partitions``.
        head_rows: as :meth:`~petastorm.plan.layout.ShardLayout.units`: the first item is read as two when it has
            more than twice as many rows.

    Raises:
        ValueError: ``shard`` splits rows.
        NoDataAvailableError: fewer rows than shards (raised when the items are taken).
    """
    if shard.mode == 'rows' and shard.sharded:
        raise ValueError("a first epoch whose shards split rows (shard_mode='rows') needs every row group first")
    rng = epoch_rng(seed, 0)
    seeds: list[int] = []
    base = 0
    first = True
    for item in _shard_items(piece_rows, shard, drop_partitions):
        if not seeds:
            seeds = rng.integers(0, 2**63 - 1, size=_SEED_CHUNK).tolist()[::-1]
        scheduled = ScheduledItem(item, 0, seeds.pop(), item_base=base)
        base += item.num_rows
        if first and head_rows > 0 and scheduled.num_rows > 2 * head_rows:
            yield from split_head(scheduled, head_rows)
        else:
            yield scheduled
        first = False


def _shard_items(piece_rows: Iterable[tuple[int, int]], shard: ShardSpec, drop_partitions: int
                 ) -> Iterator[WorkItem]:
    """This shard's work items as :func:`~petastorm.plan.items.shard_items` makes them, in order, lazily."""
    cur_shard, shard_count = shard.row_group_shard
    whole = (WorkItem(index, 0, rows) for index, rows in piece_rows if rows > 0)
    items: Iterable[WorkItem] = whole
    if cur_shard is not None and shard_count is not None and shard_count > 1:
        head = list(itertools.islice(whole, shard_count))
        if len(head) < shard_count:  # every row group is known: a few rows split by range
            items = shard_items([(item.piece_index, item.num_rows) for item in head], cur_shard, shard_count)
        else:
            items = (item for position, item in enumerate(itertools.chain(head, whole))
                     if position % shard_count == cur_shard)
    for item in items:
        yield from split_drop_partitions([item], drop_partitions)
