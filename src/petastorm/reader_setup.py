"""From checked options to a planned read: everything a reader knows before its workers start.

:func:`set_up_reader` does the steps in order: resolve the URL to a filesystem and open the store, load its
schema and select the fields, check what the predicate and filters need, list the row groups, let storage read
what the planner needs (row-group indexes, filter statistics), plan this shard's epochs, and build the one context
every worker receives. The Ray datasource plans its read tasks with it too, without a reader.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from petastorm.cache import CacheBase, make_cache, make_row_group_cache
from petastorm.column_transform import TransformTarget
from petastorm.fs import resolve_location
from petastorm.metadata.filters import columns_of_expression, filter_expression, matching_row_groups
from petastorm.metadata.row_group_indexes import load_row_group_indexes
from petastorm.metadata.store import ParquetStore, load_row_groups, open_store
from petastorm.ngram import NGram
from petastorm.options import ReaderOptions
from petastorm.plan import ShardLayout, make_layout, select_row_groups
from petastorm.read import ReadContext
from petastorm.reader_inputs import check_columns_exist, check_ngram_options, load_schema, select_fields
from petastorm.transform import transform_schema
from petastorm.unischema import Unischema, UnischemaField, struct_leaf_paths, struct_type_of_field


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
        rows_known: the rows of an epoch are known before reading (no predicate or filter on stored columns, no
            NGram, no batch transform function, which may drop rows).
    """

    dataset: ParquetStore
    schema: Unischema
    ngram: NGram | None
    cache: CacheBase
    context: ReadContext
    layout: ShardLayout
    rows_known: bool


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
    dataset = open_store(resolve_location(options.dataset_url_or_urls, options.storage_options, options.filesystem))
    stored = load_schema(dataset, options.batched_output)
    view = select_fields(stored, options.schema_fields, options.dataset_url_or_urls)
    schema = transform_schema(view, options.transform_spec)
    predicate_fields = _predicate_fields(options, stored)
    # A predicate on partition fields only is decided per directory, when planning; no worker evaluates it.
    partition_predicate = bool(predicate_fields) and bool(dataset.partition_names) and {
        f.name for f in predicate_fields} <= set(dataset.partition_names)
    check_columns_exist(dataset, list(view.fields.values()) + predicate_fields)
    file_columns, unified_types = _conformance(dataset, list(view.fields.values()) + predicate_fields)
    expression = filter_expression(options.filters)
    pieces = load_row_groups(dataset)
    selected = select_row_groups(
        pieces, stored, partition_predicate=options.predicate if partition_predicate else None,
        selector=options.rowgroup_selector,
        indexes=load_row_group_indexes(dataset) if options.rowgroup_selector is not None else None,
        matching=matching_row_groups(dataset, expression) if expression is not None else None,
        url=dataset.url)
    # Unseeded readers draw a seed here: every epoch's order is then known, so that positions can be saved.
    seed = options.seed if options.seed is not None else int(np.random.default_rng().integers(2**62))
    layout = make_layout(pieces, selected, options.shard, seed=seed, shuffle_row_groups=options.shuffle_row_groups,
                         shuffle_rows=options.shuffle_rows, drop_partitions=options.shuffle_row_drop_partitions)
    if not layout.items:
        warnings.warn('No matching data is available for loading after rowgroup selector were applied and the '
                      'data was sharded.', UserWarning, stacklevel=4)
    candidates = list(dict.fromkeys(list(stored.fields) + list(dataset.partition_names)))
    filter_columns = columns_of_expression(expression, candidates) if expression is not None else ()
    context = ReadContext(
        filesystem=dataset.filesystem, pieces=tuple(pieces), fields=tuple(view.fields.values()),
        predicate_fields=() if partition_predicate else tuple(predicate_fields),
        predicate=None if partition_predicate else options.predicate, batched_output=options.batched_output,
        shuffle_rows=options.shuffle_rows, filter_expression=expression, filter_columns=filter_columns,
        partition_names=tuple(dataset.partition_names), transform=_transform_target(options, schema, view), ngram=ngram,
        time_stages=time_stages, column_paths=_column_paths(list(view.fields.values()) + predicate_fields),
        file_columns=file_columns, unified_types=unified_types,
        cache=make_row_group_cache(options.cache_type, cache, str(dataset.url), dataset.filesystem, dataset.files,
                                   stored.fields.values(), filter_columns))
    # Which rows an epoch holds is known before reading unless rows are chosen by looking at them.
    rows_known = ((options.predicate is None or partition_predicate) and ngram is None
                  and set(filter_columns) <= set(dataset.partition_names) and not _batch_function(options))
    return ReaderSetup(dataset, schema, ngram, cache, context, layout, rows_known)


def _transform_target(options: ReaderOptions, schema: Unischema, view: Unischema) -> TransformTarget | None:
    if options.transform_spec is None:
        return None
    return TransformTarget(options.transform_spec, tuple(schema.fields), schema, options.batched_output, view)


def _conformance(dataset: ParquetStore, fields: list[UnischemaField]) -> tuple[tuple, tuple]:
    """``(file_columns, unified_types)`` of the read context (empty when every file has the same schema).

    That is what the files that differ from the unified schema have, and the types the fields' columns are read as.
    """
    unified = dataset.memo.get('unified')  # made when the schema was inferred from the files
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
