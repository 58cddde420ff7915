"""The epochs of one shard: :class:`ShardLayout` turns a plan's items into the scheduled items of every epoch.

A :class:`Stage` says where an epoch of a shard starts (a fresh epoch, or the rest of one after a restore); the
layout turns a stage into the scheduled items to read, in either shard mode, and :func:`pass_stages` lists the
stages of a pass of ``num_epochs`` epochs. All of it is plain immutable data and pure functions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from petastorm.plan.items import ScheduledItem, WorkItem, WorkItems, split_head
from petastorm.plan.order import EpochOrder, epoch_order
from petastorm.plan.runs import (
    Remainder,
    Run,
    rank_share,
    remainder_rows,
    runs_length,
    share_size,
    slice_runs,
    units_of_runs,
)
from petastorm.plan.shard import ShardMode

__all__ = ['ShardLayout', 'Stage', 'pass_stages']


@dataclass(frozen=True)
class Stage:
    """Where an epoch of one shard starts.

    Attributes:
        epoch: the epoch.
        runs: the sequence of rows the shards split this epoch (None: the epoch's whole global order).
        consumed: rows of this shard's share already taken.
        pending: rows taken but not delivered (they were in a loader's buffers): read them first.
    """

    epoch: int
    runs: tuple[Run, ...] | None = None
    consumed: int = 0
    pending: tuple[Run, ...] = ()


@dataclass(frozen=True)
class ShardLayout:
    """The items a shard reads and how every epoch of it is scheduled.

    In ``'rows'`` mode ``items`` are all selected items and the shards split their global order into equal
    shares; in ``'row_groups'`` mode ``items`` are this shard's items (Petastorm's sharding) and its share is
    all of their order.
    """

    items: Sequence[WorkItem]  # WorkItems when made by make_layout
    seed: int
    shuffle_row_groups: bool
    shuffle_rows: bool
    shard_mode: ShardMode
    shard_count: int
    shard: int
    remainder: Remainder
    #: ``(format, version)`` of the table version read (None for plain Parquet): positions are of its rows.
    table_version: tuple[str, int | None] | None = None

    @functools.cached_property
    def total_rows(self) -> int:
        """Rows of an epoch's global order (before filters); computed once (every saved position names it)."""
        if isinstance(self.items, WorkItems):
            return int(self.items.num_rows.sum())
        return sum(item.num_rows for item in self.items)

    @property
    def splits(self) -> tuple[int, int]:
        """``(shares, this share)`` into which the global order is split."""
        return (self.shard_count, self.shard) if self.shard_mode == 'rows' else (1, 0)

    @property
    def rows_per_epoch(self) -> int:
        """Rows this shard reads in a fresh epoch (before filters)."""
        return share_size(self.total_rows, self.splits[0], self.remainder, self.splits[1])

    @property
    def remainder_rows(self) -> int:
        """Rows dropped or repeated per epoch to make the shares equal (0 in ``'row_groups'`` mode)."""
        return remainder_rows(self.total_rows, self.splits[0], self.remainder)

    def with_seed(self, seed: int) -> ShardLayout:
        """The same layout ordered by another seed (a restored reader adopts the saved one)."""
        return dataclasses.replace(self, seed=seed)

    def ordered(self, epoch: int) -> EpochOrder:
        """The :func:`~petastorm.plan.order.epoch_order` of an epoch."""
        return epoch_order(self.items, epoch, self.seed, self.shuffle_row_groups)

    def share(self, stage: Stage) -> list[Run]:
        """This shard's share of the stage's sequence."""
        runs = stage.runs if stage.runs is not None else [(stage.epoch, 0, self.total_rows)]
        count, shard = self.splits
        return rank_share(runs, count, shard, self.remainder)

    def units(self, stage: Stage, head_rows: int = 0) -> tuple[list[ScheduledItem], int]:
        """The scheduled items of the stage's epoch and the index of the first that is not a pending row.

        ``head_rows``: when the first item has more than twice as many rows, it is read as two (its first
        ``head_rows`` rows, then the rest; see :func:`~petastorm.plan.items.split_head`), so that a consumer
        needing that many rows first does not wait for a whole row group to be decoded.
        """
        ordered = functools.cache(self.ordered)  # runs of one epoch look up its order many times
        pending = units_of_runs(sorted(stage.pending), ordered, narrow=not self.shuffle_rows)
        share = self.share(stage)
        rest = slice_runs(share, stage.consumed, runs_length(share))
        units = pending + units_of_runs(rest, ordered, narrow=not self.shuffle_rows)
        main_from = len(pending)
        if head_rows > 0 and units and units[0].num_rows > 2 * head_rows:
            units[0:1] = split_head(units[0], head_rows)
            main_from += 1 if main_from else 0  # a split pending item is two pending items
        return units, main_from


def pass_stages(layout: ShardLayout, first: Stage, pass_start: int, num_epochs: int | None) -> Iterator[Stage]:
    """The stages a pass of ``num_epochs`` epochs starting at ``first`` reads, in order (forever when None).

    Reading and counting (``len()`` of a reader) both walk these, so the count always equals what is delivered,
    resumed passes included.
    """
    end = None if num_epochs is None else pass_start + num_epochs
    epoch = first.epoch
    if end is not None and epoch >= end and first.pending:
        # Saved after the last epoch of the pass while a loader still held rows of it: only those remain.
        yield Stage(epoch, (), 0, first.pending)
    while end is None or epoch < end:
        yield first if epoch == first.epoch else Stage(epoch)
        epoch += 1
        if not layout.items:
            return  # nothing to read: stop instead of walking endless empty epochs
