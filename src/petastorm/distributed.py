"""Distributed reading: who this process is (rank, world size), equal shares per rank, and resumable positions.

* :func:`detect_rank_and_world_size` reads the rank and world size from ``torch.distributed`` (when it is
  initialized) or from the environment variables of the usual launchers.
* :class:`ShardLayout` turns a reader's plan into the scheduled items of each epoch for this shard, from a
  :class:`Stage` (where the epoch starts), in either shard mode.
* :class:`StreamPosition` follows what the reader has delivered to its caller and writes it as a small state;
  :func:`restored_stage` turns saved states (of one rank, or of every rank when the world size changed) back into
  the :class:`Stage` this shard continues from.

Nothing here reads data or starts threads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from petastorm.plan import (
    Remainder,
    Run,
    ScheduledItem,
    WorkItem,
    epoch_order,
    merge_runs,
    rank_share,
    remaining_runs,
    runs_length,
    share_size,
    slice_runs,
    units_of_runs,
)

AUTO = 'auto'
SHARD_MODES = ('row_groups', 'rows')
STATE_VERSION = 1
#: Rows of one epoch are numbered below this; ``epoch * _EPOCH_SPAN + position`` names a row of any epoch.
_EPOCH_SPAN = 1 << 40

#: (rank variable, world size variable) of the launchers we know, most specific first.
RANK_ENVIRONMENT = (
    ('RANK', 'WORLD_SIZE'),  # torchrun, torch.distributed.launch
    ('HOROVOD_RANK', 'HOROVOD_SIZE'),  # horovodrun
    ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),  # Open MPI
    ('PMI_RANK', 'PMI_SIZE'),  # MPICH, Intel MPI
    ('SLURM_PROCID', 'SLURM_NTASKS'),  # srun
)


def detect_rank_and_world_size(environ: Any = None) -> tuple[int, int, str]:
    """This process's rank and the world size, and where they were found.

    ``torch.distributed`` wins when it is imported and initialized (torch is never imported here for this);
    otherwise the first pair of :data:`RANK_ENVIRONMENT` variables that is set.

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        ``(rank, world_size, source)``; source is ``'torch.distributed'`` or the rank variable's name.

    Raises:
        ValueError: nothing was found, or the values are not integers with ``0 <= rank < world_size``.
    """
    distributed = sys.modules.get('torch.distributed')
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank()), int(distributed.get_world_size()), 'torch.distributed'
    environ = os.environ if environ is None else environ
    for rank_name, size_name in RANK_ENVIRONMENT:
        if rank_name in environ and size_name in environ:
            try:
                rank, size = int(environ[rank_name]), int(environ[size_name])
            except ValueError as err:
                raise ValueError(f'{rank_name}={environ[rank_name]!r} and {size_name}={environ[size_name]!r} must '
                                 f'be integers') from err
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f'{rank_name}={rank} and {size_name}={size} do not name a rank of the world: '
                                 f'expected 0 <= {rank_name} < {size_name}')
            return rank, size, rank_name
    names = ', '.join(f'{r}/{s}' for r, s in RANK_ENVIRONMENT)
    raise ValueError(f"cur_shard='auto' needs torch.distributed initialized (init_process_group) or one of the "
                     f'environment variable pairs {names}; none was found. Pass cur_shard and shard_count '
                     f'explicitly instead.')


def resolve_shard(cur_shard: Any, shard_count: Any) -> tuple[Any, Any, str | None]:
    """Replace ``'auto'`` in ``cur_shard``/``shard_count`` with the detected rank/world size.

    Returns:
        ``(cur_shard, shard_count, source)``; source is None when nothing was detected.
    """
    if cur_shard != AUTO and shard_count != AUTO:
        return cur_shard, shard_count, None
    rank, size, source = detect_rank_and_world_size()
    if cur_shard == AUTO:
        if shard_count not in (None, AUTO) and shard_count != size:
            raise ValueError(f"cur_shard='auto' found world size {size} (from {source}) but shard_count="
                             f"{shard_count!r}; pass shard_count='auto' or None")
        return rank, size, source
    return cur_shard, size, source


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


@dataclass
class ShardLayout:
    """The items a shard reads and how every epoch of it is scheduled (see :mod:`petastorm.plan`).

    In ``'rows'`` mode ``items`` are all selected items and the shards split their global order into equal
    shares; in ``'row_groups'`` mode ``items`` are this shard's items (Petastorm's sharding) and its share is
    all of their order.
    """

    items: tuple[WorkItem, ...]
    seed: int
    shuffle_row_groups: bool
    shuffle_rows: bool
    shard_mode: str
    shard_count: int
    shard: int
    remainder: Remainder
    _orders: dict[int, list[ScheduledItem]] = field(default_factory=dict, repr=False)

    @property
    def total_rows(self) -> int:
        """Rows of an epoch's global order (before filters)."""
        return sum(item.num_rows for item in self.items)

    @property
    def splits(self) -> tuple[int, int]:
        """``(shares, this share)`` into which the global order is split."""
        return (self.shard_count, self.shard) if self.shard_mode == 'rows' else (1, 0)

    @property
    def rows_per_epoch(self) -> int:
        """Rows this shard reads in a fresh epoch (before filters)."""
        return share_size(self.total_rows, self.splits[0], self.remainder)

    @property
    def remainder_rows(self) -> int:
        """Rows dropped or repeated per epoch to make the shares equal (0 in ``'row_groups'`` mode)."""
        return abs(self.total_rows - self.splits[0] * self.rows_per_epoch)

    def ordered(self, epoch: int) -> list[ScheduledItem]:
        """The :func:`~petastorm.plan.epoch_order` of an epoch (the last few are kept)."""
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) > 4:
                self._orders.pop(next(iter(self._orders)))
            order = self._orders[epoch] = epoch_order(self.items, epoch, self.seed, self.shuffle_row_groups)
        return order

    def reset_orders(self) -> None:
        """Forget the kept epoch orders (after the seed changed)."""
        self._orders.clear()

    def share(self, stage: Stage) -> list[Run]:
        """This shard's share of the stage's sequence."""
        runs = stage.runs if stage.runs is not None else [(stage.epoch, 0, self.total_rows)]
        count, shard = self.splits
        return rank_share(runs, count, shard, self.remainder)

    def units(self, stage: Stage) -> tuple[list[ScheduledItem], int]:
        """The scheduled items of the stage's epoch and the index of the first that is not a pending row."""
        pending = units_of_runs(sorted(stage.pending), self.ordered, narrow=not self.shuffle_rows)
        share = self.share(stage)
        rest = slice_runs(share, stage.consumed, runs_length(share))
        return pending + units_of_runs(rest, self.ordered, narrow=not self.shuffle_rows), len(pending)


def encode_rows(epoch_positions: np.ndarray, epoch: int) -> np.ndarray:
    """Positions of one epoch as numbers naming rows of any epoch (what loaders keep beside buffered rows)."""
    return epoch * _EPOCH_SPAN + epoch_positions


def runs_of_rows(encoded: np.ndarray) -> list[Run]:
    """Sorted, merged runs of the rows named by :func:`encode_rows` numbers (repeats kept)."""
    rows = np.sort(np.asarray(encoded, dtype=np.int64))
    return merge_runs([(int(r // _EPOCH_SPAN), int(r % _EPOCH_SPAN), int(r % _EPOCH_SPAN) + 1) for r in rows])


@dataclass
class _Cursor:
    stage: Stage
    units: list[ScheduledItem]
    main_from: int
    index: int
    meta: dict[str, Any]
    delivered: int = 0


class StreamPosition:
    """What a reader has delivered to its caller, written as a small, restorable state.

    The reader reports each result it starts handing out (:meth:`begin`) and the rows of it the caller received
    (:meth:`delivered`); rows read ahead by workers are never counted.
    """

    def __init__(self, layout: ShardLayout, stage: Stage, pass_start: int) -> None:
        self._layout = layout
        self._start = stage
        self._pass_start = pass_start
        self._cursor: _Cursor | None = None

    def restart(self, stage: Stage, pass_start: int) -> None:
        """A new pass (or a restored one) starts at ``stage``."""
        self._start, self._pass_start, self._cursor = stage, pass_start, None

    def begin(self, stage: Stage, units: list[ScheduledItem], main_from: int, index: int,
              meta: dict[str, Any]) -> None:
        """The result of ``units[index]`` of ``stage`` is being handed out; nothing of it delivered yet."""
        self._cursor = _Cursor(stage, units, main_from, index, meta)

    def delivered(self, rows: int | None = None) -> None:
        """``rows`` more rows of the current result reached the caller (None: all of them)."""
        cursor = self._cursor
        assert cursor is not None
        cursor.delivered = cursor.meta['num_rows'] if rows is None else cursor.delivered + rows

    def current_rows(self) -> np.ndarray | None:
        """:func:`encode_rows` numbers of the rows of the current result (None when a transform hid them)."""
        cursor = self._cursor
        assert cursor is not None
        meta, unit = cursor.meta, cursor.units[cursor.index]
        if meta.get('untracked'):
            return None
        positions = unit.base_positions()
        if 'positions' in meta:
            positions = positions[meta['positions']]
        return encode_rows(positions, unit.epoch)

    def stage(self) -> Stage:
        """The stage from which a reader delivers exactly the rows this one has not delivered yet."""
        cursor = self._cursor
        if cursor is None:
            return self._start
        stage, units, index = cursor.stage, cursor.units, cursor.index
        unit = units[index]
        taken = self._taken(cursor, unit)
        if index == len(units) - 1 and taken == unit.num_rows:
            return Stage(stage.epoch + 1)
        pending: list[Run] = []
        consumed = stage.consumed
        for k, other in enumerate(units):
            done = other.num_rows if k < index else (taken if k == index else 0)
            if k < cursor.main_from:
                positions = other.base_positions()[done:]
                pending.extend((other.epoch, int(p), int(p) + 1) for p in positions)
            else:
                consumed += done
        return Stage(stage.epoch, stage.runs, consumed, tuple(merge_runs(sorted(pending))))

    @staticmethod
    def _taken(cursor: _Cursor, unit: ScheduledItem) -> int:
        """Rows of the unit's order passed: up to the last delivered row (rows a filter dropped count too)."""
        meta, delivered = cursor.meta, cursor.delivered
        if delivered >= meta.get('num_rows', 0):
            return unit.num_rows
        if delivered == 0:
            return 0
        if meta.get('untracked'):
            raise RuntimeError('cannot save the position of a reader in the middle of a row group whose '
                               'TransformSpec changed the number of rows: save it between items')
        if 'positions' in meta:
            return int(meta['positions'][delivered - 1]) + 1
        return delivered

    def state(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The state dict: plain ints, lists and strings (fits JSON, ``torch.save`` and checkpoints)."""
        layout, stage = self._layout, self.stage()
        return {
            'version': STATE_VERSION, 'seed': layout.seed, 'shard_mode': layout.shard_mode,
            'remainder': layout.remainder, 'shard_count': layout.shard_count, 'shard': layout.shard,
            'shuffle_rows': layout.shuffle_rows, 'shuffle_row_groups': layout.shuffle_row_groups,
            'rows_per_epoch_total': layout.total_rows, 'pass_start': self._pass_start, 'epoch': stage.epoch,
            'runs': None if stage.runs is None else [list(r) for r in stage.runs], 'consumed': stage.consumed,
            'pending': [list(r) for r in stage.pending], **extra}


def _stage_of(state: dict[str, Any]) -> Stage:
    runs = state.get('runs')
    return Stage(int(state['epoch']), None if runs is None else tuple(tuple(r) for r in runs),
                 int(state['consumed']), tuple(tuple(r) for r in state.get('pending', ())))


def check_state(state: Any, layout: ShardLayout, where: str) -> None:
    """Refuse a state saved by a reader of other data or other options; the message names the difference."""
    if not isinstance(state, dict) or state.get('version') != STATE_VERSION:
        raise ValueError(f'{where}: not a reader state of version {STATE_VERSION}: {state!r:.200}')
    expected = {'shard_mode': layout.shard_mode, 'remainder': layout.remainder,
                'shuffle_rows': layout.shuffle_rows, 'shuffle_row_groups': layout.shuffle_row_groups}
    if layout.shard_mode == 'rows':
        expected['rows_per_epoch_total'] = layout.total_rows
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(f'{where}: the state was saved with {key}={state.get(key)!r}, this reader has '
                             f'{key}={value!r}; make the reader with the options and data of the saved one')


def restored_stage(states: Sequence[dict[str, Any]], layout: ShardLayout) -> Stage:
    """The stage this shard continues from, given the state of one rank or of every rank.

    Same world size: a shard continues its own stream exactly (its own state, or ``states[shard]``). Another
    world size (``'rows'`` mode only): the rows no rank delivered yet are split again into equal shares. With one
    state, every rank is assumed to have consumed as many rows as the saving one (true for synchronous
    data-parallel training with equal batch sizes) and to hold no buffered rows; pass every rank's state
    otherwise.
    """
    first = states[0]
    old_count = int(first['shard_count'])
    if len(states) > 1:
        if len(states) != old_count or [int(s['shard']) for s in states] != list(range(old_count)):
            raise ValueError(f'load_state_dict got {len(states)} states; expected one per rank of the saved world '
                             f'({old_count}), in rank order')
        epochs = sorted({int(s['epoch']) for s in states})
        # A rank whose loader drew its whole share of an epoch may be saved at the start of the next one, holding
        # rows of the previous in its buffers; any other mix of epochs cannot be one step of synchronous training.
        ahead = [s for s in states if int(s['epoch']) > epochs[0]]
        if epochs[-1] > epochs[0] + 1 or any(int(s['consumed']) or s.get('runs') is not None for s in ahead):
            raise ValueError(f'the ranks were saved in different epochs ({epochs}); save every rank at the same '
                             f'step')
    if old_count == layout.shard_count:
        mine = [s for s in states if int(s['shard']) == layout.shard]
        if mine:
            return _stage_of(mine[0])
    if layout.shard_mode != 'rows':
        raise ValueError(f"the state is of shard {first['shard']} of {old_count} and this reader is shard "
                         f"{layout.shard} of {layout.shard_count}; with shard_mode='row_groups' a shard can only "
                         f"continue its own state (changing the world size needs shard_mode='rows')")
    if len(states) == 1 and first.get('pending'):
        raise ValueError('the state holds rows buffered by a loader of its rank; with another world size or '
                         'rank, pass the states of every saved rank (a list) to load_state_dict')
    first = min(states, key=lambda s: int(s['epoch']))
    stage = _stage_of(first)
    runs = stage.runs if stage.runs is not None else [(stage.epoch, 0, layout.total_rows)]
    remainder: Remainder = first['remainder']
    if len(states) == 1:
        progress: list[tuple[int, tuple[Run, ...]]] = [(int(first['consumed']), ())] * old_count
    else:
        quota = share_size(runs_length(runs), old_count, remainder)
        progress = [(int(s['consumed']) if int(s['epoch']) == stage.epoch else quota,
                     tuple(tuple(r) for r in s.get('pending', ()))) for s in states]
    return Stage(stage.epoch, tuple(remaining_runs(runs, old_count, remainder, progress)))
