"""Runs: sequences of rows of the epochs' global orders, and how shards split them into equal shares.

Sharding by rows (``shard_mode='rows'``) works on the *global order* of an epoch (see
:func:`petastorm.plan.order.epoch_order`): position ``p`` of that order is one row. A *run*
``(epoch, start, stop)`` names positions ``[start, stop)`` of the global order of ``epoch``; a list of runs is a
sequence of rows. Every shard takes the same number of consecutive positions (:func:`rank_share`); the few left
over are dropped or filled by repeating the first positions, or (``'spread'``) the first shards take one more.
Runs are also how a saved position names the rows not delivered yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from petastorm.plan.items import ScheduledItem, WorkItem
from petastorm.plan.order import EpochOrder

__all__ = [
    'EPOCH_SPAN', 'REMAINDER_POLICIES', 'Remainder', 'Run', 'encode_rows', 'merge_runs', 'rank_share',
    'remainder_rows', 'remaining_runs', 'run_table_of_rows', 'runs_length', 'runs_of_rows', 'share_bounds',
    'share_size', 'slice_runs', 'units_of_runs',
]

#: Positions ``[start, stop)`` of the global order of one epoch: ``(epoch, start, stop)``.
Run = tuple[int, int, int]
#: What happens to the rows left over when the global order does not split evenly across shards.
Remainder = Literal['drop_last', 'pad', 'spread']
REMAINDER_POLICIES: tuple[str, ...] = ('drop_last', 'pad', 'spread')


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


def share_size(total: int, shard_count: int, remainder: Remainder, shard: int = 0) -> int:
    """Rows ``shard`` gets when ``total`` rows are split into shares (equal but with ``'spread'``)."""
    start, stop = share_bounds(total, shard_count, shard, remainder)
    return stop - start


def share_bounds(total: int, shard_count: int, shard: int, remainder: Remainder) -> tuple[int, int]:
    """The positions ``[start, stop)`` of ``shard``'s share (``stop`` past ``total`` wraps around, ``'pad'``)."""
    if remainder == 'spread':
        quota, left = divmod(total, shard_count)
        start = shard * quota + min(shard, left)
        return start, start + quota + int(shard < left)
    quota = total // shard_count if remainder == 'drop_last' else -(-total // shard_count)
    return shard * quota, (shard + 1) * quota


def remainder_rows(total: int, shard_count: int, remainder: Remainder) -> int:
    """Rows dropped (``'drop_last'``) or repeated (``'pad'``) to make the shares equal (0 with ``'spread'``)."""
    if remainder == 'spread':
        return 0
    return abs(total - shard_count * share_size(total, shard_count, remainder))


def rank_share(runs: Sequence[Run], shard_count: int, shard: int, remainder: Remainder) -> list[Run]:
    """The rows of ``shard``: its consecutive part of the sequence ``runs``.

    Shard ``k`` takes positions ``[k * q, (k + 1) * q)`` with ``q`` from :func:`share_size`. With
    ``'drop_last'`` the last ``total - shard_count * q`` rows go to nobody; with ``'pad'`` the last shard's part
    runs past the end and wraps around, repeating the first rows (fewer than ``shard_count`` of them); with
    ``'spread'`` the first ``total % shard_count`` shards take one row more, so every row goes to one shard.
    """
    start, stop = share_bounds(runs_length(runs), shard_count, shard, remainder)
    return slice_runs(runs, start, stop)


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


def units_of_runs(runs: Sequence[Run], ordered: Callable[[int], EpochOrder],
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
        index = max(int(np.searchsorted(items.bases, start, side='right')) - 1, 0)
        while index < len(items) and items.bases[index] < stop:
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


#: Rows of one epoch are numbered below this; ``epoch * EPOCH_SPAN + position`` names a row of any epoch.
EPOCH_SPAN = 1 << 40


def encode_rows(epoch_positions: np.ndarray, epoch: int) -> np.ndarray:
    """Positions of one epoch as numbers naming rows of any epoch (what loaders keep beside buffered rows)."""
    return epoch * EPOCH_SPAN + epoch_positions


def runs_of_rows(encoded: np.ndarray) -> list[Run]:
    """Sorted, merged runs of the rows named by :func:`encode_rows` numbers (repeats kept)."""
    return [tuple(run) for run in run_table_of_rows(encoded).tolist()]


def run_table_of_rows(encoded: np.ndarray) -> np.ndarray:
    """:func:`runs_of_rows` as an ``(n, 3)`` int64 array of ``(epoch, start, stop)`` rows (no Python loop)."""
    rows = np.asarray(encoded, dtype=np.int64).ravel()
    if not len(rows):
        return np.empty((0, 3), dtype=np.int64)
    first, position = int(rows[0]), int(rows[0]) % EPOCH_SPAN
    if position + len(rows) <= EPOCH_SPAN and np.array_equal(rows, np.arange(first, first + len(rows))):
        # The common case of a loader without a shuffling buffer: the tail of a row group, one run.
        return np.array([[first // EPOCH_SPAN, position, position + len(rows)]], dtype=np.int64)
    rows = np.sort(rows)
    epochs, positions = np.divmod(rows, EPOCH_SPAN)
    # A run goes on while the next row is the next position of the same epoch (a repeat starts a new run).
    breaks = np.flatnonzero((np.diff(positions) != 1) | (np.diff(epochs) != 0)) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(rows)]))
    return np.column_stack((epochs[starts], positions[starts], positions[stops - 1] + 1))
