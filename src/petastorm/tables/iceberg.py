"""Apache Iceberg tables: one snapshot (read through ``pyiceberg``) as a reader's store.

A table comes as a ``pyiceberg`` table from any catalog it supports (SQL, REST, Glue, Hive, in-memory...), as the
URL of a metadata file, or as the URL of the table's directory (its newest metadata file is read: with a catalog,
pass the catalog's table, which knows the current one). The snapshot read is the current one, or the one a
snapshot id, a branch or tag name, or a timestamp names.

What the snapshot is made of, from its manifests: the live data files, their sequence numbers, partition values
and column bounds, and the delete files. Position deletes are read and become masks of the row groups; equality
deletes are resolved to positions while planning, by reading only their key columns of the data files they
apply to (those of a lower data sequence number in the same partition, or every partition for an unpartitioned
delete). Columns are found in the files by field id, so renamed columns read by their current names and columns
added later read as nulls; types promoted since a file was written are cast. Identity-partitioned columns (in
every partition spec of the snapshot's files) are partition columns: predicates on them are decided per file.

Not read, and refused by name: data files in ORC or Avro, deletion vectors in Puffin files (format version 3),
columns with an initial default value (format version 3).

Why the manifests are walked here rather than planned by pyiceberg's scan (``table.scan().plan_files()``): its
planning refuses a snapshot with equality deletes (pyiceberg does not apply them), which this reader applies
(:mod:`petastorm.tables._iceberg_deletes`). pyiceberg still reads the table's metadata and manifests and finds the
snapshot; the walk, one pass over the live entries, also gives each file's sequence number, partition record and
column bounds, which the deletes, the partition columns and ``filters`` need. The steps of
:func:`open_iceberg_table`, in order: the snapshot and its columns (:func:`_open_snapshot`), its live files
(:func:`_manifest_files`), its partition columns, its position and equality deletes, each data file as the
snapshot has it (:func:`_data_file_entry`), and the store planned from their footers (:func:`_table_store`).
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from petastorm._describe import display_url
from petastorm._optional import import_optional
from petastorm.errors import (
    PetastormMetadataError,
    StorageNotFoundError,
    TableVersionError,
    UnsupportedTableFeatureError,
)
from petastorm.fs import ResolvedLocation, path_in, resolve_location
from petastorm.fs.settings import iceberg_io_properties
from petastorm.tables._files import (
    DataFileEntry,
    StoredColumn,
    map_on_storage,
    normalized_type,
    plan_files,
    unique_positions,
)
from petastorm.tables._iceberg_deletes import (
    EqualityDelete,
    equality_deleted,
    equality_deletes,
    position_deletes,
    read_delete_file,
)
from petastorm.tables._model import TableVersion
from petastorm.tables._pruning import all_of, bounds_guarantee
from petastorm.tables._store import TableStore

__all__ = ['open_iceberg_location', 'open_iceberg_table']

_DATA, _POSITION_DELETES, _EQUALITY_DELETES = 0, 1, 2
# Manifests read at a time (their files are fetched from storage: remote tables gain the most).
_MAX_MANIFEST_READERS = 8


def _pyiceberg() -> Any:
    return import_optional('pyiceberg', 'reading an Iceberg table')


def _newest_metadata(location: ResolvedLocation) -> str:
    """The URL of the newest metadata file of a table directory (``version-hint.text``, else the highest number)."""
    fs, root = location.filesystem, str(location.path)
    directory = posixpath.join(root, 'metadata')
    hint = posixpath.join(directory, 'version-hint.text')
    names = [posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(directory))
             if i.path.endswith('.metadata.json')]
    if fs.get_file_info(hint).type == pafs.FileType.File:
        with fs.open_input_stream(hint) as f:
            number = f.read().decode().strip()
        for candidate in (f'v{number}.metadata.json', f'{number}.metadata.json'):
            if candidate in names:
                return f'{str(location.url).rstrip("/")}/metadata/{candidate}'

    def number_of(name: str) -> int:
        head = name.split('-')[0].split('.')[0].lstrip('v')
        return int(head) if head.isdigit() else -1

    if not names:
        raise PetastormMetadataError(f'{display_url(str(location.url))} has no Iceberg metadata files')
    return f'{str(location.url).rstrip("/")}/metadata/{max(names, key=number_of)}'


def open_iceberg_location(location: ResolvedLocation, version: Any = None, *,
                          storage_options: dict[str, Any] | None = None, filesystem: Any = None) -> TableStore:
    """The store of a snapshot of the Iceberg table at a directory or metadata file URL (see the module doc)."""
    pyiceberg = _pyiceberg()
    from pyiceberg.table import StaticTable

    url = str(location.url)
    metadata_url = url if url.endswith('.metadata.json') else _newest_metadata(location)
    try:
        table = StaticTable.from_metadata(metadata_url, properties=iceberg_io_properties(url, storage_options))
    except FileNotFoundError as err:
        raise StorageNotFoundError(f'Iceberg metadata file {display_url(metadata_url)} does not exist') from err
    except (ValueError, OSError) as err:
        raise PetastormMetadataError(f'the Iceberg metadata {display_url(metadata_url)} cannot be read: '
                                     f'{err}') from err
    del pyiceberg
    return open_iceberg_table(table, version, storage_options=storage_options, filesystem=filesystem,
                              location=None if url.endswith('.metadata.json') else location)


def _snapshot(table: Any, version: Any, name: str) -> Any:
    """The snapshot ``version`` names (None: the current one; may be None for a table without data)."""
    metadata = table.metadata
    if version is None:
        return table.current_snapshot()
    if not isinstance(version, bool) and isinstance(version, (int, np.integer)):
        snapshot = metadata.snapshot_by_id(int(version))
        if snapshot is None:
            known = ', '.join(str(s.snapshot_id) for s in metadata.snapshots[-5:])
            raise TableVersionError(f'the Iceberg table {name} has no snapshot {int(version)} (its latest snapshots: '
                                    f'{known or "none"})')
        return snapshot
    if isinstance(version, str) and version in metadata.refs:
        return metadata.snapshot_by_name(version)
    when = _time_of(version, metadata, name)
    if when is None:
        raise TableVersionError(f'table_version={version!r} does not name a snapshot of the Iceberg table {name}')
    snapshot = table.snapshot_as_of_timestamp(int(when.timestamp() * 1000))
    if snapshot is None:
        raise TableVersionError(f'the Iceberg table {name} has no snapshot at {when.isoformat()} (its first '
                                f'snapshot is later)')
    return snapshot


def _time_of(version: Any, metadata: Any, name: str) -> dt.datetime | None:
    """``version`` as an aware time (naive ones are UTC) when it names one; None when it is not a time at all.

    Raises:
        TableVersionError: a string that is neither a ref of the table nor an ISO 8601 timestamp.
    """
    when = version
    if isinstance(version, str):
        try:
            when = dt.datetime.fromisoformat(version.replace('Z', '+00:00'))
        except ValueError:
            refs = ', '.join(sorted(metadata.refs)) or 'none'
            raise TableVersionError(f'table_version={version!r} is not a branch or tag of the Iceberg table {name} '
                                    f'(its refs: {refs}) nor an ISO 8601 timestamp') from None
    if isinstance(when, dt.date) and not isinstance(when, dt.datetime):
        when = dt.datetime(when.year, when.month, when.day)
    if not isinstance(when, dt.datetime):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def _filesystem(table: Any, storage_options: dict[str, Any] | None, filesystem: Any,
                location: ResolvedLocation | None) -> tuple[pafs.FileSystem, str]:
    """The filesystem of the data files, and the scheme and host they are on (``'file://'``, ``'s3://bucket'``)."""
    table_url = table.location()
    parsed = urlparse(table_url)
    origin = f'{parsed.scheme}://{parsed.netloc}'
    if location is not None and storage_options is None and filesystem is None:
        return location.filesystem, origin
    if storage_options is None and filesystem is None:
        from pyiceberg.io.pyarrow import PyArrowFileIO

        if isinstance(table.io, PyArrowFileIO) and parsed.scheme:
            return table.io.fs_by_scheme(parsed.scheme, parsed.netloc), origin
    return resolve_location(table_url, storage_options, filesystem).filesystem, origin


def _columns(schema: Any) -> list[StoredColumn]:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    columns = []
    for nested, arrow_field in zip(schema.fields, arrow, strict=True):
        if getattr(nested, 'initial_default', None) is not None:
            raise UnsupportedTableFeatureError(
                f'the Iceberg column {nested.name!r} has an initial default value (format version 3), which this '
                f'reader does not implement')
        columns.append(StoredColumn(nested.name, arrow_field.type, nested.name, nested.field_id))
    return columns


def _value(value: Any, arrow_type: pa.DataType) -> Any:
    """An Iceberg value (as manifests and bounds hold it: days, microseconds...) as a Python value of the type."""
    if value is None:
        return None
    try:
        return pa.scalar(value, type=arrow_type).as_py()
    except (pa.ArrowException, TypeError, ValueError):
        pass
    if isinstance(value, int):
        width = pa.int32() if pa.types.is_date32(arrow_type) or pa.types.is_time32(arrow_type) else pa.int64()
        return pa.array([value], type=width).cast(arrow_type)[0].as_py()
    raise ValueError(f'cannot represent {value!r} as {arrow_type}')


def _bounds_guarantee(data_file: Any, columns: Sequence[StoredColumn], schema: Any, types: dict[str, pa.DataType],
                      constants: set[str]) -> Any:
    from pyiceberg.conversions import from_bytes

    lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
    nulls = data_file.null_value_counts or {}
    parts = []
    for column in columns:
        if column.name in constants or column.field_id is None:
            continue
        field_id = column.field_id
        if field_id not in lower and field_id not in nulls:
            continue
        field_type = schema.find_field(field_id).field_type
        if not field_type.is_primitive:
            continue
        try:
            low = _value(from_bytes(field_type, lower[field_id]), types[column.name]) if field_id in lower else None
            high = _value(from_bytes(field_type, upper[field_id]), types[column.name]) if field_id in upper else None
        except (ValueError, TypeError, KeyError, pa.ArrowException):
            low = high = None
        parts.append(bounds_guarantee(column.name, types[column.name], low, high, nulls.get(field_id),
                                      data_file.record_count))
    return all_of(parts)


def _identity_partitions(table: Any, spec_ids: set[int], schema: Any) -> dict[int, dict[str, int]]:
    """``{spec id: {column: position in the partition record}}`` of the identity-partitioned columns."""
    from pyiceberg.transforms import IdentityTransform

    result: dict[int, dict[str, int]] = {}
    for spec_id in spec_ids:
        spec = table.metadata.specs()[spec_id]
        found = {}
        for position, field in enumerate(spec.fields):
            if isinstance(field.transform, IdentityTransform):
                try:
                    found[schema.find_field(field.source_id).name] = position
                except ValueError:
                    continue  # the source column was dropped
        result[spec_id] = found
    return result


@dataclass(frozen=True)
class _Snapshot:
    """What every step of opening a snapshot needs: the table, its name, the snapshot's schema and columns, the storage.

    Attributes:
        table: the ``pyiceberg`` table.
        name: the table's name (or location), for messages.
        snapshot: the snapshot read (None: a table without snapshots).
        schema: the snapshot's Iceberg schema.
        columns: where each of its columns is stored (by field id).
        types: the table type of each column.
        fs: the filesystem of the data and delete files.
        origin: the scheme and host they are on (``'file://'``, ``'s3://bucket'``).
    """

    table: Any
    name: str
    snapshot: Any
    schema: Any
    columns: list[StoredColumn]
    types: dict[str, pa.DataType]
    fs: pafs.FileSystem
    origin: str

    def local_path(self, uri: str) -> str:
        """The path on :attr:`fs` of a file the metadata names by URI (refused on another storage)."""
        parsed = urlparse(uri)
        if parsed.scheme and f'{parsed.scheme}://{parsed.netloc}' != self.origin:
            raise UnsupportedTableFeatureError(f'the Iceberg table {self.name} lists the file {display_url(uri)} on '
                                               f'another storage than its location {display_url(self.origin)}')
        return path_in(uri) if parsed.scheme else uri

    def read_delete_file(self, delete_file: Any) -> pa.Table:
        """The rows of a delete file."""
        return read_delete_file(self.fs, self.local_path(delete_file.file_path), self.name)


@dataclass(frozen=True)
class _ManifestFiles:
    """The live files of a snapshot by content, each with its data sequence number."""

    data: list[tuple[Any, int]]
    position_deletes: list[tuple[Any, int]]
    equality_deletes: list[tuple[Any, int]]


def _manifest_files(snapshot: _Snapshot) -> _ManifestFiles:
    """The live data and delete files the snapshot's manifests list (read 8 at a time).

    Raises:
        UnsupportedTableFeatureError: a data or delete file is not Parquet (ORC, Avro, Puffin).
    """
    found = _ManifestFiles([], [], [])
    if snapshot.snapshot is None:
        return found
    io = snapshot.table.io
    by_content = {_DATA: found.data, _POSITION_DELETES: found.position_deletes,
                  _EQUALITY_DELETES: found.equality_deletes}
    manifests = snapshot.snapshot.manifests(io)
    for entries in map_on_storage(snapshot.fs, lambda m: m.fetch_manifest_entry(io, discard_deleted=True), manifests,
                                  _MAX_MANIFEST_READERS):
        for entry in entries:
            data_file = entry.data_file
            content = int(data_file.content)
            file_format = str(getattr(data_file.file_format, 'value', data_file.file_format)).upper()
            if file_format != 'PARQUET':
                kind = 'data' if content == _DATA else 'delete'
                raise UnsupportedTableFeatureError(
                    f'the Iceberg table {snapshot.name} has {kind} files in {file_format} format '
                    f'({data_file.file_path}); this reader reads Parquet files only')
            if content in by_content:
                by_content[content].append((data_file, entry.sequence_number or 0))
    return found


class _Partitions(NamedTuple):
    """The partition columns of a snapshot's data files."""

    #: ``{spec id: {column: position in the partition record}}`` of the identity-partitioned columns of each spec.
    identity: dict[int, dict[str, int]]
    #: the columns identity-partitioned in every spec of the data files: the snapshot's partition columns.
    names: list[str]


def _partition_columns(snapshot: _Snapshot, files: _ManifestFiles) -> _Partitions:
    """The identity-partitioned columns of the data files' specs, and those identity-partitioned in every spec."""
    identity = _identity_partitions(snapshot.table, {data_file.spec_id for data_file, _ in files.data},
                                    snapshot.schema)
    return _Partitions(identity, [c.name for c in snapshot.columns
                                  if identity and all(c.name in found for found in identity.values())])


def _data_file_entry(snapshot: _Snapshot, data_file: Any, sequence: int, partitions: _Partitions,
                     position_deleted: dict[str, list[np.ndarray]], equality: list[EqualityDelete]) -> DataFileEntry:
    """A data file as the snapshot has it: its partition values, the rows deleted from it, its bounds."""
    path = snapshot.local_path(data_file.file_path)
    spec_positions = partitions.identity.get(data_file.spec_id, {})
    types = snapshot.types
    constants = tuple((column, types[column], _value(data_file.partition[spec_positions[column]], types[column]))
                      for column in partitions.names)
    positions = list(position_deleted.get(data_file.file_path, []))
    applying = [delete for delete in equality if delete.applies_to(data_file, sequence)]
    if applying:
        positions.extend(equality_deleted(snapshot.fs, path, applying))
    deleted = unique_positions(np.concatenate(positions)) if positions else None
    guarantee = _bounds_guarantee(data_file, snapshot.columns, snapshot.schema, types, set(partitions.names))
    return DataFileEntry(path, constants, deleted, guarantee, data_file.record_count)


def _table_store(snapshot: _Snapshot, files: _ManifestFiles, entries: list[DataFileEntry], partitions: list[str],
                 location: ResolvedLocation | None) -> TableStore:
    """The store of the snapshot: its data files' footers read and their row groups planned."""
    table = snapshot.table
    snapshot_id = None if snapshot.snapshot is None else int(snapshot.snapshot.snapshot_id)
    what = f'snapshot {snapshot_id} of the Iceberg table {snapshot.name}'
    planned = plan_files(snapshot.fs, entries, snapshot.columns, by_id=True, what=what)
    logical = pa.schema([pa.field(c.name, snapshot.types[c.name], not f.required)
                         for c, f in zip(snapshot.columns, snapshot.schema.fields, strict=True)])
    timestamp = None if snapshot.snapshot is None else snapshot.snapshot.timestamp_ms
    return TableStore(
        snapshot.fs, table.location() if location is None else location.url, snapshot.local_path(table.location()),
        tuple(sorted(planned.files)),
        {}, None, version=TableVersion('iceberg', snapshot_id, timestamp),
        arrow_schema=logical, table_partitions=tuple(partitions), pieces=planned.pieces, table_files=planned.files,
        file_guarantees={e.path: e.guarantee for e in entries if e.guarantee is not None}, footers=planned.footers,
        deleted_rows=planned.deleted_rows,
        delete_files=tuple(sorted(d.file_path for d, _ in files.position_deletes + files.equality_deletes)),
        features=(f'format-version={int(table.metadata.format_version)}',))


def open_iceberg_table(table: Any, version: Any = None, *, storage_options: dict[str, Any] | None = None,
                       filesystem: Any = None, location: ResolvedLocation | None = None) -> TableStore:
    """The store of one snapshot of a ``pyiceberg`` table (the registry's opener of ``pyiceberg`` tables).

    Args:
        table: a ``pyiceberg.table.Table`` (from any catalog) or ``StaticTable``.
        version: None (the current snapshot), a snapshot id, a branch or tag name, or a timestamp (``datetime``
            or ISO 8601 string: the snapshot current then).
        storage_options: fsspec options for the data files (default: the table's own file IO).
        filesystem: a ready filesystem for the data files.
        location: the table directory the table was found at, when it was opened from one.

    Raises:
        TableVersionError: the snapshot, ref or timestamp does not exist.
        UnsupportedTableFeatureError: the snapshot uses something we do not read (named).
    """
    snapshot = _open_snapshot(table, version, storage_options, filesystem, location)
    files = _manifest_files(snapshot)
    partitions = _partition_columns(snapshot, files)
    position_deleted = position_deletes(snapshot.read_delete_file,
                                        {data_file.file_path: sequence for data_file, sequence in files.data},
                                        files.position_deletes)
    equality = equality_deletes(snapshot.read_delete_file, files.equality_deletes, table.metadata.specs(),
                                snapshot.name)
    entries = [_data_file_entry(snapshot, data_file, sequence, partitions, position_deleted, equality)
               for data_file, sequence in files.data]
    return _table_store(snapshot, files, entries, partitions.names, location)


def _open_snapshot(table: Any, version: Any, storage_options: dict[str, Any] | None, filesystem: Any,
                   location: ResolvedLocation | None) -> _Snapshot:
    """The snapshot ``version`` names, its schema and columns, and the filesystem of its files."""
    _pyiceberg()
    name = '.'.join(table.name()) if hasattr(table, 'name') and table.name() else display_url(table.location())
    snapshot = _snapshot(table, version, name)
    # As pyiceberg scans: the current schema for the current snapshot, a pinned snapshot's own schema otherwise.
    schema = table.schema()
    if version is not None and snapshot is not None and snapshot.schema_id is not None:
        schema = table.metadata.schema_by_id(snapshot.schema_id) or schema
    fs, origin = _filesystem(table, storage_options, filesystem, location)
    columns = _columns(schema)
    types = {c.name: normalized_type(c.arrow_type) for c in columns}
    return _Snapshot(table, name, snapshot, schema, columns, types, fs, origin)
