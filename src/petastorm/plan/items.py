"""Work items: the row ranges of row groups that workers read, and how a dataset's row groups become them.

A :class:`WorkItem` is a row range of one row group; a :class:`ScheduledItem` is a work item placed in an epoch
(with the seed of its row shuffle, and possibly standing for only part of its rows' order). :func:`split_head`
makes one scheduled item two: its first rows, which a consumer gets without waiting for the rest, then the rest.
A layout holds its work items as :class:`WorkItems`, three arrays: a shard by rows holds every row group of the
store (a million of them: 24 MB, where as many objects took 89 MB), and makes a :class:`WorkItem` when asked.

Sharding by row groups (the default) follows Petastorm's rule (row group ``i`` of the selected list goes to
shard ``i % shard_count``) when there are at least as many row groups as shards. With fewer row groups than
shards, the rows (in piece order) are split into ``shard_count`` contiguous, near-equal ranges, so every shard
still gets data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from petastorm.errors import NoDataAvailableError

__all__ = ['ScheduledItem', 'WorkItem', 'WorkItems', 'layout_items', 'shard_items', 'split_drop_partitions',
           'split_head']


@dataclass(frozen=True, slots=True)  # a million of them lay out 100,000 files
class WorkItem:
    """Rows ``[row_start, row_stop)`` of the row group at ``piece_index`` in the dataset's piece list."""

    piece_index: int
    row_start: int
    row_stop: int

    @property
    def num_rows(self) -> int:
        """Rows of the range."""
        return self.row_stop - self.row_start


class WorkItems(Sequence[WorkItem]):
    """Work items held as three int64 arrays (one number of each a row group), each made when asked.

    Args:
        piece_index: each item's row group, by its index in the dataset's piece list.
        row_start: each item's first row in its row group.
        row_stop: each item's row after its last.
    """

    def __init__(self, piece_index: np.ndarray, row_start: np.ndarray, row_stop: np.ndarray) -> None:
        self.piece_index = piece_index
        self.row_start = row_start
        self.row_stop = row_stop

    @classmethod
    def of(cls, items: Iterable[WorkItem]) -> WorkItems:
        """``items`` as arrays."""
        listed = list(items)
        return cls(*(np.fromiter((getattr(item, name) for item in listed), dtype=np.int64, count=len(listed))
                     for name in ('piece_index', 'row_start', 'row_stop')))

    @property
    def num_rows(self) -> np.ndarray:
        """Rows of each item."""
        return self.row_stop - self.row_start

    def __len__(self) -> int:
        return len(self.piece_index)

    @overload
    def __getitem__(self, index: int) -> WorkItem: ...

    @overload
    def __getitem__(self, index: slice) -> WorkItems: ...

    def __getitem__(self, index: int | slice) -> WorkItem | WorkItems:
        if isinstance(index, slice):
            return WorkItems(self.piece_index[index], self.row_start[index], self.row_stop[index])
        return WorkItem(int(self.piece_index[index]), int(self.row_start[index]), int(self.row_stop[index]))

    def __iter__(self) -> Iterator[WorkItem]:
        for index in range(len(self)):
            yield self[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WorkItems):
            return all(np.array_equal(getattr(self, name), getattr(other, name))
                       for name in ('piece_index', 'row_start', 'row_stop'))
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f'WorkItems({len(self)} items)'


def layout_items(piece_index: np.ndarray, rows: np.ndarray, cur_shard: int | None, shard_count: int | None,
                 drop_partitions: int) -> WorkItems:
    """What :func:`shard_items` then :func:`split_drop_partitions` make, as :class:`WorkItems`, in arrays throughout.

    Args:
        piece_index: the selected row groups' indexes in the piece list, in piece order.
        rows: their rows.
        cur_shard: this shard (None: no sharding by row groups).
        shard_count: number of shards.
        drop_partitions: parts each item is split into.

    Raises:
        NoDataAvailableError: there are fewer rows than shards.
    """
    kept = rows > 0
    piece_index, rows = piece_index[kept], rows[kept]
    if shard_count is not None and shard_count > 1 and cur_shard is not None:
        if len(piece_index) < shard_count:  # a few row groups: split by rows (shard_items' rule)
            few = shard_items(zip(piece_index.tolist(), rows.tolist(), strict=True), cur_shard, shard_count)
            return WorkItems.of(split_drop_partitions(few, drop_partitions))
        # copies: a strided view would keep every row group's arrays alive
        piece_index, rows = piece_index[cur_shard::shard_count].copy(), rows[cur_shard::shard_count].copy()
    if drop_partitions <= 1:
        return WorkItems(piece_index, np.zeros(len(piece_index), dtype=np.int64), rows)
    # Item after item, each one's parts in order, the empty ones dropped (as split_drop_partitions does).
    parts = np.tile(np.arange(drop_partitions, dtype=np.int64), len(piece_index))
    repeated = np.repeat(rows, drop_partitions)
    starts, stops = parts * repeated // drop_partitions, (parts + 1) * repeated // drop_partitions
    nonempty = starts < stops
    return WorkItems(np.repeat(piece_index, drop_partitions)[nonempty], starts[nonempty], stops[nonempty])


@dataclass(frozen=True)
class ScheduledItem:
    """A work item placed in an epoch; ``shuffle_seed`` seeds the in-item row shuffle.

    The rows of an item have an *order*: file order, or the permutation drawn from ``shuffle_seed`` when rows
    are shuffled. A scheduled item may stand for part of that order only: positions
    ``[order_range[0], order_range[1])`` of it, or the explicit positions ``order_picks``; ``item_base`` is the
    position of the item's first row in the epoch's global order (see :func:`petastorm.plan.order.epoch_order`).
    """

    item: WorkItem
    epoch: int
    shuffle_seed: int
    order_range: tuple[int, int] | None = None
    order_picks: tuple[int, ...] | None = None
    item_base: int = 0
    #: scheduled items of this epoch that read the same row group one after another (a work item split by
    #: :func:`split_head`): a thread pool reads its columns once for all of them.
    row_group_readers: int = 1

    @property
    def num_rows(self) -> int:
        """Rows this scheduled item stands for (before any filter)."""
        if self.order_picks is not None:
            return len(self.order_picks)
        if self.order_range is not None:
            return self.order_range[1] - self.order_range[0]
        return self.item.num_rows

    def base_positions(self) -> np.ndarray:
        """Global positions (in the epoch's order) of the rows this scheduled item stands for, in its order."""
        if self.order_picks is not None:
            return self.item_base + np.asarray(self.order_picks, dtype=np.int64)
        start, stop = self.order_range if self.order_range is not None else (0, self.item.num_rows)
        return np.arange(self.item_base + start, self.item_base + stop, dtype=np.int64)


def split_head(scheduled: ScheduledItem, rows: int) -> tuple[ScheduledItem, ScheduledItem]:
    """``scheduled`` as two scheduled items: the first ``rows`` rows of its order, then the others.

    Together they stand for the same rows in the same order (the same global positions), so a reader that reads
    the two delivers exactly what it delivers reading ``scheduled``; the first part is decoded alone, and comes
    without waiting for the whole row group to be decoded. Both read the same row group
    (``row_group_readers=2``).

    Raises:
        ValueError: ``rows`` is not between 1 and the item's rows (exclusive).
    """
    if not 0 < rows < scheduled.num_rows:
        raise ValueError(f'a head of {rows} rows does not split a scheduled item of {scheduled.num_rows} rows')
    readers = scheduled.row_group_readers + 1
    if scheduled.order_picks is not None:
        picks = scheduled.order_picks
        return (dataclasses.replace(scheduled, order_picks=picks[:rows], row_group_readers=readers),
                dataclasses.replace(scheduled, order_picks=picks[rows:], row_group_readers=readers))
    start, stop = scheduled.order_range if scheduled.order_range is not None else (0, scheduled.item.num_rows)
    return (dataclasses.replace(scheduled, order_range=(start, start + rows), row_group_readers=readers),
            dataclasses.replace(scheduled, order_range=(start + rows, stop), row_group_readers=readers))


def shard_items(piece_rows: Iterable[tuple[int, int]], cur_shard: int | None,
                shard_count: int | None) -> list[WorkItem]:
    """The work items of one shard.

    Args:
        piece_rows: ``(piece_index, num_rows)`` of the selected row groups, in piece order.
        cur_shard: this shard (None: no sharding).
        shard_count: number of shards.

    Returns:
        The shard's items, in piece order.

    Raises:
        NoDataAvailableError: there are fewer rows than shards.
    """
    whole = [WorkItem(index, 0, rows) for index, rows in piece_rows if rows > 0]
    if shard_count is None or shard_count == 1 or cur_shard is None:
        return whole
    if len(whole) >= shard_count:
        return [item for position, item in enumerate(whole) if position % shard_count == cur_shard]
    total = sum(item.num_rows for item in whole)
    if total < shard_count:
        # Starts with Petastorm's wording (code may match it); our rule splits row groups, so rows are what count.
        raise NoDataAvailableError(f'Number of row-groups in the dataset ({len(whole)}) is smaller than the number '
                                   f'of requested shards ({shard_count}), and so is its number of rows ({total}), '
                                   f'which are split between the shards in that case: some shards would be empty. '
                                   f'Use at most {total} shards.')
    start, stop = cur_shard * total // shard_count, (cur_shard + 1) * total // shard_count
    return _global_range(whole, start, stop)


def _global_range(items: Sequence[WorkItem], start: int, stop: int) -> list[WorkItem]:
    """Work items covering global rows ``[start, stop)`` of the concatenation of ``items``."""
    result = []
    offset = 0
    for item in items:
        lo, hi = max(start, offset), min(stop, offset + item.num_rows)
        if lo < hi:
            result.append(WorkItem(item.piece_index, item.row_start + lo - offset, item.row_start + hi - offset))
        offset += item.num_rows
    return result


def split_drop_partitions(items: Sequence[WorkItem], partitions: int) -> list[WorkItem]:
    """Split each item into ``partitions`` contiguous, disjoint row ranges (empty ones dropped).

    Each part is read separately, so consecutive rows of a row group end up in different places of an epoch.
    """
    if partitions <= 1:
        return list(items)
    result = []
    for item in items:
        n = item.num_rows
        for k in range(partitions):
            lo, hi = item.row_start + k * n // partitions, item.row_start + (k + 1) * n // partitions
            if lo < hi:
                result.append(WorkItem(item.piece_index, lo, hi))
    return result
