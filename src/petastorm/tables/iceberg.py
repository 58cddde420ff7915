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
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

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
    ColumnSource,
    DataFileEntry,
    map_on_storage,
    normalized_type,
    plan_files,
    unique_positions,
)
from petastorm.tables._model import TableStore, TableVersion
from petastorm.tables._pruning import all_of, bounds_guarantee

__all__ = ['open_iceberg_location', 'open_iceberg_table']

_DATA, _POSITION_DELETES, _EQUALITY_DELETES = 0, 1, 2
# Manifests read at a time (their files are fetched from storage: remote tables gain the most).
_MAX_MANIFEST_READERS = 8
# Field ids of the columns of position delete files (Iceberg's reserved ids).
_DELETE_FILE_PATH_ID, _DELETE_POS_ID = 2147483546, 2147483545


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
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        snapshot = table.snapshot_as_of_timestamp(int(when.timestamp() * 1000))
        if snapshot is None:
            raise TableVersionError(f'the Iceberg table {name} has no snapshot at {when.isoformat()} (its first '
                                    f'snapshot is later)')
        return snapshot
    raise TableVersionError(f'table_version={version!r} does not name a snapshot of the Iceberg table {name}')


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


def _columns(schema: Any) -> list[ColumnSource]:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    columns = []
    for nested, arrow_field in zip(schema.fields, arrow, strict=True):
        if getattr(nested, 'initial_default', None) is not None:
            raise UnsupportedTableFeatureError(
                f'the Iceberg column {nested.name!r} has an initial default value (format version 3), which this '
                f'reader does not implement')
        columns.append(ColumnSource(nested.name, arrow_field.type, nested.name, nested.field_id))
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


def _bounds_guarantee(data_file: Any, columns: Sequence[ColumnSource], schema: Any, types: dict[str, pa.DataType],
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


def _read_delete_file(fs: pafs.FileSystem, path: str, name: str) -> pa.Table:
    try:
        with fs.open_input_file(path) as f:
            return pq.read_table(f)
    except FileNotFoundError as err:
        raise StorageNotFoundError(f'delete file {path} of the Iceberg table {name} does not exist') from err


def _field_ids(table: pa.Table) -> dict[int, str]:
    ids = {}
    for field in table.schema:
        raw = (field.metadata or {}).get(b'PARQUET:field_id')
        if raw is not None:
            ids[int(raw)] = field.name
    return ids


def _encoded_keys(data: pa.Table, deletes: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Both tables' key columns as dictionary indices of their values together, nulls being a value too.

    Iceberg's equality deletes match null to null; joins never match nulls, dictionary indices of encoded nulls do.
    """
    data_columns, delete_columns = [], []
    for name in data.column_names:
        both = pa.chunked_array(data.column(name).chunks + deletes.column(name).cast(data.column(name).type).chunks)
        indices = pc.dictionary_encode(both, null_encoding='encode').combine_chunks().indices
        data_columns.append(indices.slice(0, data.num_rows))
        delete_columns.append(indices.slice(data.num_rows))
    names = [f'k{i}' for i in range(len(data_columns))]
    return pa.table(data_columns, names=names), pa.table(delete_columns, names=names)


def _equality_deleted(fs: pafs.FileSystem, data_path: str, resolve: dict[int, str], keys: pa.Table,
                      key_ids: Sequence[int]) -> np.ndarray:
    """Positions of the rows of a data file whose key columns equal a row of ``keys``."""
    stored = [resolve.get(field_id) for field_id in key_ids]
    with fs.open_input_file(data_path) as f:
        parquet = pq.ParquetFile(f)
        present = [name for name in stored if name is not None]
        data = parquet.read(columns=present) if present else pa.table({})
    columns = []
    for field_id, name in zip(key_ids, stored, strict=True):
        key_type = keys.column(str(field_id)).type
        columns.append(data.column(name) if name is not None else pa.nulls(parquet.metadata.num_rows, key_type))
    data_keys = pa.table(columns, names=[str(i) for i in key_ids])
    encoded_data, encoded_deletes = _encoded_keys(data_keys, keys.select([str(i) for i in key_ids]))
    encoded_data = encoded_data.append_column('__row', pa.array(np.arange(encoded_data.num_rows, dtype=np.int64)))
    matched = encoded_data.join(encoded_deletes.group_by(encoded_deletes.column_names).aggregate([]),
                                keys=encoded_deletes.column_names, join_type='left semi')
    return unique_positions(matched.column('__row').to_numpy())


def open_iceberg_table(table: Any, version: Any = None, *, storage_options: dict[str, Any] | None = None,
                       filesystem: Any = None, location: ResolvedLocation | None = None) -> TableStore:
    """The store of one snapshot of a ``pyiceberg`` table.

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
    data_entries, position_deletes, equality_deletes = [], [], []
    if snapshot is not None:
        manifests = snapshot.manifests(table.io)
        manifest_entries = map_on_storage(fs, lambda m: m.fetch_manifest_entry(table.io, discard_deleted=True),
                                          manifests, _MAX_MANIFEST_READERS)
        for entries_of_manifest in manifest_entries:
            for entry in entries_of_manifest:
                data_file = entry.data_file
                content = int(data_file.content)
                sequence = entry.sequence_number or 0
                file_format = str(getattr(data_file.file_format, 'value', data_file.file_format)).upper()
                if file_format != 'PARQUET':
                    kind = 'data' if content == _DATA else 'delete'
                    raise UnsupportedTableFeatureError(
                        f'the Iceberg table {name} has {kind} files in {file_format} format ({data_file.file_path}); '
                        f'this reader reads Parquet files only')
                if content == _DATA:
                    data_entries.append((data_file, sequence))
                elif content == _POSITION_DELETES:
                    position_deletes.append((data_file, sequence))
                elif content == _EQUALITY_DELETES:
                    equality_deletes.append((data_file, sequence))
    spec_ids = {data_file.spec_id for data_file, _ in data_entries}
    identity = _identity_partitions(table, spec_ids, schema)
    partitions = [c.name for c in columns if identity and all(c.name in found for found in identity.values())]

    def local_path(uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme and f'{parsed.scheme}://{parsed.netloc}' != origin:
            raise UnsupportedTableFeatureError(f'the Iceberg table {name} lists the file {display_url(uri)} on '
                                               f'another storage than its location {display_url(origin)}')
        return path_in(uri) if parsed.scheme else uri

    # Position deletes: every delete file is read once; its rows name the data files they delete from.
    deleted: dict[str, list[np.ndarray]] = {}
    position_files = []
    for delete_file, delete_sequence in position_deletes:
        table_of = _read_delete_file(fs, local_path(delete_file.file_path), name)
        ids = _field_ids(table_of)
        path_column = ids.get(_DELETE_FILE_PATH_ID, 'file_path')
        pos_column = ids.get(_DELETE_POS_ID, 'pos')
        position_files.append((table_of.select([path_column, pos_column]).rename_columns(['file_path', 'pos']),
                               delete_sequence))
    data_sequences = {data_file.file_path: sequence for data_file, sequence in data_entries}
    for deletes, delete_sequence in position_files:
        grouped = deletes.group_by('file_path').aggregate([('pos', 'list')])
        for path, positions in zip(grouped.column('file_path').to_pylist(), grouped.column('pos_list').to_pylist(),
                                   strict=True):
            if path in data_sequences and data_sequences[path] <= delete_sequence:
                deleted.setdefault(path, []).append(np.asarray(positions, dtype=np.int64))
    # Equality deletes: for each data file, the keys of the delete files that apply to it.
    equality_keys = []
    for delete_file, delete_sequence in equality_deletes:
        keys_table = _read_delete_file(fs, local_path(delete_file.file_path), name)
        ids = _field_ids(keys_table)
        key_ids = list(delete_file.equality_ids or [])
        missing = [i for i in key_ids if i not in ids]
        if missing:
            raise PetastormMetadataError(f'the equality delete file {delete_file.file_path} of the Iceberg table '
                                         f'{name} lacks the key columns of field ids {missing}')
        keys_table = pa.table([keys_table.column(ids[i]) for i in key_ids], names=[str(i) for i in key_ids])
        unpartitioned = not table.metadata.specs()[delete_file.spec_id].fields
        equality_keys.append((delete_file, delete_sequence, key_ids, keys_table, unpartitioned))
    entries = []
    file_guarantees = {}
    for data_file, sequence in data_entries:
        path = local_path(data_file.file_path)
        spec_positions = identity.get(data_file.spec_id, {})
        constants = tuple((column, types[column], _value(data_file.partition[spec_positions[column]],
                                                         types[column])) for column in partitions)
        positions = deleted.get(data_file.file_path, [])
        applying = [(ids, keys) for delete_file, delete_sequence, ids, keys, unpartitioned in equality_keys
                    if delete_sequence > sequence and (unpartitioned or (
                        delete_file.spec_id == data_file.spec_id and delete_file.partition == data_file.partition))]
        if applying:
            with fs.open_input_file(path) as f:
                resolve = _field_ids(pq.read_schema(f).empty_table())
            for key_ids, keys in applying:
                positions.append(_equality_deleted(fs, path, resolve, keys, key_ids))
        deleted_positions = unique_positions(np.concatenate(positions)) if positions else None
        guarantee = _bounds_guarantee(data_file, columns, schema, types, set(partitions))
        if guarantee is not None:
            file_guarantees[path] = guarantee
        entries.append(DataFileEntry(path, constants, deleted_positions, guarantee, data_file.record_count))
    snapshot_id = None if snapshot is None else int(snapshot.snapshot_id)
    what = f'snapshot {snapshot_id} of the Iceberg table {name}'
    planned = plan_files(fs, entries, columns, by_id=True, what=what)
    logical = pa.schema([pa.field(c.name, types[c.name], not f.required) for c, f in zip(columns, schema.fields,
                                                                                          strict=True)])
    format_version = int(table.metadata.format_version)
    return TableStore(
        fs, table.location() if location is None else location.url, local_path(table.location()),
        tuple(sorted(planned.files)),
        {}, None, version=TableVersion('iceberg', snapshot_id, None if snapshot is None else snapshot.timestamp_ms),
        arrow_schema=logical, table_partitions=tuple(partitions), pieces=planned.pieces, table_files=planned.files,
        file_guarantees=file_guarantees, footers=planned.footers, deleted_rows=planned.deleted_rows,
        delete_files=tuple(sorted(d.file_path for d, _ in position_deletes + equality_deletes)),
        features=(f'format-version={format_version}',))
