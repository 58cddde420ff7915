"""Building and loading row-group indexes (``rowgroup_selector=`` uses them to read only some row groups).

Indexes are stored in ``_common_metadata`` as versioned JSON under :data:`INDEXES_JSON_KEY`. Indexes written by
Petastorm (a pickle under :data:`ROWGROUPS_INDEX_KEY`) are read through the guarded unpickler. The stored form and
its loading belong to the storage layer (:mod:`petastorm.metadata.row_group_indexes`); this module builds indexes.

``build_rowgroup_index(url, spark_context, indexers)`` distributes the work over Spark like Petastorm; pass
``spark_context=None`` to build the index on this machine with a thread pool instead (no Spark needed).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from petastorm._progress import ProgressMeter, SparkJobProgress, check_progress_argument
from petastorm.fs import resolve_location
from petastorm.metadata.row_group_indexes import (
    INDEXES_FORMAT_VERSION,
    RowGroupIndexerBase,
    indexes_to_json,
    load_row_group_indexes,
    storable_kind,
)
from petastorm.metadata.schemas import stored_schema
from petastorm.metadata.write import update_common_metadata
from petastorm.store.data_files import DataFiles
from petastorm.store.footers import store_data_files
from petastorm.store.keys import INDEXES_JSON_KEY, ROWGROUPS_INDEX_KEY
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_store
from petastorm.store.pieces import RowGroupPiece
from petastorm.store.row_groups import read_row_group
from petastorm.unischema import UnischemaField

__all__ = ['INDEXES_FORMAT_VERSION', 'INDEXES_JSON_KEY', 'PARALLEL_SLICE_NUM', 'ROWGROUPS_INDEX_KEY',
           'build_rowgroup_index', 'get_row_group_indexes']

logger = logging.getLogger(__name__)

#: Most Spark partitions used to build an index.
PARALLEL_SLICE_NUM = 2000


def _index_one_piece(files: DataFiles, piece: RowGroupPiece, piece_index: int,
                     fields: Sequence[UnischemaField], partition_names: Sequence[str],
                     indexers: Sequence[RowGroupIndexerBase]) -> list[RowGroupIndexerBase]:
    """Copies of ``indexers`` holding one row group's values.

    Each row group is indexed by its own copy of every indexer, as a Spark task indexes its deserialized copy:
    the local threads share the given objects. Hive partition columns are not in the files: their values come
    from the piece's directory, as in reading.
    """
    from petastorm.reading.worker import append_partition_columns, decode_columns

    file_columns = [f.name for f in fields if f.name not in partition_names]
    table = read_row_group(files, piece.path, piece.row_group, file_columns)
    table = append_partition_columns(table, piece, [f for f in fields if f.name in partition_names])
    columns = decode_columns(list(fields), table, f'{piece.path} (row group {piece.row_group})')
    return [copy.deepcopy(indexer).build_index(columns, piece_index) for indexer in indexers]


def _merge(left: list[RowGroupIndexerBase], right: list[RowGroupIndexerBase]) -> list[RowGroupIndexerBase]:
    return [a + b for a, b in zip(left, right, strict=True)]


def build_rowgroup_index(dataset_url: str, spark_context: Any, indexers: Sequence[RowGroupIndexerBase],
                         hdfs_driver: str = 'libhdfs3', storage_options: dict | None = None,
                         filesystem: Any = None, *, progress: bool | None = None) -> dict[str, RowGroupIndexerBase]:
    """Build the indexes and store them in the dataset's ``_common_metadata`` (call after the dataset is written).

    Args:
        dataset_url: the dataset directory.
        spark_context: a ``pyspark.SparkContext`` to distribute the work, or None to build locally with threads.
        indexers: e.g. ``[SingleFieldIndexer('id_index', 'id'), FieldNotNullIndexer('has_image', 'image')]``.
        hdfs_driver: accepted for compatibility.
        storage_options: fsspec options for remote URLs.
        filesystem: a ready filesystem instead of resolving the URL.
        progress: show the row groups indexed (Spark tasks with a ``spark_context``): None (default) draws a
            ``tqdm`` bar when it is installed and stderr is a terminal, else logs a line every few seconds; True
            always shows it; False never.

    Returns:
        ``{index name: indexer}`` as stored.

    Raises:
        ValueError: no indexers, duplicate index names, an indexer of no stored kind (see
            :func:`~petastorm.metadata.row_group_indexes.storable_kind`), an indexed field that is not in the
            dataset schema, or ``progress`` is not None, True or False.
    """
    progress = check_progress_argument(progress)
    indexers = list(indexers)
    if not indexers:
        raise ValueError('build_rowgroup_index needs at least one indexer')
    names = [i.index_name for i in indexers]
    if len(set(names)) != len(names):
        raise ValueError(f'index names must be unique, got {names}')
    unstorable = [type(i).__name__ for i in indexers if storable_kind(i) is None]
    if unstorable:
        raise ValueError(f'indexers {unstorable} cannot be stored: stored indexes are SingleFieldIndexer or '
                         f'FieldNotNullIndexer (or subclasses of them)')
    store = open_store(resolve_location(dataset_url, storage_options, filesystem))
    if store.root is None or store.subset:
        raise ValueError(f'row-group indexes are stored in a dataset directory; {dataset_url} names files')
    schema = stored_schema(store)
    columns = list(dict.fromkeys(c for i in indexers for c in i.column_names))
    unknown = [c for c in columns if c not in schema.fields]
    if unknown:
        raise ValueError(f'indexed fields {unknown} are not fields of the dataset {dataset_url} '
                         f'({", ".join(schema.fields)})')
    fields = [schema.fields[c] for c in columns]
    pieces = store.row_groups()
    partition_names = tuple(store.partition_names)
    files = store_data_files(store)
    if not pieces:
        raise ValueError(f'Cannot build index with empty decoded_rows: {dataset_url} has no row groups')
    description = f'indexing {dataset_url}'
    if spark_context is None:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix='petastorm-index') as pool, \
                ProgressMeter(description, len(pieces), 'row groups', progress, logger) as meter:
            parts = []
            for part in pool.map(lambda i: _index_one_piece(files, pieces[i], i, fields, partition_names, indexers),
                                 range(len(pieces))):
                parts.append(part)
                meter.update()
        merged = parts[0]
        for part in parts[1:]:
            merged = _merge(merged, part)
    else:
        slices = min(len(pieces), PARALLEL_SLICE_NUM)
        with SparkJobProgress(spark_context, description, progress, logger):
            merged = spark_context.parallelize(range(len(pieces)), slices) \
                .map(lambda i: _index_one_piece(files, pieces[i], i, fields, partition_names, indexers)) \
                .reduce(_merge)
    result = {indexer.index_name: indexer for indexer in merged}
    update_common_metadata(store.filesystem, store.root, {INDEXES_JSON_KEY: indexes_to_json(result)}, list(store.files))
    return result


def get_row_group_indexes(dataset: Any) -> dict[str, RowGroupIndexerBase]:
    """``{index name: indexer}`` stored in a dataset.

    Args:
        dataset: a dataset URL, or a store opened with :func:`petastorm.store.opening.open_store`.

    Raises:
        ValueError: the dataset has no ``_common_metadata`` or no row-group indexes in it.
        PetastormMetadataError: the stored indexes are malformed, from a newer format, or a refused pickle.
    """
    store = dataset if isinstance(dataset, ParquetStore) else open_store(resolve_location(dataset))
    return load_row_group_indexes(store)
