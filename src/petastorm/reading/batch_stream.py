"""Passes of batches cut from a column source: the iteration, length and position rules every loader shares.

The torch loaders, the JAX loader, the torchdata node and the Grain dataset all hand out batches of a reader's
rows and are driven by trainers that call ``iter()`` once per epoch, stop an epoch after ``len()`` batches or
earlier, and save a position mid-epoch. :class:`BatchStream` holds those rules once, without any framework:

* **A new** ``iter()`` **starts over** (as torch's ``DataLoader`` does): the pass of a reader with ``num_epochs``
  set begins again with the reader's next ``num_epochs`` epochs, whether the last pass ran to its end, was left
  with ``break``, stopped by a trainer after ``len()`` batches or interrupted (``KeyboardInterrupt``). An
  iterator that was superseded raises ``RuntimeError`` if it is used again. A reader with ``num_epochs=None``
  has one endless pass, so a new ``iter()`` continues it where the last iterator stopped (rows held in the
  buffers included): nothing is lost or repeated. An ``iter()`` whose predecessor delivered nothing takes over
  its pass unchanged (a trainer that calls ``iter()`` twice before the first batch loses no restored position).
* **A pass ends** when its last row was delivered, also when the caller never asks for the end: a trainer that
  takes ``len()`` batches and moves on has finished the pass, and a position saved then is a position between
  passes.
* **The length** is the number of batches of a whole pass (also after a restore, as trainers count the batches of
  an epoch from its start).
* **The position** (:meth:`BatchStream.state_dict`) is the source's, with the rows waiting in the buffers counted
  as not delivered, so that a restored stream delivers exactly the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np

from petastorm.reading.source import ColumnSource, PositionSource, check_no_ngram, positions_of
from petastorm.shuffle import ArrayOps, Batcher, NumpyOps, ShufflingBuffer, Table, num_rows

__all__ = ['ROW_IDS', 'BatchStream', 'check_capacity']

logger = logging.getLogger(__name__)

#: A hidden column kept beside buffered rows: the source's number for each row (-1: unknown), so that a state can
#: name the rows taken from the source but not yet delivered in a batch.
ROW_IDS = '.row_ids'
# Mixed into shuffling seeds so that the loader's random stream differs from the reader's own streams.
_LOADER_STREAM = 0x5EED_10AD

_SUPERSEDED = ('this iterator of the {name} was superseded by a newer iter() of the same loader, which started '
               'another pass; iterate the newest iterator (one loader serves one iteration at a time)')


def check_capacity(shuffling_queue_capacity: Any) -> int:
    """A loader's ``shuffling_queue_capacity``, checked: an integer >= 0.

    Raises:
        ValueError: naming the value given.
    """
    if isinstance(shuffling_queue_capacity, bool) or not isinstance(shuffling_queue_capacity, (int, np.integer)) \
            or shuffling_queue_capacity < 0:
        raise ValueError(f'shuffling_queue_capacity must be an integer >= 0, got {shuffling_queue_capacity!r}')
    return int(shuffling_queue_capacity)


def _identity(table: Table) -> Table:
    return table


def _columns(table: Table, as_tuple: bool) -> Table:
    return {name: values for name, values in table.items() if name != ROW_IDS}


class _Pass:
    """One pass being served: its generator of ``(rows, batch)``, and what it delivered so far.

    ``expected_rows`` is asked when first needed, not when the pass starts: a reader whose plan is made as its
    footers arrive knows the rows of a pass only once every footer is read, and its first batch does not wait.
    """

    def __init__(self, batches: Generator[tuple[int, Any], None, None],
                 expected_rows: Callable[[], int | None]) -> None:
        self.batches = batches
        self._expected_rows = expected_rows
        self._expected: tuple[int | None] | None = None
        self.rows = 0
        self.batches_delivered = 0
        self.broken = False  # an interrupt went through its generator: its buffers cannot be trusted

    @property
    def expected_rows(self) -> int | None:
        """Rows the pass delivers in all, when known in advance (asked once)."""
        if self._expected is None:
            self._expected = (self._expected_rows(),)
        return self._expected[0]

    @property
    def complete(self) -> bool:
        """Its last row was delivered (the end may not have been asked for)."""
        if not self.batches_delivered:
            return False
        expected = self.expected_rows
        return expected is not None and self.rows >= expected


class BatchStream:
    """Batches of ``batch_size`` rows of a column source, pass after pass, with an exact position.

    Args:
        source: the column source (see :func:`petastorm.reading.source.as_column_source`); the stream owns its passes.
        batch_size: rows per batch (the last batch of a pass may be smaller).
        shuffling_queue_capacity: 0 keeps the source's order; otherwise rows are drawn at random from a buffer
            holding at least this many rows (minus one), seeded from the source's ``seed`` and the pass.
        ops: the array operations of the buffered columns (numpy arrays by default).
        prepare: turns each batch of columns from the source (``{name: array}``) into the buffered table.
        finish: turns a table of ``batch_size`` rows (and whether rows are tuples) into what is handed out.
        packed: let the shuffling buffer keep numeric numpy columns as packed records.
        drop_last: leave out the last batch of a pass when it has fewer than ``batch_size`` rows.
        name: how errors call the consumer, as the user made it (``'BatchedDataLoader'``).
    """

    def __init__(self, source: ColumnSource, batch_size: int, shuffling_queue_capacity: int = 0, *,
                 ops: ArrayOps | None = None, prepare: Callable[[Table], Table] | None = None,
                 finish: Callable[[Table, bool], Any] | None = None, packed: bool = False,
                 drop_last: bool = False, name: str = 'loader') -> None:
        check_no_ngram(name, source)
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self._ops = ops if ops is not None else NumpyOps()
        self._prepare = prepare if prepare is not None else _identity
        self._finish = finish if finish is not None else _columns
        self._packed = packed
        self._name = name
        self._pass: _Pass | None = None
        self._buffers: tuple[Batcher, ShufflingBuffer | None] | None = None
        self._token = 0  # the iterator allowed to draw from the pass (older ones were superseded)
        self._error: BaseException | None = None
        self._passes_done = 0
        self._needs_new_pass = False  # the last pass was abandoned or completed: the source must start another
        self._restored = False  # load_state_dict was called: the next pass continues the saved one

    # -- what trainers ask --------------------------------------------------------------------------------------

    @property
    def passes_done(self) -> int:
        """Passes finished or abandoned so far."""
        return self._passes_done

    @property
    def in_progress(self) -> bool:
        """A pass has delivered rows and has rows left."""
        return self._pass is not None and self._pass.batches_delivered > 0 and not self._pass.complete

    @property
    def error(self) -> BaseException | None:
        """The error a pass failed with (no further pass starts), or None."""
        return self._error

    @property
    def rows_per_pass(self) -> int | None:
        """Rows of a whole pass, when the source knows them in advance."""
        return self.source.num_rows_per_pass

    def num_batches(self) -> int | None:
        """Batches of a whole pass, or None when the source does not know its row count in advance."""
        rows = self.rows_per_pass
        if rows is None:
            return None
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)

    def _expected_rows(self) -> int | None:
        """The rows the source's current pass delivers, when known in advance."""
        return self._rows_delivered_by(self.source.num_rows_this_pass)

    def _rows_delivered_by(self, rows: int | None) -> int | None:
        """The rows a pass over ``rows`` source rows delivers (``drop_last`` leaves the short tail out)."""
        if rows is None or not self.drop_last:
            return rows
        return rows - rows % self.batch_size

    # -- iteration ----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        if self._error is not None:
            raise RuntimeError(f'Cannot start a new iteration because last time iteration failed with error '
                               f'{self._error!r}.')
        current = self._pass
        if current is not None and current.complete:
            self._close_pass()
            self._passes_done += 1
            self._needs_new_pass = True
        elif current is not None and (current.batches_delivered or current.broken):
            if self.source.info.endless:
                if current.broken:
                    self._resume_broken_pass()
            else:
                logger.info('%s: a new iteration abandons the pass in progress and starts another', self._name)
                self._close_pass()
                self._passes_done += 1
                self._needs_new_pass = True
        if self._pass is None:
            self._start_pass()
        self._token += 1
        return self._serve(self._token)

    def _start_pass(self) -> None:
        source = self.source
        if self._needs_new_pass:
            source.restart()
        elif self._passes_done and not self._restored and source.last_row_consumed:
            logger.info('starting pass %d of the %s: resetting the reader', self._passes_done + 1, self._name)
            source.restart()  # the last pass ran out: the next one (what a reader's reset() does then)
        self._restored = False
        self._needs_new_pass = False
        self._pass = _Pass(self._stream(self._passes_done), self._expected_rows)

    def _close_pass(self) -> None:
        if self._pass is not None:
            self._pass.batches.close()
        self._pass = None
        self._buffers = None

    def _resume_broken_pass(self) -> None:
        """An endless pass whose generator an interrupt went through: continue from its position."""
        state = self.state_dict() if positions_of(self.source) is not None else None
        self._close_pass()
        if state is not None:
            self.source.restart(state['reader'])
            self._restored = True
        self._pass = _Pass(self._stream(self._passes_done), self._expected_rows)

    def _serve(self, token: int) -> Iterator[Any]:
        current = None
        while True:
            if token != self._token:
                if current is not None and current.complete:
                    return  # its pass was whole: nothing is left to give
                raise RuntimeError(_SUPERSEDED.format(name=self._name))
            current = self._pass
            if current is None:
                return
            try:
                rows, batch = next(current.batches)
            except StopIteration:
                self._pass = None
                self._buffers = None
                self._passes_done += 1
                return
            except Exception as err:
                self._error = err
                self._close_pass()
                raise
            except BaseException:
                current.broken = True  # KeyboardInterrupt or SystemExit: the next iter() starts over or continues
                raise
            current.rows += rows
            current.batches_delivered += 1
            yield batch

    def _stream(self, pass_index: int) -> Generator[tuple[int, Any], None, None]:
        """One pass: each chunk ``prepare``d, shuffled if asked, cut into ``finish``ed batches."""
        source = self.source
        batcher = Batcher(self.batch_size, self._ops)
        capacity = self.shuffling_queue_capacity
        shuffler = ShufflingBuffer(capacity, self._rng(pass_index), self._ops, self.batch_size,
                                   packed=self._packed) if capacity else None
        self._buffers = (batcher, shuffler)
        with_row_ids = positions_of(source) is not None
        as_tuple = False
        # The first batch needs this many rows: the source delivers them without waiting for a whole row group.
        for batch in source.column_batches(self.batch_size + capacity):
            columns = dict(batch.columns)
            if with_row_ids:
                row_ids = batch.row_ids
                columns[ROW_IDS] = row_ids if row_ids is not None else np.full(batch.num_rows, -1, np.int64)
            as_tuple = batch.rows_are_tuples
            table = self._prepare(columns)
            # Every drawn piece is queued before the first batch goes out, so that state_dict() sees its rows.
            for piece in shuffler.add(table) if shuffler is not None else (table,):
                batcher.put(piece)
            for out in batcher.batches():
                yield num_rows(out), self._finish(out, as_tuple)
        for piece in shuffler.drain() if shuffler is not None else ():
            batcher.put(piece)
        for out in batcher.batches():
            yield num_rows(out), self._finish(out, as_tuple)
        if not self.drop_last:  # else the pass's rows beyond its last full batch are left out
            for out in batcher.flush():
                yield num_rows(out), self._finish(out, as_tuple)

    def _rng(self, pass_index: int) -> np.random.Generator:
        seed = self.source.info.seed
        if seed is None:
            return np.random.default_rng()
        return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, pass_index, _LOADER_STREAM])

    # -- positions ----------------------------------------------------------------------------------------------

    def check_resumable(self, method: str) -> PositionSource:
        """The source's positions, for ``method``.

        Raises:
            NotImplementedError: the source cannot name its rows (see :func:`~petastorm.reading.source.positions_of`).
        """
        positions = positions_of(self.source)
        if positions is None:
            raise NotImplementedError(f'{method}() needs a reader from make_reader/make_batch_reader (or a mix of '
                                      f'them), got {type(getattr(self.source, "wrapped", self.source)).__name__}')
        return positions

    def state_dict(self) -> dict[str, Any]:
        """The position: the source's, with the rows waiting in the buffers counted as not delivered.

        ``{'reader': source state, 'passes_done': int, 'in_progress': bool}``; a stream saved after the last row of a
        pass was delivered is saved between passes.
        """
        positions = self.check_resumable('state_dict')
        current = self._pass
        between = current is None or current.complete
        held = self._held_row_ids() if not between else np.empty(0, dtype=np.int64)
        if (held < 0).any():
            raise RuntimeError('cannot save the loader position while it holds rows of a row group whose '
                               'TransformSpec changed the number of rows; save it at the end of a pass')
        state = positions.state_holding(held, held_in_order=not self.shuffling_queue_capacity)
        passes = self._passes_done + (1 if current is not None and current.complete else 0)
        return {'reader': state, 'passes_done': passes, 'in_progress': not between}

    def _held_row_ids(self) -> np.ndarray:
        if self._buffers is None:
            return np.empty(0, dtype=np.int64)
        batcher, shuffler = self._buffers
        parts = [np.asarray(part) for part in batcher.held(ROW_IDS)]
        if shuffler is not None and shuffler.held(ROW_IDS) is not None:
            parts.insert(0, np.asarray(shuffler.held(ROW_IDS)))
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration delivers exactly the rows not delivered yet.

        A pass being read is abandoned. ``state['reader']`` may also be a list: the source states of every rank of
        a distributed run (see :meth:`petastorm.reader.Reader.load_state_dict`).
        """
        self.check_resumable('load_state_dict')
        if self._pass is not None:
            _ = self._pass.complete  # asked of the source while it still reads that pass (an old iterator asks)
        self._close_pass()
        # Saved between passes: the next iteration is a whole new pass after the saved one.
        self.source.restart(state['reader'], new_pass=not state.get('in_progress'))
        self._passes_done = int(state['passes_done'])
        self._needs_new_pass = False
        self._restored = True
        self._error = None
