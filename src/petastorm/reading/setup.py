"""From checked options to a planned read: everything a reader knows before its workers start.

:func:`set_up_reader` does the steps in order, each a function of this module: open the store, whatever its kind
(``_open_store``: :func:`petastorm.store.opening.open_any_store`; its plan shared by the ranks of a job, a node's
processes and later runs, :mod:`petastorm.reading.job_plan`), load its schema and select and check the fields
(``_select_fields``), list the row groups and ask the store what the filters' statistics say, plan this shard's
epochs (``_plan``), build the one context every worker receives (``_read_context``), and tell whether the rows of
an epoch are known before reading them, counting them when asked (:mod:`petastorm.reading.counting`). The Ray
datasource plans its read tasks with it too, without a reader.

A reader (``stream=True``) of a plain store whose row groups only its footers give does not wait for them when
the order of its first epoch allows (:mod:`petastorm.reading.streamed_plan`): the footers are read behind it, and
the plan (``ReaderSetup.layout``, ``rows_known``, ``row_matches``) is made, by the same functions, when it is
first asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._warnings import warn_user
from petastorm.cache import CacheBase, FileStamp, FooterCache, NullCache, make_cache, make_row_group_cache
from petastorm.metadata.row_group_indexes import load_row_group_indexes
from petastorm.metadata.schemas import stored_or_inferred_schema
from petastorm.ngram import NGram
from petastorm.plan import RowMatches, ShardLayout, make_layout, select_row_groups
from petastorm.reading.categories import coded_view
from petastorm.reading.column_transform import TransformTarget
from petastorm.reading.counting import epoch_rows, in_threads, rows_known_unfiltered
from petastorm.reading.inputs import check_columns_exist, check_ngram_options, select_fields
from petastorm.reading.job_plan import open_for_the_job, reads_the_footers, share_plan
from petastorm.reading.options import NULL_CACHE, ReaderOptions
from petastorm.reading.streamed_plan import PlannedEpochs, StreamedPlan, can_stream
from petastorm.reading.worker import ReadContext, read_whole_row_group
from petastorm.store.filters import columns_of_expression, filter_expression
from petastorm.store.footers import store_data_files
from petastorm.store.model import FilterStatistics, ParquetStore
from petastorm.store.opening import open_any_store
from petastorm.store.pieces import RowGroupPiece
from petastorm.store.plain import PlainStore, warn_if_deprecated_metadata
from petastorm.transform import transform_schema
from petastorm.unischema import Unischema, UnischemaField, struct_leaf_paths, struct_type_of_field

__all__ = ['ReaderSetup', 'set_up_reader']


@dataclass(frozen=True)
class ReaderSetup:
    """A planned read.

    Attributes:
        dataset: the opened store.
        schema: what is delivered: the selected fields after the transform.
        ngram: the NGram given as ``schema_fields``, or None.
        cache: the cache of raw row groups (a ``NullCache`` unless asked for); its owner cleans it up.
        context: what every worker receives.
        planned: the layout and what is known of the rows (None while ``streamed`` plans: see the properties).
        schema_inferred: the store has no Petastorm metadata: its schema was inferred from the Parquet schema.
        streamed: the plan being made as the store's footers are read, when the first epoch does not wait for it
            (:mod:`petastorm.reading.streamed_plan`); its owner stops and joins it.
        streamed_rows_known: while ``streamed`` plans, what ``rows_known`` will be (the options tell it).
    """

    dataset: ParquetStore
    schema: Unischema
    ngram: NGram | None
    cache: CacheBase
    context: ReadContext
    planned: PlannedEpochs | None
    schema_inferred: bool = False
    streamed: StreamedPlan | None = None
    streamed_rows_known: bool = False

    def epochs(self) -> PlannedEpochs:
        """The plan: made already, or made now from every footer (waiting for them)."""
        if self.planned is not None:
            return self.planned
        assert self.streamed is not None, 'a ReaderSetup without a plan plans as its footers come'
        return self.streamed.planned()

    @property
    def layout(self) -> ShardLayout:
        """This shard's epochs (waits for the whole plan)."""
        return self.epochs().layout

    @property
    def rows_known(self) -> bool:
        """The rows each epoch delivers are known before reading.

        No NGram, no batch transform function (which may drop rows), and the rows a predicate or filters keep
        were counted (``count_rows``), decided by the footers' statistics, or chosen by partition directories.
        Told without waiting for a streamed plan.
        """
        if self.planned is None:
            return self.streamed_rows_known
        return self.planned.rows_known

    @property
    def row_matches(self) -> RowMatches | None:
        """The rows each row group keeps through the predicate and filters, where not all of them.

        By piece index (see :func:`petastorm.plan.kept_rows`); None when every row of the layout is delivered.
        """
        return self.epochs().row_matches


def set_up_reader(options: ReaderOptions, *, time_stages: bool = False, stream: bool = False) -> ReaderSetup:
    """Open the store of ``options`` and plan its read.

    Args:
        options: checked reader options.
        time_stages: the workers measure the seconds of each stage (see :mod:`petastorm.stage_timing`).
        stream: plan as the footers come when the options allow (for a reader, which stops and joins
            ``ReaderSetup.streamed``); otherwise every footer is read here.

    Raises:
        Whatever opening the store, reading its metadata and planning raise, before any data is read (while
        streaming, what reading a later footer raises comes when its rows or the whole plan are asked for).
    """
    ngram = options.schema_fields if isinstance(options.schema_fields, NGram) else None
    check_ngram_options(ngram, options)
    cache = make_cache(options.cache_type, options.cache_location, options.cache_size_limit,
                       options.cache_row_size_estimate, options.cache_extra_settings)
    dataset = _open_store(options, cache)
    # Unseeded readers draw a seed here: every epoch's order is then known, so that positions can be saved.
    seed = options.seed if options.seed is not None else int(np.random.default_rng().integers(2**62))
    if stream and isinstance(dataset, PlainStore) and can_stream(options, dataset):
        return _set_up_streamed(options, dataset, cache, ngram, seed, time_stages)
    fields = _select_fields(options, dataset)
    expression = filter_expression(options.filters)
    pieces = dataset.row_groups()
    fields = _with_category_codes(options, dataset, pieces, fields)
    statistics = dataset.filter_statistics(expression) if expression is not None else None
    context = _read_context(options, dataset, tuple(pieces), fields, expression, ngram, cache, time_stages)
    planned = _planned(options, dataset, pieces, fields, statistics, seed, context)
    return ReaderSetup(dataset, fields.schema, ngram, cache, context, planned, fields.inferred)


def _set_up_streamed(options: ReaderOptions, dataset: PlainStore, cache: CacheBase, ngram: NGram | None, seed: int,
                     time_stages: bool) -> ReaderSetup:
    """``set_up_reader`` for a store planned as its footers come: the plan is made when first asked for."""
    warn_if_deprecated_metadata(dataset)
    streamed = StreamedPlan(dataset, options.shard, seed, options.shuffle_row_drop_partitions)
    try:
        streamed.start()
        fields = _select_fields(options, dataset)
        context = _read_context(options, dataset, streamed.pieces, fields, None, ngram, cache, time_stages)
    except BaseException:
        streamed.join()
        raise
    streamed.finish_with(lambda: _planned(options, dataset, streamed.all_pieces(), fields, None, seed, context))
    return ReaderSetup(dataset, fields.schema, ngram, cache, context, None, fields.inferred, streamed,
                       rows_known_unfiltered(options, context))


def _planned(options: ReaderOptions, dataset: ParquetStore, pieces: list[RowGroupPiece], fields: _Fields,
             statistics: FilterStatistics | None, seed: int, context: ReadContext) -> PlannedEpochs:
    """This shard's epochs, and what is known of their rows before reading them."""
    layout = _plan(options, dataset, pieces, fields, statistics, seed)
    rows_known, row_matches = epoch_rows(options, context, layout, pieces, statistics,
                                         worker_predicate=context.predicate is not None)
    return PlannedEpochs(layout, rows_known, row_matches)


@dataclass(frozen=True)
class _Fields:
    """The fields of a read: the store's, those selected, those delivered, those the predicate reads."""

    #: the store's schema (stored, or inferred from its Parquet schema: see ``inferred``).
    stored: Unischema
    inferred: bool
    #: the fields selected (``schema_fields``).
    view: Unischema
    #: what is delivered: the selected fields after the transform.
    schema: Unischema
    #: the fields the predicate reads, checked against the stored schema.
    predicate_fields: list[UnischemaField]
    #: the predicate reads partition fields only: it is decided per row group when planning, by no worker.
    partition_predicate: bool

    @property
    def read(self) -> list[UnischemaField]:
        """Every field a worker may read: the selected ones, then the predicate's."""
        return list(self.view.fields.values()) + self.predicate_fields


def _open_store(options: ReaderOptions, cache: CacheBase) -> ParquetStore:
    """The store of ``options``, its footers kept in the reader's cache when it has one, its plan shared.

    A Delta or Iceberg table is opened at its version (its log planned the row groups); else a Parquet store, whose
    plan the ranks of a job, the processes sharing a cache and the runs sharing a plan file make once
    (:mod:`petastorm.reading.job_plan`).
    """
    # A reader that plans from the footers (alone, or rank 0 of a job) reads the first file's footer next (its
    # columns): far away, while the metadata is read.
    dataset = open_for_the_job(options, lambda look: open_any_store(
        options.dataset_url_or_urls, storage_options=options.storage_options, filesystem=options.filesystem,
        table_format=options.table_format, table_version=options.table_version, split=options.split,
        first_footer_ahead=reads_the_footers(options, cache), look=look))
    _keep_footers(dataset, cache)
    shared = share_plan(options, dataset, cache)
    if shared is not dataset:  # the job's listing, taken from rank 0
        _keep_footers(shared, cache)
    return shared


def _keep_footers(dataset: ParquetStore, cache: CacheBase) -> None:
    if not isinstance(cache, NullCache):
        # Before anything reads a footer: a later reader of the unchanged store plans without asking for them.
        store_data_files(dataset, FooterCache(cache, str(dataset.url), _listed_stamps(dataset)))


def _select_fields(options: ReaderOptions, dataset: ParquetStore) -> _Fields:
    """The store's schema, the fields selected and delivered, the predicate's; all checked before any is read."""
    stored, inferred = stored_or_inferred_schema(dataset)
    view = select_fields(stored, options.schema_fields, options.dataset_url_or_urls)
    schema = transform_schema(view, options.transform_spec)
    predicate_fields = _predicate_fields(options, stored)
    partition_predicate = bool(predicate_fields) and bool(dataset.partition_names) and {
        f.name for f in predicate_fields} <= set(dataset.partition_names)
    fields = _Fields(stored, inferred, view, schema, predicate_fields, partition_predicate)
    check_columns_exist(dataset, fields.read)
    for field in fields.read:  # before any worker starts: one error, here
        if field.codec is not None:
            field.codec.check_available('decode')
    return fields


def _with_category_codes(options: ReaderOptions, dataset: ParquetStore, pieces: list[RowGroupPiece],
                         fields: _Fields) -> _Fields:
    """``fields`` with those ``categorical_codes`` asks for delivered as codes (:mod:`petastorm.reading.categories`).

    Categories not given are read from every row group of the store (not only this shard's: every shard must
    give a value the same code).
    """
    if options.categorical_codes is False:
        return fields
    arrow_schema = dataset.logical_schema().arrow if options.categorical_codes is True else pa.schema([])
    probe = _read_context(dataclasses.replace(options, cache_type=NULL_CACHE, transform_spec=None), dataset, pieces,
                          fields, None, None, NullCache(), False)

    def read_columns(names: list[str]) -> list[pa.Table]:
        return in_threads(lambda index: read_whole_row_group(probe, index, names), range(len(pieces)),
                          options.workers_count)

    view = coded_view(fields.view, options.categorical_codes, arrow_schema, read_columns)
    if view is fields.view:
        return fields
    return dataclasses.replace(fields, view=view, schema=transform_schema(view, options.transform_spec))


def _plan(options: ReaderOptions, dataset: ParquetStore, pieces: list[RowGroupPiece], fields: _Fields,
          statistics: FilterStatistics | None, seed: int) -> ShardLayout:
    """This shard's epochs over the row groups the partition predicate, the selector and the statistics keep."""
    selected = select_row_groups(
        pieces, fields.stored, partition_predicate=options.predicate if fields.partition_predicate else None,
        selector=options.rowgroup_selector,
        indexes=load_row_group_indexes(dataset) if options.rowgroup_selector is not None else None,
        matching=statistics.matching if statistics is not None else None,
        url=dataset.url)
    layout = make_layout(pieces, selected, options.shard, seed=seed, shuffle_row_groups=options.shuffle_row_groups,
                         shuffle_rows=options.shuffle_rows, drop_partitions=options.shuffle_row_drop_partitions,
                         table_version=dataset.version_key())
    if not layout.items:
        warn_user('No matching data is available for loading after rowgroup selector were applied and the data '
                  'was sharded.')
    return layout


def _read_context(options: ReaderOptions, dataset: ParquetStore, pieces: Sequence[RowGroupPiece], fields: _Fields,
                  expression: Any, ngram: NGram | None, cache: CacheBase, time_stages: bool) -> ReadContext:
    """The one context every worker receives."""
    candidates = list(dict.fromkeys(list(fields.stored.fields) + list(dataset.partition_names)))
    filter_columns = columns_of_expression(expression, candidates) if expression is not None else ()
    file_columns, unified_types = _conformance(dataset, fields.read)
    view = fields.view
    return ReadContext(
        filesystem=dataset.filesystem, pieces=pieces, fields=tuple(view.fields.values()),
        predicate_fields=() if fields.partition_predicate else tuple(fields.predicate_fields),
        predicate=None if fields.partition_predicate else options.predicate, batched_output=options.batched_output,
        shuffle_rows=options.shuffle_rows, filter_expression=expression, filter_columns=filter_columns,
        partition_names=tuple(dataset.partition_names), transform=_transform_target(options, fields.schema, view),
        ngram=ngram, time_stages=time_stages, column_paths=_column_paths(fields.read), file_columns=file_columns,
        unified_types=unified_types, data_files=store_data_files(dataset),
        cache=make_row_group_cache(options.cache_type, cache, str(dataset.url), dataset.filesystem, dataset.files,
                                   fields.stored.fields.values(), filter_columns, _listed_stamps(dataset)))


def _listed_stamps(dataset: ParquetStore) -> dict[str, FileStamp]:
    """The size and time of the files the store's listing told both of (the cache asks for the others)."""
    return {path: FileStamp(size, dataset.file_mtimes[path]) for path, size in dataset.file_sizes.items()
            if path in dataset.file_mtimes}


def _transform_target(options: ReaderOptions, schema: Unischema, view: Unischema) -> TransformTarget | None:
    if options.transform_spec is None:
        return None
    return TransformTarget(options.transform_spec, tuple(schema.fields), schema, options.batched_output, view)


def _conformance(dataset: ParquetStore, fields: list[UnischemaField]) -> tuple[tuple, tuple]:
    """``(file_columns, unified_types)`` of the read context (empty when every file has the same schema).

    That is what the files that differ from the unified schema have, and the types the fields' columns are read as.
    """
    unified = dataset.reads.unified  # made when the schema was inferred from the files
    if unified is None or not unified.differs:
        return (), ()
    types = {}
    for field in fields:
        struct = struct_type_of_field(field)
        if struct is not None:
            types[field.name] = struct  # a struct read by its leaves has the fields the schema names
        elif field.name in unified.schema.names:
            types[field.name] = unified.schema.field(field.name).type
    return tuple(unified.file_columns.items()), tuple(types.items())


def _column_paths(fields: list[UnischemaField]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The fields read by Parquet paths: struct fields, by the paths of their leaves."""
    out = {}
    for field in fields:
        paths = struct_leaf_paths(field)
        if paths != [field.name]:
            out[field.name] = tuple(paths)
    return tuple(out.items())


def _predicate_fields(options: ReaderOptions, stored: Unischema) -> list[UnischemaField]:
    """The fields the predicate reads, checked against the stored schema."""
    if options.predicate is None:
        return []
    names = list(options.predicate.get_fields())
    if not names:
        raise ValueError(f'predicate {options.predicate!r} names no fields (get_fields() is empty)')
    unknown = [n for n in names if n not in stored.fields]
    if unknown:
        raise ValueError(f'predicate fields {unknown} are not fields of the dataset schema '
                         f'({", ".join(stored.fields)})')
    return [stored.fields[n] for n in names]
