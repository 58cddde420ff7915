"""Where one reader is: the pass it reads, the result being handed out, and the state a new reader resumes from.

:class:`ReaderPosition` is the bookkeeping of :class:`~petastorm.reading.passes.ReaderPasses` (which holds the lock
around every call): the stages of the current pass and their scheduled items in reading order, each tagged
(:data:`UnitTag`) so that the result read from it registers as the cursor when it is handed out; the rows and
items a pass delivers (what ``len()`` counts); the saved state and a restore. A fresh first pass of a plan still
being made as its footers arrive reads its first epoch as it is planned (:mod:`petastorm.reading.streamed_plan`).
The rules themselves are the pure functions of :mod:`petastorm.plan`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from petastorm.plan import (
    Cursor,
    ReaderState,
    RowMatches,
    ScheduledItem,
    ShardLayout,
    Stage,
    check_state,
    cursor_row_ids,
    cursor_stage,
    kept_rows,
    pass_stages,
    position_state,
    restored_stage,
)
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.streamed_plan import StreamedPlan

__all__ = ['ReaderPosition', 'UnitTag']

#: What each submitted unit is: its stage, the stage's units, the index of the first non-pending unit, its index.
UnitTag = tuple[Stage, Sequence[ScheduledItem], int, int]


class ReaderPosition:
    """The position of one reader (not thread-safe: :class:`ReaderPasses` holds its lock around every call).

    Args:
        layout: the shard's layout of epochs (None: ``streamed`` makes it, when first asked for).
        num_epochs: epochs per pass (None: forever).
        streamed: the plan being made as the store's footers come: a fresh first pass reads the first epoch's
            items as they are known (:mod:`petastorm.reading.streamed_plan`), the same items in the same order.
    """

    def __init__(self, layout: ShardLayout | None, num_epochs: int | None, *,
                 streamed: StreamedPlan | None = None) -> None:
        if layout is None and streamed is None:
            raise ValueError('a ReaderPosition needs a layout, or the streamed plan that makes it')
        self._layout = layout
        self._streamed = streamed
        self._num_epochs = num_epochs
        self._next_epoch = 0
        self._first = Stage(0)
        self._pass_start = 0
        self._cursor: Cursor | None = None
        self._delivered = 0
        self.started = False
        #: rows the consumer needs first: the first item of a pass is read in two when it has more than twice as
        #: many (0: never; see :meth:`petastorm.plan.ShardLayout.units`).
        self.head_rows = 0
        self.new_pass()

    @property
    def layout(self) -> ShardLayout:
        """The shard's layout (its seed is the saved one after :meth:`restore`); waits for a streamed plan."""
        if self._layout is None:
            assert self._streamed is not None
            self._layout = self._streamed.planned().layout
        return self._layout

    def new_pass(self, stage: Stage | None = None, pass_start: int | None = None) -> None:
        """The next reading is a pass of ``num_epochs`` epochs from ``pass_start`` (default: after the last pass)."""
        pass_start = self._next_epoch if pass_start is None else pass_start
        self._first = Stage(pass_start) if stage is None else stage
        self._pass_start = pass_start
        self._next_epoch = pass_start + (self._num_epochs or 0)
        self._cursor = None
        self.started = False

    def stages(self) -> Iterator[Stage]:
        """The stages of the current pass."""
        return pass_stages(self.layout, self._first, self._pass_start, self._num_epochs)

    def _stage_units(self, stages: Iterator[Stage], head_rows: int | None = None
                     ) -> Iterator[tuple[Stage, list[ScheduledItem], int]]:
        """``(stage, its scheduled items, index of the first that is not pending)`` of a pass's stages."""
        head_rows = self.head_rows if head_rows is None else head_rows
        for stage in stages:
            scheduled, main_from = self.layout.units(stage, head_rows)
            head_rows = 0  # only the pass's first item: later ones are read while earlier ones are consumed
            yield stage, scheduled, main_from

    def _streams_first_stage(self) -> bool:
        """A fresh first pass while the plan is still being made: its first epoch is read as it is planned."""
        return self._streamed is not None and self._layout is None and self._first == Stage(0) \
            and self._pass_start == 0

    def units(self, tags: deque[UnitTag]) -> Iterator[ScheduledItem]:
        """Every scheduled item of the pass, in reading order; each one's tag is appended to ``tags`` first."""
        head_rows = None
        if self._streams_first_stage():
            assert self._streamed is not None
            stage, streamed = self._first, self._streamed.first_stage(self.head_rows)
            for index, unit in enumerate(streamed.stream()):
                tags.append((stage, streamed, 0, index))
                yield unit
            if streamed.stopped:
                return  # the reader was stopped while the footers were read
            rest: Iterator[Stage] = itertools.islice(self.stages(), 1, None)  # the epochs after it: planned whole
            head_rows = 0
        else:
            rest = self.stages()
        for stage, scheduled, main_from in self._stage_units(rest, head_rows):
            units = tuple(scheduled)
            for index, unit in enumerate(units):
                tags.append((stage, units, main_from, index))
                yield unit

    def begin(self, tag: UnitTag, batch: ColumnBatch) -> None:
        """The result ``batch`` of the unit tagged ``tag`` is being handed out; nothing of it delivered yet."""
        stage, units, main_from, index = tag
        self._cursor = Cursor(stage, units, main_from, index, batch.num_rows, batch.positions, batch.untracked)
        self._delivered = 0

    def delivered(self, rows: int | None = None) -> None:
        """``rows`` more rows of the current result reached the caller (None: all of them)."""
        # Called once per row by make_reader's iteration: a counter, not a new cursor.
        assert self._cursor is not None, 'delivered() before begin()'
        self._delivered = self._cursor.num_rows if rows is None else self._delivered + rows

    def row_ids(self) -> np.ndarray | None:
        """Numbers naming the rows of the current result across epochs (None when a transform hid them)."""
        assert self._cursor is not None, 'row_ids() before begin()'
        return cursor_row_ids(self._cursor)

    def rows_this_pass(self, matches: RowMatches | None = None, whole: bool = False) -> int:
        """Rows the pass delivers from where it starts (walks the stages).

        Args:
            matches: the rows each row group keeps through the filters (None: before filters).
            whole: count the pass from the start of its first epoch, even when it was restored in the middle.
        """
        shuffle_rows = self.layout.shuffle_rows
        return sum(kept_rows(unit, shuffle_rows, matches) for unit in self._units(whole))

    def units_this_pass(self, matches: RowMatches | None = None) -> int:
        """Scheduled items (batches of a batch reader) the pass delivers: those with a row through ``matches``."""
        if matches is None:
            return sum(len(scheduled) for _, scheduled, _ in self._stage_units(self.stages()))
        shuffle_rows = self.layout.shuffle_rows
        return sum(1 for unit in self._units(False) if kept_rows(unit, shuffle_rows, matches))

    def _units(self, whole: bool) -> Iterator[ScheduledItem]:
        stages = pass_stages(self.layout, Stage(self._pass_start), self._pass_start, self._num_epochs) if whole \
            else self.stages()
        for _, scheduled, _ in self._stage_units(stages):
            yield from scheduled

    @property
    def restarted(self) -> bool:
        """True when the current pass does not start at the beginning of its first epoch."""
        return self._first != Stage(self._pass_start)

    def state(self) -> ReaderState:
        """The state from which a new reader delivers exactly the rows not delivered yet."""
        return self.state_later()()

    def state_later(self) -> Callable[[], ReaderState]:
        """:meth:`state` as of now, made when called.

        What it needs is captured (the cursor is replaced, never changed, as results are handed out); its work,
        and the wait for a streamed plan's layout, are left to the call.
        """
        first, pass_start, num_epochs = self._first, self._pass_start, self._num_epochs
        cursor = None if self._cursor is None else (self._cursor, self._delivered)

        def made() -> ReaderState:
            current = None if cursor is None else dataclasses.replace(cursor[0], delivered=cursor[1])
            return position_state(self.layout, cursor_stage(current, first), pass_start, num_epochs)

        return made

    def restore(self, states: Sequence[ReaderState], seed: int | None, table_version_change: str = 'refuse') -> None:
        """Continue from saved states (one, or every rank's), checked against this layout; before reading.

        Args:
            states: the saved states.
            seed: the seed the reader was made with (None: unseeded, it adopts the saved one).
            table_version_change: ``'refuse'`` states saved on another version of the table, or
                ``'restart_epoch'``: read the saved epoch from its start on this reader's version.

        Raises:
            ValueError: a state does not match this reader's layout and options.
            RuntimeError: reading has started.
        """
        changed = [check_state(one, self.layout, f'load_state_dict (state {index})', table_version_change)
                   for index, one in enumerate(states)]
        if seed is not None and states[0].seed != seed:
            raise ValueError(f'the state was saved with seed={states[0].seed}, this reader has seed={seed}')
        if self.started:
            raise RuntimeError('load_state_dict() must be called before reading from the reader')
        # An unseeded reader adopts the saved order.
        self._layout = self.layout.with_seed(states[0].seed)
        if any(changed):  # positions of another table version name other rows: the saved epoch starts again
            self.new_pass(Stage(min(s.epoch for s in states)), states[0].pass_start)
            return
        self.new_pass(restored_stage(states, self._layout), states[0].pass_start)
