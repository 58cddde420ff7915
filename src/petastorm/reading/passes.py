"""The passes of a reader: what a pass reads, how long it is, how another starts, and where the reader is.

Every rule of a reader's pass lives here; :class:`~petastorm.reader.Reader` asks :class:`ReaderPasses`:

* **A pass** reads ``num_epochs`` epochs of the shard's layout (forever with ``num_epochs=None``), from a stage: a
  fresh epoch, or the rest of one after a restore. Rows and batches of the pool's results are handed out in
  order, and only what reached the caller counts as delivered (rows read ahead by workers never do).
* **Another pass.** ``reset()`` starts the next ``num_epochs`` epochs once the last pass ran out (and refuses
  in the middle, as Petastorm did); ``restart()`` abandons the pass being read, if any, and starts the next one
  now, or continues from a saved state. Work items read ahead for an abandoned pass are cancelled.
* **The length** of a pass is counted by walking the stages the pass reads, so it always equals what is
  delivered, restored passes included (``len()``: rows, or batches of a batch reader).
* **Resuming.** A state (:class:`~petastorm.plan.ReaderState`, one rank's or the list of every rank's) is checked
  against this reader's layout and options and turned into the stage the pass continues from
  (:mod:`petastorm.plan.resume`); NGram readers have no positions.
* **Held rows.** A consumer (a loader's buffers) may hold rows it took but did not hand on: the state then
  counts them as not delivered, so a restored reader reads them first.

:class:`~petastorm.reading.position.ReaderPosition` holds where the reader is (not thread-safe);
:class:`ReaderPasses` holds the lock and the pass being read. The bookkeeping is the pure functions of
:mod:`petastorm.plan`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pyarrow.fs as pafs

from petastorm.plan import (
    ReaderState,
    ShardLayout,
    kept_rows,
    merge_runs,
    rank_states,
)
from petastorm.plan.runs import run_table_of_rows
from petastorm.pools import default_max_bytes_in_flight, make_pool
from petastorm.pools.base import WorkerPool
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.delivery import deliver
from petastorm.reading.options import ReaderOptions
from petastorm.reading.position import ReaderPosition, UnitTag
from petastorm.reading.setup import ReaderSetup
from petastorm.reading.source import SourceInfo
from petastorm.reading.worker import ReadContext, prefetch_item, read_item
from petastorm.stage_timing import StageTotals

__all__ = ['STOPPED_MESSAGE', 'ReaderPasses', 'start_pool']

logger = logging.getLogger(__name__)

STOPPED_MESSAGE = ('Trying to read a sample after a reader created by make_reader/make_batch_reader has stopped. '
                   'This may happen if the make_reader/make_batch_reader context manager has exited but you try '
                   'to read a sample from the reader.')


def start_pool(options: ReaderOptions, context: ReadContext) -> WorkerPool:
    """A reader's pool, started with the workers' context, bounded by items and bytes in flight (see ``reader``)."""
    # From remote storage the first items wait on round trips, not on the CPU: every worker starts one at once.
    remote = not isinstance(context.filesystem, pafs.LocalFileSystem)
    workers = options.workers_count
    pool = make_pool(options.reader_pool_type, workers, max_in_flight=_items_in_flight(options, context),
                     max_bytes_in_flight=default_max_bytes_in_flight(),
                     initial_in_flight=workers if remote else None)
    pool.start(read_item, context)
    return pool


#: items in flight per worker: twice, so that each has its next item; from a store of small files whose row groups
#: are fetched ahead (a remote one, read by threads), eight times, so that their reads wait on round trips together:
#: an epoch of 1,000 files of 100 rows on S3 at 20 ms took 2.2 s where it took 3.6 s with twice. Larger files keep
#: twice: their results are larger, and their workers' reads are not bound by round trips.
_IN_FLIGHT_PER_WORKER = 2
_IN_FLIGHT_PER_WORKER_SMALL_READS = 8


def _reads_ahead(options: ReaderOptions, context: ReadContext) -> bool:
    """Whether the reader fetches row groups ahead of its workers (:func:`~petastorm.reading.worker.prefetch_item`).

    Its threads do, from a store whose data files stay open (pyarrow's remote clients).
    """
    files = context.data_files
    return options.reader_pool_type == 'thread' and files is not None and files.keeps_open


def _items_in_flight(options: ReaderOptions, context: ReadContext) -> int:
    """The most work items a reader's pool holds submitted at once (at most ``results_queue_size``)."""
    files = context.data_files
    small_reads = _reads_ahead(options, context) and files is not None and files.small_reads()
    per_worker = _IN_FLIGHT_PER_WORKER_SMALL_READS if small_reads else _IN_FLIGHT_PER_WORKER
    workers = options.workers_count
    return max(workers, min(options.results_queue_size, per_worker * workers))


class ReaderPasses:
    """The passes of one reader over its pool: delivery, length, another pass, positions (thread-safe).

    Makes and starts the reader's pool (:func:`start_pool`), which reads the pass's work items.

    Args:
        options: the reader's options.
        setup: the planned read (schema, NGram, layout, the workers' context, what is known of the rows).
        stage_totals: where the workers' stage times are added up, or None.
    """

    def __init__(self, options: ReaderOptions, setup: ReaderSetup, stage_totals: StageTotals | None) -> None:
        self._options = options
        self._setup = setup
        self._stage_totals = stage_totals
        self._position = ReaderPosition(None if setup.planned is None else setup.planned.layout, options.num_epochs,
                                        streamed=setup.streamed)
        #: What the reader delivers; its pass is endless with ``num_epochs=None``.
        self.info = SourceInfo(schema=setup.schema, ngram=setup.ngram, batched_output=options.batched_output,
                               seed=options.seed, transform_spec=options.transform_spec,
                               endless=options.num_epochs is None, sized=self._sized())
        self._pool = start_pool(options, setup.context)
        self._lock = threading.Lock()
        #: True once :meth:`stop` was called.
        self.stopped = False
        #: True once every epoch of the pass was delivered.
        self.last_row_consumed = False
        self._start_pass()

    @property
    def layout(self) -> ShardLayout:
        """The shard's layout."""
        return self._position.layout

    # -- delivery -----------------------------------------------------------------------------------------------

    def _start_pass(self) -> None:
        self._batches = self._read_batches()
        self._output = deliver(self._setup.schema, self._setup.ngram, self._options.batched_output, self._batches)

    def _read_batches(self) -> Generator[ColumnBatch, None, None]:
        """The pool's batches of the current pass, each registered with the position as it is handed out."""
        self._position.started = True
        tags: deque[UnitTag] = deque()  # what each submitted unit is, in submission order
        results: Iterator[ColumnBatch] = self._pool.imap(self._fetching_ahead(self._position.units(tags)))
        totals = self._stage_totals
        if totals is not None:
            results = totals.timed(results)
        for batch in results:
            tag = tags.popleft()
            if totals is not None:
                totals.add(batch.stage_seconds, batch.num_rows)
            if batch.num_rows:
                self._position.begin(tag, batch)
                yield batch

    def _fetching_ahead(self, units: Iterator[Any]) -> Iterator[Any]:
        """The units, each one's row group fetched ahead as the pool takes it (remote stores, thread pool)."""
        context = self._setup.context
        if not _reads_ahead(self._options, context):
            yield from units
            return
        for unit in units:
            prefetch_item(context, unit)
            yield unit

    def _check_running(self) -> None:
        if self.stopped:
            raise RuntimeError(STOPPED_MESSAGE)

    def _next_of(self, stream: Iterator[Any]) -> Any:
        """The next item of one of the pass's streams (under the lock); the pass ends when it runs out."""
        self._check_running()
        try:
            return next(stream)
        except StopIteration:
            self.last_row_consumed = True
            raise

    def next_item(self) -> Any:
        """The next row, batch or NGram window (``next(reader)``)."""
        with self._lock:
            item = self._next_of(self._output)
            self._position.delivered(None if self._options.batched_output else 1)
            return item

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """The decoded columns of each work item, with ``row_ids`` (see the Reader's ``column_batches``)."""
        if first_rows is not None and self._splits_items:
            with self._lock:
                self._position.head_rows = first_rows
        while True:
            with self._lock:
                try:
                    batch = self._next_of(self._batches)
                except StopIteration:
                    return
                self._position.delivered()
                batch = dataclasses.replace(batch, row_ids=self._position.row_ids())
            yield batch

    @property
    def _splits_items(self) -> bool:
        """Whether a pass may read its first work item in two (a thread reads the row group for both)."""
        return (self._options.reader_pool_type in ('thread', 'dummy') and self._setup.ngram is None
                and self._setup.context.cache is None)

    # -- length -------------------------------------------------------------------------------------------------

    def _sized(self) -> bool:
        """Whether :meth:`rows_per_pass` is known, told without waiting for a streamed plan."""
        if self._setup.planned is not None:
            return self.rows_per_pass() is not None
        # Streamed: no counted rows (row_matches is None), so the rows per epoch are the layout's once it is made.
        return self._options.num_epochs is not None and self._setup.rows_known

    def rows_per_epoch(self) -> int | None:
        """Rows per epoch known before reading (see :attr:`petastorm.reader.Reader.num_rows_per_epoch`)."""
        if not self._setup.rows_known:
            return None
        layout, matches = self._position.layout, self._setup.row_matches
        if matches is None:
            return layout.rows_per_epoch
        if layout.splits[0] > 1:
            return None
        return sum(kept_rows(unit, layout.shuffle_rows, matches) for unit in layout.ordered(0))

    def rows_per_pass(self) -> int | None:
        """Rows of a whole pass: the epochs' rows (counted epoch by epoch when they differ), or None."""
        num_epochs = self._options.num_epochs
        if num_epochs is None or not self._setup.rows_known:
            return None
        per_epoch = self.rows_per_epoch()
        if per_epoch is None:
            return self._position.rows_this_pass(self._setup.row_matches, whole=True)
        return per_epoch * num_epochs

    def rows_this_pass(self) -> int | None:
        """Rows the current pass delivers from its start: a whole pass, or after a restore what it has left."""
        rows = self.rows_per_pass()
        if rows is None or not self._position.restarted:
            return rows
        return self._position.rows_this_pass(self._setup.row_matches)

    def items_this_pass(self) -> int:
        """``len()`` of the reader: rows (``make_reader``) or batches (``make_batch_reader``) of the current pass.

        Raises:
            TypeError: the count is unknown in advance.
        """
        rows = self.rows_this_pass()
        if rows is None:
            raise TypeError('len() of this reader is unknown in advance (num_epochs=None, an NGram, a batch '
                            'transform function, or a predicate or filters on stored columns: make the reader '
                            'with count_rows=True to count the rows they keep); see Reader.num_rows_per_epoch')
        return self._position.units_this_pass(self._setup.row_matches) if self._options.batched_output else rows

    # -- another pass -------------------------------------------------------------------------------------------

    def _close_streams(self) -> None:
        for stream in (self._output, self._batches):
            stream.close()

    def reset(self) -> None:
        """Start the next pass; only after the last one ran out.

        Raises:
            NotImplementedError: in the middle of a pass.
            RuntimeError: the reader was stopped.
        """
        with self._lock:
            if not self.last_row_consumed:
                raise NotImplementedError('Currently do not support resetting a reader while in the middle of '
                                          'iteration. You can reset the reader only after all samples were consumed.')
            self._check_running()
            self.last_row_consumed = False
            self._position.new_pass()
            self._start_pass()

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """Abandon the pass being read and start the next one, or continue from ``state`` (see the Reader's)."""
        if state is not None:
            self._refuse_ngram('load_state_dict')
        with self._lock:
            self._check_running()
            self._close_streams()
            self.last_row_consumed = False
            if state is None:
                self._position.new_pass()
            else:
                states = rank_states(state)
                if new_pass:  # saved between two passes: the pass after it starts where it was saved
                    states = tuple(dataclasses.replace(one, pass_start=one.epoch) for one in states)
                self._position.started = False
                self._position.restore(states, self._options.seed, self._options.table_version_change)
            self._start_pass()

    def stop(self) -> None:
        """Stop reading (non-blocking)."""
        self.stopped = True
        self._pool.stop()
        if self._setup.streamed is not None:
            self._setup.streamed.stop()

    def join(self) -> None:
        """Wait until every worker has finished (the streams of a stopped reader are closed first)."""
        if self.stopped:
            for stream in (self._output, self._batches):
                try:
                    stream.close()
                except (RuntimeError, ValueError):  # closing a generator another thread is running
                    logger.debug('reader output was still running when joined')
        self._pool.join()
        if self._setup.streamed is not None:
            self._setup.streamed.join()  # the thread reading footers, stopped if it still was
        data_files = self._setup.context.data_files
        if data_files is not None:
            data_files.close()  # the threads that fetched row groups ahead

    def diagnostics(self) -> dict[str, Any]:
        """The pool's counters (also under Petastorm's names) and the plan's (see the Reader's ``diagnostics``)."""
        pool = self._pool.diagnostics
        submitted, completed = pool.get('items_submitted', 0), pool.get('items_completed', 0)
        layout, options = self._position.layout, self._options
        info = {**pool, 'work_items_per_epoch': len(layout.items), 'shard_mode': layout.shard_mode,
                'shard': options.cur_shard, 'shard_count': options.shard_count, 'shard_source': options.shard_source,
                'rows_per_epoch_before_filters': layout.rows_per_epoch,
                'shard_remainder': layout.remainder if layout.shard_mode == 'rows' else None,
                'rows_remainder_per_epoch': layout.remainder_rows,
                'output_queue_size': pool.get('in_flight', submitted - completed), 'items_consumed': submitted,
                'items_produced': completed, 'items_inprocess': submitted - completed}
        if self._stage_totals is not None:
            info['stages'] = self._stage_totals.snapshot()
        return info

    # -- positions ----------------------------------------------------------------------------------------------

    @property
    def resumable(self) -> bool:
        """Positions can be saved: every reader but an NGram one."""
        return self._setup.ngram is None

    def _refuse_ngram(self, method: str) -> None:
        if not self.resumable:
            raise NotImplementedError(f'{method}() is not supported for NGram readers')

    def state(self) -> ReaderState:
        """The delivered position."""
        self._refuse_ngram('state_dict')
        with self._lock:
            return self._position.state()

    def state_holding(self, held_rows: Any) -> ReaderState:
        """The delivered position with ``held_rows`` (``row_ids``) counted as not delivered: read first on restore."""
        return _holding(self.state(), held_rows)

    def state_holding_later(self, held_rows: Callable[[], Any]) -> Callable[[], ReaderState]:
        """:meth:`state_holding` as of now, made when called (``held_rows`` too).

        Taking it costs a lock and a few attribute reads, so a loader may take one every step and pay for it only
        when it is saved.
        """
        self._refuse_ngram('state_dict')
        with self._lock:
            later = self._position.state_later()
        return lambda: _holding(later(), held_rows())

    def load(self, state: Any) -> None:
        """Continue from a saved state (or the list of every rank's), before reading."""
        self._refuse_ngram('load_state_dict')
        states = rank_states(state)
        with self._lock:
            self._position.restore(states, self._options.seed, self._options.table_version_change)
            self._start_pass()


def _holding(state: ReaderState, held_rows: Any) -> ReaderState:
    held = tuple(tuple(run) for run in run_table_of_rows(held_rows).tolist())  # sorted and merged already
    if state.pending:
        held = tuple(merge_runs(sorted(state.pending + held)))
    return dataclasses.replace(state, pending=held)
