"""Pure planning: which rows each worker reads, for which shard, in which order, epoch after epoch.

Everything here is a deterministic function of (row groups, options, seed, epoch): no I/O, no threads. The
unit of work is a :class:`WorkItem`, a row range of one row group.

Sharding by row groups (the default) follows Petastorm's rule (row group ``i`` of the selected list goes to
shard ``i % shard_count``) when there are at least as many row groups as shards. With fewer row groups than
shards, the rows (in piece order) are split into ``shard_count`` contiguous, near-equal ranges, so every shard
still gets data.

Sharding by rows (``shard_mode='rows'``) works on the *global order* of an epoch: every selected item, in the
epoch's seeded order, each item's rows in their order (file order or the item's row permutation). Position
``p`` of that order is one row. A *run* ``(epoch, start, stop)`` names positions ``[start, stop)`` of the global
order of ``epoch``; a list of runs is a sequence of rows. Every shard takes the same number of consecutive
positions (:func:`rank_share`); the few left over are dropped or filled by repeating the first positions.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

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
    """A work item placed in an epoch; ``shuffle_seed`` seeds the in-item row shuffle.

    The rows of an item have an *order*: file order, or the permutation drawn from ``shuffle_seed`` when rows
    are shuffled. A scheduled item may stand for part of that order only: positions
    ``[order_range[0], order_range[1])`` of it, or the explicit positions ``order_picks``; ``item_base`` is the
    position of the item's first row in the epoch's global order (see :func:`epoch_positions`).
    """

    item: WorkItem
    epoch: int
    shuffle_seed: int
    order_range: tuple[int, int] | None = None
    order_picks: tuple[int, ...] | None = None
    item_base: int = 0

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


#: Positions ``[start, stop)`` of the global order of one epoch: ``(epoch, start, stop)``.
Run = tuple[int, int, int]
#: What happens to the rows left over when the global order does not split evenly across shards.
Remainder = Literal['drop_last', 'pad']
REMAINDER_POLICIES: tuple[str, ...] = ('drop_last', 'pad')


def epoch_order(items: Sequence[WorkItem], epoch: int, seed: int | None,
                shuffle_row_groups: bool) -> list[ScheduledItem]:
    """The items of one epoch in reading order, each with ``item_base``, its first position in the global order."""
    ordered = []
    base = 0
    for scheduled in epoch_schedule(items, epoch, seed, shuffle_row_groups):
        ordered.append(dataclasses.replace(scheduled, item_base=base))
        base += scheduled.item.num_rows
    return ordered


def runs_length(runs: Sequence[Run]) -> int:
    """Rows in a sequence of runs."""
    return sum(stop - start for _, start, stop in runs)


def merge_runs(runs: Sequence[Run]) -> list[Run]:
    """The same sequence with empty runs dropped and runs that continue each other joined."""
    merged: list[Run] = []
    for epoch, start, stop in runs:
        if start >= stop:
            continue
        if merged and merged[-1][0] == epoch and merged[-1][2] == start:
            merged[-1] = (epoch, merged[-1][1], stop)
        else:
            merged.append((epoch, start, stop))
    return merged


def _slice_once(runs: Sequence[Run], lo: int, hi: int) -> list[Run]:
    out = []
    offset = 0
    for epoch, start, stop in runs:
        length = stop - start
        a, b = max(lo, offset), min(hi, offset + length)
        if a < b:
            out.append((epoch, start + a - offset, start + b - offset))
        offset += length
        if offset >= hi:
            break
    return out


def slice_runs(runs: Sequence[Run], start: int, stop: int) -> list[Run]:
    """Rows ``[start, stop)`` of a sequence of runs; positions past its end wrap around to its beginning."""
    total = runs_length(runs)
    out: list[Run] = []
    position = start
    while total and position < stop:
        lap = (position // total) * total
        hi = min(stop - lap, total)
        out.extend(_slice_once(runs, position - lap, hi))
        position = lap + hi
    return merge_runs(out)


def share_size(total: int, shard_count: int, remainder: Remainder) -> int:
    """Rows every shard gets when ``total`` rows are split into equal shares."""
    return total // shard_count if remainder == 'drop_last' else -(-total // shard_count)


def remainder_rows(total: int, shard_count: int, remainder: Remainder) -> int:
    """Rows dropped (``'drop_last'``) or repeated (``'pad'``) to make the shares equal."""
    return abs(total - shard_count * share_size(total, shard_count, remainder))


def rank_share(runs: Sequence[Run], shard_count: int, shard: int, remainder: Remainder) -> list[Run]:
    """The rows of ``shard``: its equal, consecutive part of the sequence ``runs``.

    Shard ``k`` takes positions ``[k * q, (k + 1) * q)`` with ``q`` from :func:`share_size`. With
    ``'drop_last'`` the last ``total - shard_count * q`` rows go to nobody; with ``'pad'`` the last shard's part
    runs past the end and wraps around, repeating the first rows (fewer than ``shard_count`` of them).
    """
    quota = share_size(runs_length(runs), shard_count, remainder)
    return slice_runs(runs, shard * quota, (shard + 1) * quota)


def remaining_runs(runs: Sequence[Run], shard_count: int, remainder: Remainder,
                   progress: Sequence[tuple[int, Sequence[Run]]]) -> list[Run]:
    """The order of the rows not yet delivered when ``shard_count`` shards stopped in the middle of ``runs``.

    Args:
        runs: the sequence the shards were splitting.
        shard_count: how many shards split it.
        remainder: the remainder policy they used.
        progress: per shard, in shard order: ``(consumed, pending)``: the first ``consumed`` rows of its share
            were taken from the reader, and of those the rows ``pending`` were not delivered yet (they were in
            a loader's buffers).

    Returns:
        Each shard's pending rows then the rest of its share, shard after shard: a new sequence to split.
    """
    if len(progress) != shard_count:
        raise ValueError(f'progress has {len(progress)} entries; expected one per shard ({shard_count})')
    out: list[Run] = []
    for shard, (consumed, pending) in enumerate(progress):
        share = rank_share(runs, shard_count, shard, remainder)
        out.extend(pending)
        out.extend(slice_runs(share, consumed, runs_length(share)))
    return merge_runs(out)


def units_of_runs(runs: Sequence[Run], ordered: Callable[[int], Sequence[ScheduledItem]],
                  narrow: bool) -> list[ScheduledItem]:
    """The scheduled items that read the rows of ``runs``, in that order.

    Consecutive runs falling in the same item become one scheduled item (its ``order_range``, or its
    ``order_picks`` when they are not contiguous), so that scattered rows cost one read per item touched, not
    one per row: sort the runs first to group them by item.

    Args:
        runs: a sequence of rows.
        ordered: the :func:`epoch_order` of an epoch.
        narrow: rows are not shuffled, so a range of an item's order is a range of its rows: make it a smaller
            work item (fewer rows read) instead of an ``order_range``.
    """
    segments: list[tuple[ScheduledItem, int, int]] = []  # (item, first, last) positions of the item's order
    for epoch, start, stop in merge_runs(runs):
        items = ordered(epoch)
        bases = [s.item_base for s in items]
        index = max(bisect.bisect_right(bases, start) - 1, 0)
        while index < len(items) and items[index].item_base < stop:
            scheduled = items[index]
            lo = max(start, scheduled.item_base) - scheduled.item_base
            hi = min(stop, scheduled.item_base + scheduled.item.num_rows) - scheduled.item_base
            if lo < hi:
                segments.append((scheduled, lo, hi))
            index += 1
    units = []
    position = 0
    while position < len(segments):
        scheduled = segments[position][0]
        end = position
        while end + 1 < len(segments) and segments[end + 1][0] == scheduled:
            end += 1
        group = segments[position:end + 1]
        position = end + 1
        units.append(_unit(scheduled, group, narrow))
    return units


def _unit(scheduled: ScheduledItem, group: Sequence[tuple[ScheduledItem, int, int]], narrow: bool) -> ScheduledItem:
    contiguous = all(group[k][2] == group[k + 1][1] for k in range(len(group) - 1))
    if not contiguous:
        picks = tuple(p for _, lo, hi in group for p in range(lo, hi))
        return dataclasses.replace(scheduled, order_picks=picks)
    lo, hi = group[0][1], group[-1][2]
    if (lo, hi) == (0, scheduled.item.num_rows):
        return scheduled
    if narrow:
        item = scheduled.item
        return dataclasses.replace(scheduled, item=WorkItem(item.piece_index, item.row_start + lo, item.row_start + hi),
                                   item_base=scheduled.item_base + lo)
    return dataclasses.replace(scheduled, order_range=(lo, hi))
