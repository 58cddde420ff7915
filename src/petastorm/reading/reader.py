"""The :class:`Reader`: the iterator :func:`petastorm.make_reader` and ``make_batch_reader`` return.

It ties a planned read (:mod:`petastorm.reading.setup`) to its passes (:mod:`petastorm.reading.passes`): rows or
batches out, positions saved and restored, its threads and processes stopped and joined. Users import it from
:mod:`petastorm.reader`, where the factories that make it are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from petastorm.plan import WorkItem
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.inputs import PLAIN_PARQUET_NOTE
from petastorm.reading.legacy import reader_options
from petastorm.reading.options import ReaderOptions
from petastorm.reading.passes import ReaderPasses
from petastorm.reading.setup import set_up_reader
from petastorm.stage_timing import StageTotals
from petastorm.transform import TransformSpec

__all__ = ['Reader']

logger = logging.getLogger('petastorm.reader')


class Reader:
    """An iterator over a dataset, made by :func:`make_reader` (rows) or :func:`make_batch_reader` (batches).

    Use it as a context manager, or call :meth:`stop` and :meth:`join` when done. A reader is also what the
    loaders read: a :class:`~petastorm.reading.ColumnSource` with positions (a
    :class:`~petastorm.reading.PositionSource`); the rules of its passes are :mod:`petastorm.reading.passes`.

    Made by the factories from checked :class:`~petastorm.reading.ReaderOptions`. Petastorm's direct construction
    works too, with its arguments: ``Reader(filesystem, dataset_path, schema_fields=..., reader_pool=ThreadPool(5),
    ...)`` (a pool of :mod:`petastorm.workers_pool` picks the pool kind and worker count; see
    :func:`petastorm.reading.legacy.legacy_reader_options`).

    Attributes:
        schema: the Unischema of what is yielded (after field selection and the transform).
        dataset: the opened store (files, metadata).
        ngram: the NGram given as ``schema_fields``, or None.
        num_epochs: epochs per pass.
        is_batched_reader: True for ``make_batch_reader``.
        cache: the cache of row groups (a ``NullCache`` unless ``cache_type`` is a local-disk type).
        read_context: what every worker receives; executors other than the pool (Ray Data read tasks) read work
            items with :func:`petastorm.reading.worker.read_item` and it.
        info: what the reader delivers, for the loaders (:class:`~petastorm.reading.SourceInfo`).
    """

    def __init__(self, options: ReaderOptions | Any = None, *legacy_args: Any, time_stages: bool = False,
                 **legacy_kwargs: Any) -> None:
        self._options = options = reader_options(options, *legacy_args, **legacy_kwargs)
        self.is_batched_reader = options.batched_output
        self.num_epochs = options.num_epochs
        # Opt-in profile of where the time goes (benchmarks); None costs nothing per work item.
        self._stage_totals = StageTotals() if time_stages else None
        setup = set_up_reader(options, time_stages=time_stages, stream=True)
        if setup.schema_inferred and not options.batched_output:
            logger.info(PLAIN_PARQUET_NOTE, options.dataset_url_or_urls)
        self.dataset, self.schema, self.ngram, self.cache = setup.dataset, setup.schema, setup.ngram, setup.cache
        self.read_context = setup.context
        try:
            self._passes = ReaderPasses(options, setup, self._stage_totals)
        except BaseException:
            if setup.streamed is not None:
                setup.streamed.join()  # the thread reading footers behind the reader
            raise
        self.info = self._passes.info
        if setup.planned is not None:
            logger.info('reading %s: %d work items per epoch, %s pool with %d workers', options.dataset_url_or_urls,
                        len(setup.planned.layout.items), options.reader_pool_type, options.workers_count)
        else:
            logger.info('reading %s while its %d footers are read, %s pool with %d workers',
                        options.dataset_url_or_urls, len(setup.dataset.files), options.reader_pool_type,
                        options.workers_count)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._passes.stopped

    @property
    def last_row_consumed(self) -> bool:
        """True once every epoch of the pass was delivered."""
        return self._passes.last_row_consumed

    # -- iterator protocol --------------------------------------------------------------------------------------

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> Any:
        return self._passes.next_item()

    def next(self) -> Any:
        """Same as ``next(reader)``."""
        return self.__next__()

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """Yield the decoded columns of each work item (a row group or part of one), for loaders that batch.

        Every batch has at least one row and carries ``row_ids`` (numbers naming each row, for loaders that save
        their position; None when a transform hid them). It draws from the same stream as ``next(reader)`` (rows
        already cut from a batch by ``next`` are not repeated), ends the pass like ``next`` does (so
        :meth:`reset` starts another one), and raises ``RuntimeError`` after :meth:`stop`.

        ``first_rows``: the rows the consumer needs before it can hand out anything (a loader's batch). From
        then on, a pass whose first work item has more than twice as many rows reads it as two: those rows first,
        decoded alone, then the rest of the row group, which the pool's threads read once for both. The rows and
        their order do not change; the first batch does not wait for a whole row group to be decoded. Only the
        thread and dummy pools, without a cache or NGram, split items.
        """
        return self._passes.column_batches(first_rows)

    # -- what is known before reading ---------------------------------------------------------------------------

    @property
    def work_items(self) -> Sequence[WorkItem]:
        """This shard's work items of one epoch (row ranges of the selected row groups), in piece order.

        A sequence that makes each :class:`~petastorm.plan.WorkItem` when asked.
        """
        return self._passes.layout.items

    @property
    def seed(self) -> int | None:
        """The ``seed`` the reader was made with (None when unseeded)."""
        return self.info.seed

    @property
    def transform_spec(self) -> TransformSpec | None:
        """The ``transform_spec`` the reader was made with (None when rows are delivered as decoded)."""
        return self.info.transform_spec

    @property
    def batched_output(self) -> bool:
        """True when each item is a batch of rows (``make_batch_reader``)."""
        return self.is_batched_reader

    @property
    def num_rows_per_epoch(self) -> int | None:
        """Rows this reader (this shard) delivers per epoch, known before reading; None when only reading can tell.

        Exact after sharding (with ``shard_mode='rows'`` the same for every shard), row-group selectors and
        predicates or ``filters`` on partition columns (they keep or drop whole row groups), ``filters`` whose
        footer statistics keep or drop every row group whole, and any predicate or filter with
        ``count_rows=True``. None otherwise (which rows of a row group match is known only by reading it), with an
        NGram, a ``make_batch_reader`` transform function (which may drop rows), and with counted rows under
        ``shard_mode='rows'`` and several shards (each epoch's share then keeps another number of rows:
        :attr:`num_rows_per_pass` and ``len()`` stay exact).
        """
        return self._passes.rows_per_epoch()

    @property
    def num_rows_per_pass(self) -> int | None:
        """Rows one pass delivers (all ``num_epochs`` epochs), or None when only reading can tell.

        It is :attr:`num_rows_per_epoch` times ``num_epochs`` (counted epoch by epoch when the filters' counts
        differ between epochs); None with ``num_epochs=None`` or when the rows per epoch are unknown.
        """
        return self._passes.rows_per_pass()

    @property
    def num_rows_this_pass(self) -> int | None:
        """Rows the pass about to be read (or being read) delivers from its start, or None when only reading can tell.

        :attr:`num_rows_per_pass` for a whole pass; after :meth:`load_state_dict`, only the rows the restored pass
        still has to deliver (rows a loader held when the state was saved included).
        """
        return self._passes.rows_this_pass()

    def __len__(self) -> int:
        """Items one pass yields: rows (``make_reader``) or batches (``make_batch_reader``).

        Raises:
            TypeError: the count is unknown in advance (see :attr:`num_rows_per_epoch`) or ``num_epochs=None``.
        """
        return self._passes.items_this_pass()

    def __getitem__(self, index: Any) -> Any:
        """A reader is a stream, not indexable: what ``torch.utils.data.DataLoader(reader)`` meets, explained.

        Raises:
            TypeError: always, naming the loaders that read a reader.
        """
        raise TypeError(f'a petastorm Reader is a stream of {"batches" if self.is_batched_reader else "rows"} and '
                        f'cannot be indexed (reader[{index!r}]); torch.utils.data.DataLoader(reader) needs a map-style '
                        f'dataset: use petastorm.pytorch.DataLoader(reader, batch_size=...) or BatchedDataLoader, '
                        f'which read the reader in order')

    def __bool__(self) -> bool:
        return True  # a reader is truthy even when its len() is unknown or 0

    # -- positions ----------------------------------------------------------------------------------------------

    @property
    def resumable(self) -> bool:
        """True: the reader's batches carry row numbers, and :meth:`state_dict` saves positions (not with an NGram)."""
        return self._passes.resumable

    def state_dict(self) -> dict[str, Any]:
        """The position of this reader: which rows it delivered, as a small dict of ints, lists and strings.

        Counts only rows handed to the caller (rows read ahead by workers are not), so that
        :meth:`load_state_dict` on a new reader continues with exactly the rows not delivered yet. It is a
        :class:`~petastorm.plan.ReaderState` as a dict.
        """
        return self._passes.state().to_dict()

    def load_state_dict(self, state: Any) -> None:
        """Continue from a saved position; call before reading.

        Args:
            state: a :meth:`state_dict` of a reader over the same data with the same options, or the list of the
                states of every rank (in rank order) of a distributed run. With the same world size each rank
                continues its own stream exactly. With ``shard_mode='rows'`` the world size may change: the rows
                no rank delivered are split again into equal shares. A single state then stands for every rank
                (same number of rows consumed, none in loader buffers); pass the list otherwise.

        Raises:
            ValueError: the state does not match this reader (the message names the option or count).
            RuntimeError: reading has started.
        """
        self._passes.load(state)

    def state_holding(self, held_rows: Any, held_in_order: bool = False) -> dict[str, Any]:
        """:meth:`state_dict` of a reader whose consumer holds some delivered rows it has not handed on yet.

        A loader buffers rows between the reader and its batches; they count as not delivered, so a restored reader
        reads them again (first, grouped by row group), then continues.

        Args:
            held_rows: the ``row_ids`` of the rows held (from :meth:`column_batches`).
            held_in_order: the held rows are the last ones taken, in order (no shuffling buffer); a reader's own
                order needs no use of it.
        """
        return self._passes.state_holding(held_rows).to_dict()

    def state_holding_later(self, held_rows: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
        """:meth:`state_holding` as of now, made when called.

        A loader that takes a position every step pays for it when the position is saved.

        Args:
            held_rows: gives the ``row_ids`` of the rows held now (called with the result, so it must give the
                rows held when this method was called).
        """
        later = self._passes.state_holding_later(held_rows)
        return lambda: later().to_dict()

    # -- life cycle ---------------------------------------------------------------------------------------------

    @property
    def endless(self) -> bool:
        """True with ``num_epochs=None``: one pass that never ends, so a new pass continues it."""
        return self.info.endless

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """Abandon the pass being read, if any, and start another one now (unlike :meth:`reset`, also mid-pass).

        Work items read ahead for the abandoned pass are cancelled (their results are dropped).

        Args:
            state: None starts the next ``num_epochs`` epochs (as :meth:`reset` does after a finished pass); a
                :meth:`state_dict` (or the list of every rank's) continues from there, as :meth:`load_state_dict`.
            new_pass: ``state`` was saved between two passes: start the pass after it.

        Raises:
            ValueError: the state does not match this reader.
            RuntimeError: the reader was stopped.
        """
        self._passes.restart(state, new_pass=new_pass)

    def reset(self) -> None:
        """Start another ``num_epochs`` pass (with new per-epoch orders); allowed only after the data ran out."""
        self._passes.reset()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Counters of the worker pool and the plan; with ``time_stages``, also ``'stages'`` (seconds per stage).

        Petastorm's names are there too, for every pool kind: ``output_queue_size`` (items handed to the workers
        whose results the reader has not taken yet), ``items_consumed`` (items handed to the workers),
        ``items_produced`` (results taken) and ``items_inprocess`` (the difference).
        """
        return self._passes.diagnostics()

    def stop(self) -> None:
        """Stop reading (non-blocking); iteration afterwards raises ``RuntimeError``."""
        self._passes.stop()

    def join(self) -> None:
        """Wait until every worker has finished (call after :meth:`stop`)."""
        self._passes.join()

    def cleanup_cache(self) -> None:
        """Remove the local disk cache and print ``Cache cleanup complete.``, as Petastorm did.

        The cache is kept when made with ``cache_extra_settings={'cleanup': False}``; with the null cache only the
        line is printed. An ``OSError`` or ``AttributeError`` raised while cleaning is printed (``Error cleaning
        cache: ...``), not raised. A reader's ``with`` exit cleans the cache too, but prints nothing (a failure is
        logged instead).
        """
        error = _release_cache(self.cache)
        # print, not logging: Petastorm printed these lines, and scripts may look for them.
        if error is not None:
            print(f'Error cleaning cache: {error}', flush=True)
        print('Cache cleanup complete.', flush=True)

    def __repr__(self) -> str:
        from petastorm._describe import describe_names, describe_urls

        options = self._options
        try:
            rows = self.num_rows_per_epoch
        except AttributeError:  # shown while __init__ failed half-way (a debugger, a log of the error)
            return f'<Reader of {describe_urls(options.dataset_url_or_urls)}, not constructed>'
        parts = [f'{"make_batch_reader" if self.is_batched_reader else "make_reader"} of '
                 f'{describe_urls(options.dataset_url_or_urls)}',
                 f'fields={describe_names(self.schema.fields)}',
                 f'rows_per_epoch={"unknown" if rows is None else rows}',
                 f'num_epochs={options.num_epochs}',
                 f'shuffle_row_groups={options.shuffle_row_groups}', f'shuffle_rows={options.shuffle_rows}',
                 f'seed={options.seed}',
                 f'reader_pool_type={options.reader_pool_type!r}', f'workers_count={options.workers_count}']
        if options.shuffle_row_drop_partitions > 1:
            parts.insert(6, f'shuffle_row_drop_partitions={options.shuffle_row_drop_partitions}')
        if options.shard_count:
            parts.append(f'cur_shard={options.cur_shard}, shard_count={options.shard_count}')
        if self.ngram is not None:
            parts.append(f'ngram={self.ngram!r}')
        if self.stopped:
            parts.append('stopped')
        elif self.last_row_consumed:
            parts.append('all rows consumed')
        return f'<Reader {", ".join(parts)}>'

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
        self.join()
        error = _release_cache(self.cache)
        if error is not None:
            logger.warning('could not clean up the cache %r: %s', self.cache, error)


def _release_cache(cache: Any) -> BaseException | None:
    """Clean the cache up; the error it raised (``OSError``, ``AttributeError``), or None."""
    try:
        cache.cleanup()
    except (OSError, AttributeError) as err:
        return err
    return None
