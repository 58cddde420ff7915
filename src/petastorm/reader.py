"""``make_reader`` and ``make_batch_reader``: read a dataset as rows or as column batches.

A :class:`Reader` is built in steps: options are validated into one frozen object, the URL is resolved to a
filesystem, the store's schema and row groups are loaded, a pure plan decides which row ranges this shard reads
in which order for every epoch, and a worker pool reads, decodes and transforms whole row groups. Rows are cut
from the decoded columns only at the very end, for ``make_reader``.

Memory: at most ``max(workers_count, min(results_queue_size, 2 * workers_count))`` work items are in flight
(being read or waiting to be consumed), and fewer when their decoded size (the row groups being read counted
twice: raw and decoded) would pass a byte budget of 128 MiB per CPU (256 MiB to 1 GiB, see
:func:`petastorm.pools.default_max_bytes_in_flight`), so peak memory is about that budget plus one row group
being consumed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

from petastorm.cache import RowGroupCache, make_cache, make_row_group_cache
from petastorm.distributed import Stage, StreamPosition
from petastorm.fs import normalize_dir_url, resolve_location
from petastorm.metadata.store import (
    RowGroupPiece,
    load_row_groups,
    open_store,
)
from petastorm.ngram import NGram
from petastorm.options import LOCAL_DISK_CACHE, NULL_CACHE, ReaderOptions, validate_options
from petastorm.plan import WorkItem, shard_items, split_drop_partitions
from petastorm.pools import default_max_bytes_in_flight, make_pool
from petastorm.read import META, NGRAM_STARTS, ReadContext, read_item
from petastorm.reader_inputs import (
    check_columns_exist,
    check_ngram_options,
    load_schema,
    select_fields,
)
from petastorm.reader_state import ResumableReader
from petastorm.row_group_selection import (
    apply_selector,
    columns_of_expression,
    filter_expression,
    prune_by_partition_predicate,
    prune_by_statistics,
)
from petastorm.stage_timing import StageTotals
from petastorm.transform import TransformSpec, transform_schema
from petastorm.unischema import Unischema, UnischemaField

logger = logging.getLogger(__name__)

__all__ = ['LOCAL_DISK_CACHE', 'NULL_CACHE', 'Reader', 'make_batch_reader', 'make_reader',
           'normalize_dataset_url_or_urls']

_STOPPED_MESSAGE = ('Trying to read a sample after a reader created by make_reader/make_batch_reader has stopped. '
                    'This may happen if the make_reader/make_batch_reader context manager has exited but you try '
                    'to read a sample from the reader.')


def normalize_dataset_url_or_urls(dataset_url_or_urls: Any) -> Any:
    """Check a URL or a non-empty list of URLs and strip one trailing ``/`` from each."""
    if isinstance(dataset_url_or_urls, list):
        if not dataset_url_or_urls:
            raise ValueError('dataset url list must be non-empty.')
        return [normalize_dir_url(url) for url in dataset_url_or_urls]
    return normalize_dir_url(dataset_url_or_urls)


def make_reader(dataset_url, schema_fields=None, reader_pool_type='thread', workers_count=10,
                pyarrow_serialize=False, results_queue_size=50, seed=None, shuffle_rows=False,
                shuffle_row_groups=True, shuffle_row_drop_partitions=1, predicate=None, rowgroup_selector=None,
                num_epochs=1, cur_shard=None, shard_count=None, shard_seed=None, cache_type=NULL_CACHE,
                cache_location=None, cache_size_limit=None, cache_row_size_estimate=None,
                cache_extra_settings=None, hdfs_driver='libhdfs3', transform_spec=None, filters=None,
                storage_options=None, zmq_copy_buffers=True, filesystem=None,
                convert_early_to_numpy=False, shard_mode='row_groups', shard_remainder='pad') -> Reader:
    """A reader that yields one namedtuple per row of a Petastorm dataset, every field decoded.

    Args:
        dataset_url: dataset directory URL (``file:///...``, ``s3://...``, ``hdfs://...``, any fsspec URL).
        schema_fields: fields to read: ``UnischemaField`` s and/or regular expressions matching whole names.
        reader_pool_type: ``'thread'``, ``'process'`` or ``'dummy'`` (inline, the reference behaviour).
        workers_count: threads or processes reading and decoding row groups.
        pyarrow_serialize: deprecated, no effect.
        results_queue_size: upper bound on decoded row groups waiting for the consumer (see module doc).
        seed: makes the whole order (row groups, drop partitions, row shuffles) reproducible, identical for every
            pool kind and worker count. Row groups are re-shuffled every epoch from ``(seed, epoch)``.
        shuffle_rows: shuffle rows inside each row group (or drop partition).
        shuffle_row_groups: shuffle the order of row groups every epoch.
        shuffle_row_drop_partitions: split every row group into this many disjoint row ranges read separately.
        predicate: a :class:`~petastorm.predicates.PredicateBase`; its fields are read and decoded first.
        rowgroup_selector: a row-group selector (needs row-group indexes in the metadata).
        num_epochs: passes over the data; ``None`` means forever.
        cur_shard: this reader's shard (with ``shard_count``): row group ``i`` goes to shard ``i % shard_count``;
            with fewer row groups than shards, rows are split into equal contiguous ranges. ``'auto'``: the rank
            from ``torch.distributed`` (if initialized) or the launcher's environment (``RANK``, Horovod, MPI,
            SLURM), read once here; see :func:`petastorm.distributed.detect_rank_and_world_size`.
        shard_count: number of shards (``'auto'``: the world size, found as for ``cur_shard``).
        shard_seed: deprecated; use ``seed``.
        cache_type: ``'null'`` (default), ``'local-disk'``: keep the raw row-group columns read from the files
            in a local directory, for later epochs, or ``'local-disk-decoded'``: keep them with their images and
            arrays decoded, so later epochs skip the decoding too (see :mod:`petastorm.cache`). The cache is
            removed when the reader exits, as in Petastorm; pass ``cache_extra_settings={'cleanup': False}`` to
            keep it for later readers.
        cache_location, cache_size_limit, cache_row_size_estimate, cache_extra_settings: the directory, size limit
            (bytes), expected entry size and more settings of :class:`~petastorm.local_disk_cache.LocalDiskCache`.
        hdfs_driver: ``'libhdfs3'`` or ``'libhdfs'`` (for ``hdfs://`` URLs).
        transform_spec: a :class:`~petastorm.transform.TransformSpec` applied to each decoded row in the workers.
        filters: pyarrow DNF filters (``[('col', '>', 3)]``) applied to rows and used to skip row groups.
        storage_options: fsspec options (credentials, endpoint) for remote URLs.
        zmq_copy_buffers: deprecated, no effect.
        filesystem: a ready pyarrow or fsspec filesystem, instead of resolving the URL.
        convert_early_to_numpy: accepted for compatibility; decoding always happens in the workers.
        shard_mode: ``'row_groups'`` (default, Petastorm's sharding by whole row groups) or ``'rows'``: every
            epoch's global seeded order of rows is split into equal consecutive shares, so that every shard
            reads exactly the same number of rows per epoch (see ``docs/distributed.md``).
        shard_remainder: with ``shard_mode='rows'``, what happens to the fewer than ``shard_count`` rows left
            over: ``'pad'`` (default) repeats the first rows of the epoch's order, ``'drop_last'`` skips them.

    Returns:
        A :class:`Reader`: an iterator and context manager.
    """
    options = validate_options(
        dataset_url_or_urls=normalize_dataset_url_or_urls(dataset_url), batched_output=False,
        schema_fields=schema_fields, reader_pool_type=reader_pool_type, workers_count=workers_count,
        results_queue_size=results_queue_size, seed=seed, shuffle_rows=shuffle_rows,
        shuffle_row_groups=shuffle_row_groups, shuffle_row_drop_partitions=shuffle_row_drop_partitions,
        predicate=predicate, rowgroup_selector=rowgroup_selector, num_epochs=num_epochs, cur_shard=cur_shard,
        shard_count=shard_count, shard_seed=shard_seed, cache_type=cache_type, cache_location=cache_location,
        cache_size_limit=cache_size_limit, cache_row_size_estimate=cache_row_size_estimate,
        cache_extra_settings=cache_extra_settings, hdfs_driver=hdfs_driver, transform_spec=transform_spec,
        filters=filters, storage_options=storage_options, zmq_copy_buffers=zmq_copy_buffers, filesystem=filesystem,
        convert_early_to_numpy=convert_early_to_numpy, pyarrow_serialize=pyarrow_serialize, shard_mode=shard_mode,
        shard_remainder=shard_remainder)
    return Reader(options)


def make_batch_reader(dataset_url_or_urls, schema_fields=None, reader_pool_type='thread', workers_count=10,
                      results_queue_size=50, seed=None, shuffle_rows=False, shuffle_row_groups=True,
                      shuffle_row_drop_partitions=1, predicate=None, rowgroup_selector=None, num_epochs=1,
                      cur_shard=None, shard_count=None, shard_seed=None, cache_type='null', cache_location=None,
                      cache_size_limit=None, cache_row_size_estimate=None, cache_extra_settings=None,
                      hdfs_driver='libhdfs3', transform_spec=None, filters=None, storage_options=None,
                      zmq_copy_buffers=True, filesystem=None, convert_early_to_numpy=False,
                      shard_mode='row_groups', shard_remainder='pad') -> Reader:
    """A reader that yields one namedtuple of numpy column arrays per row group (or drop partition).

    Reads any Parquet store: with Petastorm metadata (codec columns are decoded) or without (the schema is
    inferred from the Parquet schema), a directory or a list of file URLs. The arguments are those of
    :func:`make_reader`, except that a ``TransformSpec`` function receives and returns a pandas DataFrame, and a
    predicate without a vectorized ``evaluate`` receives a DataFrame and returns a boolean Series.
    """
    options = validate_options(
        dataset_url_or_urls=normalize_dataset_url_or_urls(dataset_url_or_urls), batched_output=True,
        schema_fields=schema_fields, reader_pool_type=reader_pool_type, workers_count=workers_count,
        results_queue_size=results_queue_size, seed=seed, shuffle_rows=shuffle_rows,
        shuffle_row_groups=shuffle_row_groups, shuffle_row_drop_partitions=shuffle_row_drop_partitions,
        predicate=predicate, rowgroup_selector=rowgroup_selector, num_epochs=num_epochs, cur_shard=cur_shard,
        shard_count=shard_count, shard_seed=shard_seed, cache_type=cache_type, cache_location=cache_location,
        cache_size_limit=cache_size_limit, cache_row_size_estimate=cache_row_size_estimate,
        cache_extra_settings=cache_extra_settings, hdfs_driver=hdfs_driver, transform_spec=transform_spec,
        filters=filters, storage_options=storage_options, zmq_copy_buffers=zmq_copy_buffers, filesystem=filesystem,
        convert_early_to_numpy=convert_early_to_numpy, shard_mode=shard_mode, shard_remainder=shard_remainder)
    return Reader(options)


class Reader(ResumableReader):
    """An iterator over a dataset, made by :func:`make_reader` (rows) or :func:`make_batch_reader` (batches).

    Use it as a context manager, or call :meth:`stop` and :meth:`join` when done.

    Attributes:
        schema: the Unischema of what is yielded (after field selection and the transform).
        dataset: the opened store (files, metadata).
        ngram: the NGram given as ``schema_fields``, or None.
        num_epochs: epochs per pass.
        last_row_consumed: True once every epoch was delivered.
        is_batched_reader: True for ``make_batch_reader``.
        cache: the cache of row groups (a ``NullCache`` unless ``cache_type`` is a local-disk type).
    """

    def __init__(self, options: ReaderOptions, *, time_stages: bool = False):
        self._options = options
        # Opt-in profile of where the time goes (benchmarks); None costs nothing per work item.
        self._stage_totals = StageTotals() if time_stages else None
        self.is_batched_reader = options.batched_output
        self.ngram = options.schema_fields if isinstance(options.schema_fields, NGram) else None
        check_ngram_options(self.ngram, options)
        self.num_epochs = options.num_epochs
        self.last_row_consumed = False
        self.stopped = False
        self._lock = threading.Lock()
        self.cache = make_cache(options.cache_type, options.cache_location, options.cache_size_limit,
                                options.cache_row_size_estimate, options.cache_extra_settings)
        location = resolve_location(options.dataset_url_or_urls, options.storage_options, options.filesystem)
        self.dataset = open_store(location)
        stored = load_schema(self.dataset, options.batched_output)
        view = select_fields(stored, options.schema_fields, options.dataset_url_or_urls)
        self.schema = transform_schema(view, options.transform_spec)
        context = self._make_context(stored, view)
        pieces = load_row_groups(self.dataset)
        self._items = self._plan(stored, pieces, context)
        self._layout = self._shard_layout()
        self._position = StreamPosition(self._layout, Stage(0), 0)
        self._next_epoch = 0
        self._new_pass()
        self._pool = make_pool(options.reader_pool_type, options.workers_count,
                               max_in_flight=max(options.workers_count,
                                                 min(options.results_queue_size, 2 * options.workers_count)),
                               max_bytes_in_flight=default_max_bytes_in_flight())
        # Public: executors other than the pool (Ray Data read tasks) read work items with read_item and it.
        self.read_context = dataclasses.replace(context, pieces=tuple(pieces), time_stages=time_stages)
        self._pool.start(read_item, self.read_context)
        self._columns = self._batches()
        self._output = self._deliver()
        logger.info('reading %s: %d work items per epoch, %s pool with %d workers', options.dataset_url_or_urls,
                    len(self._items), options.reader_pool_type, options.workers_count)

    # -- construction steps -------------------------------------------------------------------------------------

    def _make_context(self, stored: Unischema, view: Unischema) -> ReadContext:
        options = self._options
        predicate_fields: list[UnischemaField] = []
        if options.predicate is not None:
            names = list(options.predicate.get_fields())
            if not names:
                raise ValueError(f'predicate {options.predicate!r} names no fields (get_fields() is empty)')
            unknown = [n for n in names if n not in stored.fields]
            if unknown:
                raise ValueError(f'predicate fields {unknown} are not fields of the dataset schema '
                                 f'({", ".join(stored.fields)})')
            predicate_fields = [stored.fields[n] for n in names]
        self._partition_predicate = options.predicate is not None and bool(self.dataset.partition_names) and {
            f.name for f in predicate_fields} <= set(self.dataset.partition_names)
        check_columns_exist(self.dataset, list(view.fields.values()) + predicate_fields)
        expression = filter_expression(options.filters)
        partition_names = tuple(self.dataset.partition_names)
        candidates = list(dict.fromkeys(list(stored.fields) + list(partition_names)))
        filter_columns = columns_of_expression(expression, candidates) if expression is not None else ()
        return ReadContext(
            filesystem=self.dataset.filesystem,
            pieces=(),  # filled by _plan
            fields=tuple(view.fields.values()),
            predicate_fields=tuple(predicate_fields) if not self._partition_predicate else (),
            predicate=None if self._partition_predicate else options.predicate,
            transform=options.transform_spec,
            result_fields=tuple(self.schema.fields),
            result_schema=self.schema if options.transform_spec is not None else None,
            batched_output=options.batched_output,
            shuffle_rows=options.shuffle_rows,
            filter_expression=expression,
            filter_columns=filter_columns,
            partition_names=partition_names,
            ngram=self.ngram,
            cache=self._row_group_cache(stored, filter_columns))

    def _row_group_cache(self, stored: Unischema, filter_columns: tuple[str, ...]) -> RowGroupCache | None:
        return make_row_group_cache(self._options.cache_type, self.cache, str(self.dataset.url),
                                    self.dataset.filesystem, self.dataset.files, stored.fields.values(), filter_columns)

    def _plan(self, stored: Unischema, pieces: list[RowGroupPiece], context: ReadContext) -> list[WorkItem]:
        options = self._options
        indexes = list(range(len(pieces)))
        if self._partition_predicate:
            indexes = prune_by_partition_predicate(pieces, indexes, stored, options.predicate)
        if options.rowgroup_selector is not None:
            indexes = apply_selector(self.dataset, indexes, options.rowgroup_selector)
        if context.filter_expression is not None:
            indexes = prune_by_statistics(self.dataset, pieces, indexes, context.filter_expression)
        self._filters_exact = set(context.filter_columns) <= set(self.dataset.partition_names)
        piece_rows = [(i, pieces[i].num_rows) for i in indexes]
        if options.shard_mode == 'rows':  # every shard plans all items; ShardLayout gives each its share
            items = shard_items(piece_rows, None, None)
        else:
            items = shard_items(piece_rows, options.cur_shard, options.shard_count)
        items = split_drop_partitions(items, options.shuffle_row_drop_partitions)
        if not items:
            warnings.warn('No matching data is available for loading after rowgroup selector were applied and the '
                          'data was sharded.', UserWarning, stacklevel=4)
        return items

    # -- delivery -----------------------------------------------------------------------------------------------

    def _batches(self) -> Iterator[dict[str, Any]]:
        self._started = True
        layout = self._layout
        first, pass_start = self._pass
        tags: deque[tuple[Stage, list, int, int]] = deque()  # what each submitted unit is, in submission order

        def submit(stage: Stage) -> Iterator[Any]:
            scheduled, main_from = layout.units(stage)
            for index, unit in enumerate(scheduled):
                tags.append((stage, scheduled, main_from, index))
                yield unit

        def units() -> Iterator[Any]:
            for stage in self._pass_stages(first, pass_start):
                yield from submit(stage)

        results = self._pool.imap(units())
        if self._stage_totals is not None:
            results = self._stage_totals.timed(results)
        for result in results:
            tag = tags.popleft()
            if result[META]['num_rows']:
                self._position.begin(*tag, result[META])
                yield result

    def _deliver(self) -> Iterator[Any]:
        if self.ngram is not None:
            return self._deliver_windows()
        if self.is_batched_reader:
            return self._deliver_batches()
        return self._deliver_rows()

    def _deliver_batches(self) -> Iterator[Any]:
        make = self.schema._get_namedtuple()
        for batch in self._columns:
            yield make(**{name: batch[name] for name in self.schema.fields})

    def _deliver_windows(self) -> Iterator[Any]:
        """NGram output: ``{offset: row view}`` per window (rows) or per batch of windows (batches)."""
        assert self.ngram is not None
        base = min(self.ngram.fields)
        views = {offset: self.ngram.get_schema_at_timestep(self.schema, offset)
                 for offset in range(base, base + self.ngram.length)}
        for batch in self._columns:
            starts = batch[NGRAM_STARTS]
            if self.is_batched_reader:
                yield {offset: view.make_namedtuple(**{name: batch[name][starts + offset - base]
                                                       for name in view.fields})
                       for offset, view in views.items()}
                continue
            makers = {offset: (view._get_namedtuple()._make, list(view.fields)) for offset, view in views.items()}
            for start in starts.tolist():
                yield {offset: make([batch[name][start + offset - base] for name in names])
                       for offset, (make, names) in makers.items()}

    def _deliver_rows(self) -> Iterator[Any]:
        make = self.schema._get_namedtuple()._make
        names = list(self.schema.fields)
        for batch in self._columns:
            if batch[META]['tuple']:
                width = len(batch) - 1
                yield from zip(*(batch[str(i)] for i in range(width)), strict=True)
            elif names:
                yield from map(make, zip(*(batch[name] for name in names), strict=True))

    # -- iterator protocol --------------------------------------------------------------------------------------

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self.stopped:
                raise RuntimeError(_STOPPED_MESSAGE)
            try:
                item = next(self._output)
            except StopIteration:
                self.last_row_consumed = True
                raise
            self._position.delivered(None if self.is_batched_reader else 1)
            return item

    def next(self) -> Any:
        """Same as ``next(reader)``."""
        return self.__next__()

    def iter_column_batches(self) -> Iterator[dict[str, Any]]:
        """Yield the decoded columns of each work item (a row group or part of one), for loaders that batch.

        Each item is a dict ``{field name: numpy column}`` (all columns of the same length, at least one row) plus
        the key ``'.meta'`` holding ``{'num_rows': n, 'tuple': bool}``; when a ``make_reader`` transform returns
        tuples, ``'tuple'`` is True and the columns are named ``'0'``, ``'1'``, ... by position. It draws from the
        same stream as ``next(reader)`` (rows already cut from a column batch by ``next`` are not repeated), ends
        the pass like ``next`` does (so :meth:`reset` starts another one), and raises ``RuntimeError`` after
        :meth:`stop`. ``'.meta'`` also holds ``'row_ids'``: numbers naming each row (for loaders that save
        their position, see :func:`petastorm.distributed.runs_of_rows`), or None when a transform hid them.
        Arrays may be read-only views of Arrow memory: copy before writing to them.
        """
        while True:
            with self._lock:
                if self.stopped:
                    raise RuntimeError(_STOPPED_MESSAGE)
                try:
                    batch = next(self._columns)
                except StopIteration:
                    self.last_row_consumed = True
                    return
                self._position.delivered()
                batch[META]['row_ids'] = self._position.current_rows()
            yield batch

    @property
    def work_items(self) -> tuple[WorkItem, ...]:
        """This shard's work items of one epoch (row ranges of the selected row groups), in piece order."""
        return tuple(self._items)

    @property
    def seed(self) -> int | None:
        """The ``seed`` the reader was made with (None when unseeded)."""
        return self._options.seed

    @property
    def transform_spec(self) -> TransformSpec | None:
        """The ``transform_spec`` the reader was made with (None when rows are delivered as decoded)."""
        return self._options.transform_spec

    def reset(self) -> None:
        """Start another ``num_epochs`` pass (with new per-epoch orders); allowed only after the data ran out."""
        with self._lock:
            if not self.last_row_consumed:
                raise NotImplementedError('Currently do not support resetting a reader while in the middle of '
                                          'iteration. You can reset the reader only after all samples were consumed.')
            if self.stopped:
                raise RuntimeError(_STOPPED_MESSAGE)
            self.last_row_consumed = False
            self._new_pass()
            self._columns = self._batches()
            self._output = self._deliver()

    @property
    def batched_output(self) -> bool:
        """True when each item is a batch of rows (``make_batch_reader``)."""
        return self.is_batched_reader

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Counters of the worker pool and the plan; with ``time_stages``, also ``'stages'`` (seconds per stage).

        Petastorm's names are there too, for every pool kind: ``output_queue_size`` (items handed to the workers
        whose results the reader has not taken yet), ``items_consumed`` (items handed to the workers),
        ``items_produced`` (results taken) and ``items_inprocess`` (the difference).
        """
        pool = self._pool.diagnostics
        submitted, completed = pool.get('items_submitted', 0), pool.get('items_completed', 0)
        info = {**pool, 'work_items_per_epoch': len(self._items), **self._shard_diagnostics(),
                'output_queue_size': pool.get('in_flight', submitted - completed), 'items_consumed': submitted,
                'items_produced': completed, 'items_inprocess': submitted - completed}
        if self._stage_totals is not None:
            info['stages'] = self._stage_totals.snapshot()
        return info

    def stop(self) -> None:
        """Stop reading (non-blocking); iteration afterwards raises ``RuntimeError``."""
        self.stopped = True
        self._pool.stop()

    def join(self) -> None:
        """Wait until every worker has finished (call after :meth:`stop`)."""
        for stream in (self._output, self._columns):
            close = getattr(stream, 'close', None)
            if close is not None and self.stopped:
                try:
                    close()
                except (RuntimeError, ValueError):  # closing a generator another thread is running
                    logger.debug('reader output was still running when joined')
        self._pool.join()

    def cleanup_cache(self) -> None:
        """Remove the local disk cache and print ``Cache cleanup complete.``, as Petastorm did.

        The cache is kept when made with ``cache_extra_settings={'cleanup': False}``; with the null cache only the
        line is printed. An ``OSError`` or ``AttributeError`` raised while cleaning is printed (``Error cleaning
        cache: ...``), not raised. A reader's ``with`` exit cleans the cache too, but prints nothing (a failure is
        logged instead).
        """
        error = self._release_cache()
        # print, not logging: Petastorm printed these lines, and scripts may look for them.
        if error is not None:
            print(f'Error cleaning cache: {error}', flush=True)
        print('Cache cleanup complete.', flush=True)

    def _release_cache(self) -> BaseException | None:
        try:
            self.cache.cleanup()
        except (OSError, AttributeError) as err:
            return err
        return None

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
        error = self._release_cache()
        if error is not None:
            logger.warning('could not clean up the cache %r: %s', self.cache, error)

