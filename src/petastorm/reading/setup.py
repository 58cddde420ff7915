"""From checked options to a planned read: everything a reader knows before its workers start.

:func:`set_up_reader` does the steps in order: resolve the URL to a filesystem and open the store, load its
schema and select the fields, check what the predicate and filters need, list the row groups, let storage read
what the planner needs (row-group indexes, filter statistics), plan this shard's epochs, and build the one context
every worker receives. The Ray datasource plans its read tasks with it too, without a reader.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from petastorm._warnings import warn_user
from petastorm.cache import CacheBase, FileStamp, FooterCache, NullCache, make_cache, make_row_group_cache
from petastorm.metadata.row_group_indexes import load_row_group_indexes
from petastorm.metadata.schemas import stored_or_inferred_schema
from petastorm.ngram import NGram
from petastorm.plan import RowMatches, ShardLayout, make_layout, select_row_groups
from petastorm.reading.column_transform import TransformTarget
from petastorm.reading.inputs import check_columns_exist, check_ngram_options, select_fields
from petastorm.reading.options import ReaderOptions
from petastorm.reading.worker import ReadContext, row_group_matches
from petastorm.store.filters import columns_of_expression, filter_expression
from petastorm.store.footers import store_data_files
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_any_store
from petastorm.transform import transform_schema
from petastorm.unischema import Unischema, UnischemaField, struct_leaf_paths, struct_type_of_field

__all__ = ['ReaderSetup', 'set_up_reader']

_MAX_COUNTING_THREADS = 16


@dataclass(frozen=True)
class ReaderSetup:
    """A planned read.

    Attributes:
        dataset: the opened store.
        schema: what is delivered: the selected fields after the transform.
        ngram: the NGram given as ``schema_fields``, or None.
        cache: the cache of raw row groups (a ``NullCache`` unless asked for); its owner cleans it up.
        context: what every worker receives.
        layout: this shard's epochs.
        rows_known: the rows each epoch delivers are known before reading: no NGram, no batch transform function
            (which may drop rows), and the rows a predicate or filters keep were counted (``count_rows``),
            decided by the footers' statistics, or chosen by partition directories.
        row_matches: the rows each row group keeps through the predicate and filters, where not all of them (by
            piece index; see :func:`petastorm.plan.kept_rows`); None when every row of the layout is delivered.
        schema_inferred: the store has no Petastorm metadata: its schema was inferred from the Parquet schema.
    """

    dataset: ParquetStore
    schema: Unischema
    ngram: NGram | None
    cache: CacheBase
    context: ReadContext
    layout: ShardLayout
    rows_known: bool
    row_matches: RowMatches | None = None
    schema_inferred: bool = False


def set_up_reader(options: ReaderOptions, *, time_stages: bool = False) -> ReaderSetup:
    """Open the store of ``options`` and plan its read.

    Args:
        options: checked reader options.
        time_stages: the workers measure the seconds of each stage (see :mod:`petastorm.stage_timing`).

    Raises:
        Whatever opening the store, reading its metadata and planning raise, before any data is read.
    """
    ngram = options.schema_fields if isinstance(options.schema_fields, NGram) else None
    check_ngram_options(ngram, options)
    cache = make_cache(options.cache_type, options.cache_location, options.cache_size_limit,
                       options.cache_row_size_estimate, options.cache_extra_settings)
    # A Delta or Iceberg table is opened at its version (its log planned the row groups); else a Parquet store.
    dataset = open_any_store(options.dataset_url_or_urls, storage_options=options.storage_options,
                             filesystem=options.filesystem, table_format=options.table_format,
                             table_version=options.table_version)
    if not isinstance(cache, NullCache):
        # Before anything reads a footer: a later reader of the unchanged store plans without asking for them.
        store_data_files(dataset, FooterCache(cache, str(dataset.url), _listed_stamps(dataset)))
    stored, schema_inferred = stored_or_inferred_schema(dataset)
    view = select_fields(stored, options.schema_fields, options.dataset_url_or_urls)
    schema = transform_schema(view, options.transform_spec)
    predicate_fields = _predicate_fields(options, stored)
    # A predicate on partition fields only is decided per directory, when planning; no worker evaluates it.
    partition_predicate = bool(predicate_fields) and bool(dataset.partition_names) and {
        f.name for f in predicate_fields} <= set(dataset.partition_names)
    check_columns_exist(dataset, list(view.fields.values()) + predicate_fields)
    for field in list(view.fields.values()) + predicate_fields:  # before any worker starts: one error, here
        if field.codec is not None:
            field.codec.check_available('decode')
    file_columns, unified_types = _conformance(dataset, list(view.fields.values()) + predicate_fields)
    expression = filter_expression(options.filters)
    pieces = dataset.row_groups()
    statistics = dataset.filter_statistics(expression) if expression is not None else None
    selected = select_row_groups(
        pieces, stored, partition_predicate=options.predicate if partition_predicate else None,
        selector=options.rowgroup_selector,
        indexes=load_row_group_indexes(dataset) if options.rowgroup_selector is not None else None,
        matching=statistics.matching if statistics is not None else None,
        url=dataset.url)
    # Unseeded readers draw a seed here: every epoch's order is then known, so that positions can be saved.
    seed = options.seed if options.seed is not None else int(np.random.default_rng().integers(2**62))
    layout = make_layout(pieces, selected, options.shard, seed=seed, shuffle_row_groups=options.shuffle_row_groups,
                         shuffle_rows=options.shuffle_rows, drop_partitions=options.shuffle_row_drop_partitions,
                         table_version=dataset.version_key())
    if not layout.items:
        warn_user('No matching data is available for loading after rowgroup selector were applied and the data '
                  'was sharded.')
    candidates = list(dict.fromkeys(list(stored.fields) + list(dataset.partition_names)))
    filter_columns = columns_of_expression(expression, candidates) if expression is not None else ()
    context = ReadContext(
        filesystem=dataset.filesystem, pieces=tuple(pieces), fields=tuple(view.fields.values()),
        predicate_fields=() if partition_predicate else tuple(predicate_fields),
        predicate=None if partition_predicate else options.predicate, batched_output=options.batched_output,
        shuffle_rows=options.shuffle_rows, filter_expression=expression, filter_columns=filter_columns,
        partition_names=tuple(dataset.partition_names), transform=_transform_target(options, schema, view), ngram=ngram,
        time_stages=time_stages, column_paths=_column_paths(list(view.fields.values()) + predicate_fields),
        file_columns=file_columns, unified_types=unified_types, data_files=store_data_files(dataset),
        cache=make_row_group_cache(options.cache_type, cache, str(dataset.url), dataset.filesystem, dataset.files,
                                   stored.fields.values(), filter_columns, _listed_stamps(dataset)))
    # Which rows an epoch holds is known before reading unless rows are chosen by looking at them: then the
    # statistics may still decide every row group, or the caller asks for them to be counted.
    worker_predicate = options.predicate is not None and not partition_predicate
    read_here = sorted({item.piece_index for item in layout.items})  # this shard's row groups only
    undecided = [i for i in read_here if worker_predicate or (
        statistics is not None and (pieces[i].path, pieces[i].row_group) not in statistics.matching_all)]
    countable = ngram is None and not _batch_function(options)
    if options.count_rows and not countable:
        raise ValueError('count_rows=True cannot count the rows of an NGram reader (its items are windows) or of '
                         'a make_batch_reader whose TransformSpec has a function (it may drop rows): leave '
                         'count_rows out')
    rows_known = countable and (not undecided or options.count_rows)
    row_matches = _count_matches(context, undecided, options.workers_count) if rows_known and undecided else None
    return ReaderSetup(dataset, schema, ngram, cache, context, layout, rows_known, row_matches, schema_inferred)


def _count_matches(context: ReadContext, piece_indexes: list[int], workers_count: int) -> RowMatches:
    """The rows each row group keeps (``count_rows``): filter and predicate columns only, read in threads."""
    counting = dataclasses.replace(context, cache=None)  # the cache holds whole row groups, as the workers read them
    with ThreadPoolExecutor(max_workers=max(1, min(workers_count, _MAX_COUNTING_THREADS, len(piece_indexes))),
                            thread_name_prefix='petastorm-count') as pool:
        masks = pool.map(lambda index: row_group_matches(counting, index), piece_indexes)
        return {index: mask for index, mask in zip(piece_indexes, masks, strict=True) if not mask.all()}


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


def _batch_function(options: ReaderOptions) -> bool:
    """A ``make_batch_reader`` transform function: it may drop rows."""
    spec = options.transform_spec
    return options.batched_output and spec is not None and spec.func is not None


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
