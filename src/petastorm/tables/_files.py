"""From the data files a table's log lists to the reader's row-group pieces, with their deletes.

Both formats end here: the log gives the data files of the version, their partition values, statistics and
deleted rows; the Parquet footers (read in parallel, as for plain Parquet) give the row groups and which stored
column holds each logical column (by field id, by physical name or by name, as the format says). The deleted
rows of a file become one mask per row group, and a piece's ``num_rows`` counts its live rows only: sharding,
equal shares, shuffles and positions all work on the rows of the version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._compat import is_binary_view, is_list_view, is_string_view
from petastorm.errors import CorruptDataError, PetastormMetadataError, StorageNotFoundError
from petastorm.store.pieces import RowGroupPiece
from petastorm.tables._model import TableFile
from petastorm.tables.read import TableRowGroup

_FIELD_ID = b'PARQUET:field_id'
_MAX_FOOTER_READERS = 16


@dataclass(frozen=True)
class StoredColumn:
    """Where one logical column of a table is found in its data files.

    Attributes:
        name: the logical name (what readers deliver).
        arrow_type: the table's type of the column.
        stored_name: the name data files store it under (the physical name with Delta column mapping).
        field_id: the field id files carry for it, or None.
    """

    name: str
    arrow_type: pa.DataType
    stored_name: str
    field_id: int | None = None


@dataclass(frozen=True)
class DataFileEntry:
    """A data file of a table version, as its log describes it.

    Attributes:
        path: the file on the table's filesystem.
        constants: ``(column, table type, value)`` of its partition columns.
        deleted: positions (in the file) of the stored rows the version deleted, sorted, or None.
        guarantee: what the log's statistics say every row of the file satisfies, or None.
        record_count: rows the log says the file stores, or None.
    """

    path: str
    constants: tuple[tuple[str, pa.DataType, Any], ...] = ()
    deleted: np.ndarray | None = None
    guarantee: Any = None
    record_count: int | None = None


@dataclass(frozen=True)
class PlannedFiles:
    """The pieces of a version and what was learnt while planning them."""

    pieces: tuple[RowGroupPiece, ...]
    files: dict[str, TableFile]
    footers: dict[str, pq.FileMetaData]
    deleted_rows: int


def normalized_type(arrow_type: pa.DataType) -> pa.DataType:
    """The type a Parquet file is read as for a table type: large strings and lists become regular ones."""
    if pa.types.is_large_string(arrow_type) or is_string_view(arrow_type):
        return pa.string()
    if pa.types.is_large_binary(arrow_type) or is_binary_view(arrow_type):
        return pa.binary()
    if pa.types.is_large_list(arrow_type) or is_list_view(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(normalized_type(arrow_type.value_type)))
    if pa.types.is_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(normalized_type(arrow_type.value_type)))
    if pa.types.is_struct(arrow_type):
        return pa.struct([f.with_type(normalized_type(f.type)) for f in arrow_type])
    return arrow_type


def read_footers(filesystem: pafs.FileSystem, paths: Sequence[str], what: str) -> dict[str, pq.FileMetaData]:
    """The Parquet footers of ``paths`` (up to 16 read at a time from remote storage).

    Raises:
        StorageNotFoundError: a file the log lists does not exist (the table was vacuumed past this version?).
        PetastormMetadataError: a file is not readable Parquet.
    """
    def read(path: str) -> pq.FileMetaData:
        try:
            with filesystem.open_input_file(path) as f:
                return pq.read_metadata(f)
        except FileNotFoundError as err:
            raise StorageNotFoundError(f'data file {path} of {what} does not exist: the log lists it but the '
                                       f'storage does not have it (removed by a vacuum or by hand?)') from err
        except (OSError, pa.ArrowException) as err:
            if isinstance(err, OSError) and err.errno is not None:
                raise
            raise PetastormMetadataError(f'data file {path} of {what} is not a readable Parquet file: {err}') from err

    return dict(zip(paths, map_on_storage(filesystem, read, paths, _MAX_FOOTER_READERS), strict=True))


def map_on_storage(filesystem: pafs.FileSystem, function: Callable[[Any], Any], items: Sequence[Any],
                   max_threads: int) -> list[Any]:
    """``[function(item) for item in items]``, in up to ``max_threads`` threads when the storage is remote.

    Local reads of small files (footers, manifests) take tens of microseconds each: starting the threads would
    cost more than it saves. Remote reads are round trips, which threads overlap.
    """
    if len(items) <= 1 or isinstance(filesystem, pafs.LocalFileSystem):
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(max_threads, len(items))) as pool:
        return list(pool.map(function, items))


def _file_columns(metadata: pq.FileMetaData) -> tuple[dict[str, pa.Field], dict[int, pa.Field]]:
    schema = metadata.schema.to_arrow_schema()
    by_name = {f.name: f for f in schema}
    by_id = {}
    for f in schema:
        raw = (f.metadata or {}).get(_FIELD_ID)
        if raw is not None:
            by_id[int(raw)] = f
    return by_name, by_id


def table_file(entry: DataFileEntry, metadata: pq.FileMetaData, columns: Sequence[StoredColumn],
               by_id: bool, deleted_rows: int) -> TableFile:
    """How each logical column is read from the file ``metadata`` describes.

    Args:
        entry: the file, as the log lists it.
        metadata: its footer.
        columns: the table's non-partition columns.
        by_id: resolve columns by field id (Iceberg, Delta ``id`` column mapping) when the file has ids.
        deleted_rows: rows of the file the version deleted.
    """
    names, ids = _file_columns(metadata)
    constants = {name for name, _, _ in entry.constants}
    stored, casts, missing = [], [], []
    for column in columns:
        if column.name in constants:
            continue
        found = ids.get(column.field_id) if by_id and ids and column.field_id is not None else names.get(
            column.stored_name)
        if found is None:
            missing.append((column.name, normalized_type(column.arrow_type)))
            continue
        stored.append((column.name, found.name))
        target = normalized_type(column.arrow_type)
        if found.type != target:
            casts.append((column.name, target))
    return TableFile(entry.path, tuple(stored), tuple(casts), tuple(missing), entry.constants, metadata.num_rows,
                     deleted_rows)


def plan_files(filesystem: pafs.FileSystem, entries: Sequence[DataFileEntry], columns: Sequence[StoredColumn],
               *, by_id: bool, what: str) -> PlannedFiles:
    """The row-group pieces of a version's data files, in piece order, with their deleted rows.

    Args:
        filesystem: where the files are.
        entries: the version's data files.
        columns: the table's columns.
        by_id: resolve columns by field id when the files have ids.
        what: the table and version, for messages.

    Raises:
        CorruptDataError: a delete names a row the file does not have.
    """
    ordered = sorted(entries, key=lambda e: e.path)
    footers = read_footers(filesystem, [e.path for e in ordered], what)
    pieces: list[RowGroupPiece] = []
    files: dict[str, TableFile] = {}
    total_deleted = 0
    for entry in ordered:
        metadata = footers[entry.path]
        deleted = entry.deleted
        if deleted is not None and len(deleted) and (deleted[0] < 0 or deleted[-1] >= metadata.num_rows):
            raise CorruptDataError(f'{what}: the deletes of {entry.path} name row {int(deleted[-1])}, but the file '
                                   f'stores {metadata.num_rows} rows')
        deleted_rows = 0 if deleted is None else len(deleted)
        total_deleted += deleted_rows
        file = table_file(entry, metadata, columns, by_id, deleted_rows)
        files[entry.path] = file
        partition_keys = tuple((name, '' if value is None else str(value)) for name, _, value in entry.constants)
        start = 0
        for index in range(metadata.num_row_groups):
            count = metadata.row_group(index).num_rows
            packed, live = b'', count
            if deleted is not None and len(deleted):
                lo, hi = np.searchsorted(deleted, [start, start + count])
                if hi > lo:
                    mask = np.zeros(count, dtype=bool)
                    mask[deleted[lo:hi] - start] = True
                    packed, live = np.packbits(mask).tobytes(), count - int(hi - lo)
            pieces.append(RowGroupPiece(entry.path, index, live, partition_keys,
                                        TableRowGroup(file, count, packed)))
            start += count
    return PlannedFiles(tuple(pieces), files, footers, total_deleted)


def unique_positions(positions: Any) -> np.ndarray:
    """Deleted-row positions as a sorted array of distinct int64 (deletes may name a row twice)."""
    return np.unique(np.asarray(positions, dtype=np.int64))
