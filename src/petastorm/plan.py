"""Pure planning: which rows each worker reads, for which shard, in which order, epoch after epoch.

Everything here is a deterministic function of (row groups, options, seed, epoch): no I/O, no threads. The
unit of work is a :class:`WorkItem`, a row range of one row group.

Sharding follows Petastorm's rule (row group ``i`` of the selected list goes to shard ``i % shard_count``) when
there are at least as many row groups as shards. With fewer row groups than shards, the rows (in piece order)
are split into ``shard_count`` contiguous, near-equal ranges, so every shard still gets data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from petastorm.errors import NoDataAvailableError

# Large prime mixed into per-epoch seeds so that (seed, epoch) streams never collide with user seeds.
_EPOCH_STREAM = 0x9E3779B1


@dataclass(frozen=True)
class WorkItem:
    """Rows ``[row_start, row_stop)`` of the row group at ``piece_index`` in the dataset's piece list."""

    piece_index: int
    row_start: int
    row_stop: int

    @property
    def num_rows(self) -> int:
        return self.row_stop - self.row_start


@dataclass(frozen=True)
class ScheduledItem:
    """A work item placed in an epoch; ``shuffle_seed`` seeds the in-item row shuffle."""

    item: WorkItem
    epoch: int
    shuffle_seed: int


def shard_items(piece_rows: Sequence[tuple[int, int]], cur_shard: int | None,
                shard_count: int | None) -> list[WorkItem]:
    """The work items of one shard.

    Args:
        piece_rows: ``(piece_index, num_rows)`` of the selected row groups, in piece order.
        cur_shard: this shard (None: no sharding).
        shard_count: number of shards.

    Raises:
        NoDataAvailableError: there are fewer rows than shards.
    """
    whole = [WorkItem(index, 0, rows) for index, rows in piece_rows if rows > 0]
    if shard_count is None or shard_count == 1:
        return whole
    assert cur_shard is not None
    if len(whole) >= shard_count:
        return [item for position, item in enumerate(whole) if position % shard_count == cur_shard]
    total = sum(item.num_rows for item in whole)
    if total < shard_count:
        raise NoDataAvailableError(f'Number of rows in the dataset ({total}, in {len(whole)} row groups) must be '
                                   f'greater or equal to the number of requested shards ({shard_count}).')
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


def epoch_rng(seed: int | None, epoch: int) -> np.random.Generator:
    """The random generator of one epoch: reproducible from ``seed``, fresh entropy when ``seed`` is None."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, epoch, _EPOCH_STREAM])


def epoch_schedule(items: Sequence[WorkItem], epoch: int, seed: int | None,
                   shuffle_row_groups: bool) -> list[ScheduledItem]:
    """The items of one epoch in reading order, each with the seed of its row shuffle."""
    rng = epoch_rng(seed, epoch)
    order = rng.permutation(len(items)) if shuffle_row_groups else np.arange(len(items))
    shuffle_seeds = rng.integers(0, 2**63 - 1, size=len(items))
    return [ScheduledItem(items[i], epoch, int(shuffle_seeds[i])) for i in order]


def schedule(items: Sequence[WorkItem], seed: int | None, shuffle_row_groups: bool, num_epochs: int | None,
             first_epoch: int = 0) -> Iterator[ScheduledItem]:
    """Every scheduled item of ``num_epochs`` epochs (forever when None), starting at ``first_epoch``."""
    epoch = first_epoch
    while num_epochs is None or epoch < first_epoch + num_epochs:
        yield from epoch_schedule(items, epoch, seed, shuffle_row_groups)
        epoch += 1
        if not items:
            return


def row_permutation(num_rows: int, shuffle_seed: int) -> np.ndarray:
    """The row order inside one work item when rows are shuffled."""
    return np.random.default_rng(shuffle_seed).permutation(num_rows)
