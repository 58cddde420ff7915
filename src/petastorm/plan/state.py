"""A reader's saved position as a typed value: :class:`ReaderState`, and the states of every rank.

A reader's ``state_dict()`` is :meth:`ReaderState.to_dict`: plain ints, lists and strings that fit JSON and
``torch.save``, and that users keep in their checkpoints. That dict is a persisted format: its keys are the
field names of :class:`ReaderState` (written here only), its values never change meaning, and
:meth:`ReaderState.from_dict` reads every state written so far.

A distributed run restores from one state (every rank assumed at the same step) or from the list of the states
of every rank, in rank order: :func:`rank_states` reads either form, and :func:`every_rank` makes the list (the
one state of each rank, gathered), so that the meaning of that list is written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from petastorm.plan.layout import Stage
from petastorm.plan.runs import Run

__all__ = ['STATE_VERSION', 'ReaderState', 'every_rank', 'is_reader_state', 'rank_states']

#: The version every state is written with; a state of another version is refused.
STATE_VERSION = 1
# Fields that may be missing from a saved dict (their defaults apply); every other one must be there.
_OPTIONAL = frozenset({'shard_mode', 'remainder', 'shuffle_rows', 'shuffle_row_groups', 'rows_per_epoch_total',
                       'runs', 'pending', 'table', 'num_epochs'})


@dataclass(frozen=True, kw_only=True)
class ReaderState:
    """Where a reader of one shard is: the layout it reads, the pass, and the rows it has not delivered yet.

    The options a state was saved with are compared with the restoring reader's (the message names the one that
    differs); a field missing from an old dict is None there, and the comparison names it.

    Attributes:
        seed: the seed of the order (an unseeded reader adopts it).
        shard_mode: ``'row_groups'`` or ``'rows'``.
        remainder: the remainder policy of ``shard_mode='rows'``.
        shard_count: the shards of the saving run.
        shard: the saving reader's shard.
        shuffle_rows: the reader's ``shuffle_rows``.
        shuffle_row_groups: the reader's ``shuffle_row_groups``.
        rows_per_epoch_total: rows of an epoch's global order (before filters).
        pass_start: the first epoch of the pass being read.
        epoch: the epoch the reader continues in.
        runs: the sequence of rows the shards split that epoch (None: its whole global order).
        consumed: rows of this shard's share of the epoch already taken.
        pending: rows taken but not delivered (held by a loader): read first.
        table: ``(format, version)`` of the table version read (None for plain Parquet, and left out of the dict).
        num_epochs: the reader's ``num_epochs``.
    """

    seed: int
    shard_mode: str | None = None
    remainder: str | None = None
    shard_count: int
    shard: int
    shuffle_rows: bool | None = None
    shuffle_row_groups: bool | None = None
    rows_per_epoch_total: int | None = None
    pass_start: int
    epoch: int
    runs: tuple[Run, ...] | None = None
    consumed: int
    pending: tuple[Run, ...] = ()
    table: tuple[Any, ...] | None = None
    num_epochs: int | None = None

    @property
    def stage(self) -> Stage:
        """The stage the saving reader continues from."""
        return Stage(self.epoch, self.runs, self.consumed, self.pending)

    def to_dict(self) -> dict[str, Any]:
        """The state as a dict of plain values: ``version``, then every field (``table`` only for a table)."""
        out: dict[str, Any] = {'version': STATE_VERSION}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == 'table' and value is None:
                continue
            out[field.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, state: Any, where: str = 'load_state_dict') -> ReaderState:
        """Read a saved state (any written so far).

        Args:
            state: what :meth:`to_dict` returned (possibly after a round trip through JSON or ``torch.save``).
            where: what is restoring, for messages.

        Raises:
            ValueError: ``state`` is not a reader state of :data:`STATE_VERSION`.
        """
        if not is_reader_state(state):
            raise ValueError(f'{where}: not a reader state of version {STATE_VERSION}: {state!r:.200}')
        given = {field.name: state[field.name] for field in dataclasses.fields(cls) if field.name in state}
        runs, pending, table = given.get('runs'), given.get('pending'), given.get('table')
        return cls(**{**given, 'seed': int(given['seed']), 'shard_count': int(given['shard_count']),
                      'shard': int(given['shard']), 'pass_start': int(given['pass_start']),
                      'epoch': int(given['epoch']), 'consumed': int(given['consumed']),
                      'runs': None if runs is None else _runs(runs), 'pending': _runs(pending or ()),
                      'table': None if table is None else tuple(table)})


def is_reader_state(state: Any) -> bool:
    """Whether ``state`` is a dict of a reader's state of :data:`STATE_VERSION` (a mix's state is not)."""
    if not isinstance(state, dict) or state.get('version') != STATE_VERSION:
        return False
    return all(field.name in state for field in dataclasses.fields(ReaderState) if field.name not in _OPTIONAL)


def _runs(runs: Sequence[Sequence[int]]) -> tuple[Run, ...]:
    return tuple((int(run[0]), int(run[1]), int(run[2])) for run in runs)


def _plain(value: Any) -> Any:
    """Tuples of a state as lists (runs as lists of lists), the way they were always written."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def rank_states(state: Any, where: str = 'load_state_dict') -> tuple[ReaderState, ...]:
    """A saved state, or the list of every rank's (in rank order), as the states to restore from.

    Raises:
        ValueError: an empty list, or an element that is not a reader state (the message names its index).
    """
    states = list(state) if isinstance(state, (list, tuple)) else [state]
    if not states:
        raise ValueError(f'{where} got an empty list of states')
    return tuple(ReaderState.from_dict(one, f'{where} (state {index})') for index, one in enumerate(states))


def every_rank(state: Any, world_size: int, gather: Callable[[Any], list[Any]]) -> Any:
    """The states of every rank, in rank order, in place of this rank's own (a dict), when that is what it is.

    Only when ``state`` is a reader's state of a reader sharded over the whole world (one shard per rank, at
    least two ranks); otherwise ``state`` itself.

    Args:
        state: this rank's saved state (a reader's, a mix's...).
        world_size: the ranks of the run.
        gather: collects one object from every rank (``torch.distributed.all_gather_object``), in any order.
    """
    if world_size < 2 or not is_reader_state(state) or ReaderState.from_dict(state).shard_count != world_size:
        return state
    return sorted(gather(state), key=lambda one: ReaderState.from_dict(one).shard)
