"""Positions: what a reader has delivered, written as a small state, and the stage a restored reader continues from.

A :class:`Cursor` describes the result a reader is handing out (which scheduled item of which stage, and how many
of its rows reached the caller). :func:`cursor_stage` turns it into the :class:`~petastorm.plan.layout.Stage`
from which a reader delivers exactly the rows not delivered yet; :func:`position_state` writes that as a
:class:`~petastorm.plan.state.ReaderState`, :func:`check_state` refuses a state of other data or options, and
:func:`restored_stage` turns saved states (of one rank, or of every rank when the world size changed) back into
the stage this shard continues from. Rows read ahead by workers are never counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.plan.items import ScheduledItem
from petastorm.plan.layout import ShardLayout, Stage
from petastorm.plan.runs import Remainder, Run, encode_rows, merge_runs, remaining_runs, runs_length, share_size
from petastorm.plan.state import ReaderState

__all__ = [
    'Cursor',
    'check_state',
    'cursor_row_ids',
    'cursor_stage',
    'position_state',
    'restored_stage',
]

@dataclass(frozen=True)
class Cursor:
    """The result being handed out: ``units[index]`` of ``stage``, of which ``delivered`` rows reached the caller.

    Attributes:
        stage: the stage whose units are being read.
        units: the stage's scheduled items (see :meth:`ShardLayout.units`).
        main_from: index of the first unit that is not a pending row.
        index: the unit the result was read from.
        num_rows: rows of the result.
        positions: which rows of the unit's order the result holds, when filters dropped some (None: all).
        untracked: a transform changed the number of rows, so which input row each result row is is unknown.
        delivered: rows of the result the caller received.
    """

    stage: Stage
    units: Sequence[ScheduledItem]
    main_from: int
    index: int
    num_rows: int
    positions: np.ndarray | None = None
    untracked: bool = False
    delivered: int = 0

    @property
    def unit(self) -> ScheduledItem:
        """The scheduled item the result was read from."""
        return self.units[self.index]


def cursor_row_ids(cursor: Cursor) -> np.ndarray | None:
    """:func:`~petastorm.plan.runs.encode_rows` numbers of the rows of the result (None when a transform hid them)."""
    if cursor.untracked:
        return None
    unit = cursor.unit
    positions = unit.base_positions()
    if cursor.positions is not None:
        positions = positions[cursor.positions]
    return encode_rows(positions, unit.epoch)


def _taken(cursor: Cursor) -> int:
    """Rows of the unit's order passed: up to the last delivered row (rows a filter dropped count too)."""
    unit, delivered = cursor.unit, cursor.delivered
    if delivered >= cursor.num_rows:
        return unit.num_rows
    if delivered == 0:
        return 0
    if cursor.untracked:
        raise RuntimeError('cannot save the position of a reader in the middle of a row group whose '
                           'TransformSpec changed the number of rows: save it between items')
    if cursor.positions is not None:
        return int(cursor.positions[delivered - 1]) + 1
    return delivered


def cursor_stage(cursor: Cursor | None, start: Stage) -> Stage:
    """The stage from which a reader delivers exactly the rows not delivered yet.

    Args:
        cursor: the result being handed out, or None when nothing was handed out since ``start``.
        start: where the pass (or the restored pass) started.
    """
    if cursor is None:
        return start
    stage, units, index = cursor.stage, cursor.units, cursor.index
    taken = _taken(cursor)
    if index == len(units) - 1 and taken == units[index].num_rows:
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


def position_state(layout: ShardLayout, stage: Stage, pass_start: int, num_epochs: int | None) -> ReaderState:
    """The state of a reader of ``num_epochs`` epochs per pass at ``stage`` of the pass from ``pass_start``."""
    return ReaderState(seed=layout.seed, shard_mode=layout.shard_mode, remainder=layout.remainder,
                       shard_count=layout.shard_count, shard=layout.shard, shuffle_rows=layout.shuffle_rows,
                       shuffle_row_groups=layout.shuffle_row_groups, rows_per_epoch_total=layout.total_rows,
                       pass_start=pass_start, epoch=stage.epoch, runs=stage.runs, consumed=stage.consumed,
                       pending=stage.pending, table=layout.table_version, num_epochs=num_epochs)


def check_state(state: ReaderState, layout: ShardLayout, where: str, table_version_change: str = 'refuse') -> bool:
    """Refuse a state saved by a reader of other data or other options; the message names the difference.

    Args:
        state: the saved state.
        layout: this reader's layout.
        where: what is restoring, for messages.
        table_version_change: ``'refuse'`` a state saved on another version of the table, or accept it
            (``'restart_epoch'``: the caller then reads the saved epoch from its start).

    Returns:
        True when the state was saved on another version of the table (and that was accepted).

    Raises:
        ValueError: naming the option, count or table version that differs.
    """
    saved_table = state.table
    changed = saved_table != layout.table_version
    if changed and table_version_change == 'refuse':
        saved = 'plain Parquet' if saved_table is None else f'{saved_table[0]} table version {saved_table[1]}'
        now = 'plain Parquet' if layout.table_version is None else \
            f'{layout.table_version[0]} table version {layout.table_version[1]}'
        hint = f' (make the reader with table_version={saved_table[1]!r} to continue on the same rows)' \
            if saved_table is not None else ''
        raise ValueError(f'{where}: the state was saved reading {saved}, this reader reads {now}: its positions '
                         f"name other rows{hint}, or pass table_version_change='restart_epoch' to read the saved "
                         f'epoch again from its start on this version')
    expected: dict[str, Any] = {'shard_mode': layout.shard_mode, 'remainder': layout.remainder,
                                'shuffle_rows': layout.shuffle_rows, 'shuffle_row_groups': layout.shuffle_row_groups}
    if layout.shard_mode == 'rows' and not changed:
        expected['rows_per_epoch_total'] = layout.total_rows
    for key, value in expected.items():
        if getattr(state, key) != value:
            raise ValueError(f'{where}: the state was saved with {key}={getattr(state, key)!r}, this reader has '
                             f'{key}={value!r}; make the reader with the options and data of the saved one')
    return changed


def _check_one_step(states: Sequence[ReaderState]) -> None:
    """Refuse the states of every rank that are not one per rank, in rank order, at one step of training."""
    old_count = states[0].shard_count
    if len(states) != old_count or [s.shard for s in states] != list(range(old_count)):
        raise ValueError(f'load_state_dict got {len(states)} states; expected one per rank of the saved world '
                         f'({old_count}), in rank order')
    epochs = sorted({s.epoch for s in states})
    # A rank whose loader drew its whole share of an epoch may be saved at the start of the next one, holding
    # rows of the previous in its buffers; any other mix of epochs cannot be one step of synchronous training.
    ahead = [s for s in states if s.epoch > epochs[0]]
    if epochs[-1] > epochs[0] + 1 or any(s.consumed or s.runs is not None for s in ahead):
        raise ValueError(f'the ranks were saved in different epochs ({epochs}); save every rank at the same '
                         f'step')


def restored_stage(states: Sequence[ReaderState], layout: ShardLayout) -> Stage:
    """The stage this shard continues from, given the state of one rank or of every rank.

    Same world size: a shard continues its own stream exactly (its own state, or ``states[shard]``). Another
    world size (``'rows'`` mode only): the rows no rank delivered yet are split again into equal shares. With one
    state, every rank is assumed to have consumed as many rows as the saving one (true for synchronous
    data-parallel training with equal batch sizes) and to hold no buffered rows; pass every rank's state
    otherwise.

    Raises:
        ValueError: the states cannot describe one step of this world (wrong count, mixed epochs, another world
            size with ``'row_groups'``).
    """
    first = states[0]
    old_count = first.shard_count
    if len(states) > 1:
        _check_one_step(states)
    if old_count == layout.shard_count:
        mine = [s for s in states if s.shard == layout.shard]
        if mine:
            return mine[0].stage
    if layout.shard_mode != 'rows':
        raise ValueError(f"the state is of shard {first.shard} of {old_count} and this reader is shard "
                         f"{layout.shard} of {layout.shard_count}; with shard_mode='row_groups' a shard can only "
                         f"continue its own state (changing the world size needs shard_mode='rows')")
    if len(states) == 1 and old_count > 1 and first.pending:
        raise ValueError('the state holds rows buffered by a loader of its rank; with another world size or '
                         'rank, pass the states of every saved rank (a list) to load_state_dict')
    first = min(states, key=lambda s: s.epoch)
    stage = first.stage
    if all(s.consumed == 0 and s.runs is None for s in states) and any(s.pending for s in states):
        # Every rank took its whole share of the previous epoch and holds only buffered rows of it: those rows,
        # split again, are the rest of that epoch; the next one is read whole.
        held = merge_runs([run for s in states for run in s.pending])
        return Stage(min(run[0] for run in held), tuple(held))
    runs = stage.runs if stage.runs is not None else ((stage.epoch, 0, layout.total_rows),)
    remainder: Remainder = layout.remainder  # check_state made the saved one equal to it
    if len(states) == 1 and old_count > 1:
        progress: list[tuple[int, tuple[Run, ...]]] = [(first.consumed, ())] * old_count
    else:
        total = runs_length(runs)
        progress = [(s.consumed if s.epoch == stage.epoch else share_size(total, old_count, remainder, s.shard),
                     s.pending) for s in states]
    return Stage(stage.epoch, tuple(remaining_runs(runs, old_count, remainder, progress)))
