"""Delta Lake tables: one version of the log (read by delta-rs through ``deltalake``) as a reader's store.

What a version is made of, from the log: the data files its ``add`` actions list (files that a later or earlier
commit removed are never read), their partition values (typed, from the log, never from directory names), their
statistics (for ``filters``), their deletion vectors (read by delta-rs; the deleted rows become masks of the row
groups), the table's schema and its column mapping (files store physical names, or field ids with mapping mode
``id``; readers see the logical names). Columns added to the table after a file was written read as nulls.

Reader features the protocol may name and what we do: ``columnMapping``, ``deletionVectors``, ``timestampNtz``,
``typeWidening`` (stored values are cast to the table's type), ``v2Checkpoint`` and ``vacuumProtocolCheck``
(delta-rs reads such logs) are supported; any other (``variantType``...) is refused by name, as is a reader
version above 3, so that such a table is never read wrongly.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa

from petastorm._describe import display_url
from petastorm._optional import import_optional
from petastorm.errors import (
    PetastormMetadataError,
    StorageCredentialsError,
    StorageError,
    StorageNotFoundError,
    TableVersionError,
    UnsupportedTableFeatureError,
)
from petastorm.fs import ResolvedLocation, path_in
from petastorm.fs.settings import delta_storage_options
from petastorm.store import keys
from petastorm.tables._files import DataFileEntry, StoredColumn, normalized_type, plan_files, unique_positions
from petastorm.tables._model import TableVersion
from petastorm.tables._pruning import all_of, bounds_guarantee
from petastorm.tables._store import TableStore

__all__ = ['MAX_READER_VERSION', 'SUPPORTED_READER_FEATURES', 'TYPE_READER_FEATURES', 'UNISCHEMA_PROPERTY',
           'check_protocol', 'delta_uri', 'open_delta_table']

#: Table property holding the Unischema of tables written by ``write_dataset`` (our schema JSON).
UNISCHEMA_PROPERTY = keys.SCHEMA_JSON_KEY.decode()
#: Reader features we read correctly.
SUPPORTED_READER_FEATURES = frozenset({'columnMapping', 'deletionVectors', 'timestampNtz', 'typeWidening',
                                       'typeWidening-preview', 'v2Checkpoint', 'vacuumProtocolCheck'})
#: Reader features about a column type: a table that enables one but has no such column reads as any other.
TYPE_READER_FEATURES = {'variantType': 'variant', 'variantType-preview': 'variant',
                        'variantShredding-preview': 'variant'}
MAX_READER_VERSION = 3

VersionSpec = Any  # int | datetime | str | None


def delta_uri(url: str) -> str:
    """The table URI delta-rs takes for a dataset URL (local paths without ``file://``, ``s3a`` as ``s3``)."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == 'file':
        return unquote(parsed.path) if not parsed.netloc else f'//{parsed.netloc}{unquote(parsed.path)}'
    if scheme == 's3a':
        return 's3' + url[len('s3a'):]
    return url


def _timestamp(value: VersionSpec) -> dt.datetime | None:
    """``value`` as an aware datetime when it names a time (naive ones are UTC), else None."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace('Z', '+00:00'))
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.timezone.utc)
    return None


# What delta-rs says when it found no credentials at all (rather than having some refused): without any in the
# options or the environment it asks the cloud's instance metadata endpoint, whose refusal is not the storage's.
_NO_CREDENTIALS = ('unable to locate credentials', 'no credentials', 'missing credentials',
                   'failed to load credentials', 'credentials not found', '169.254.169.254', '169.254.170.2')


def _translate_error(err: Exception, url: str, what: str) -> Exception:
    deltalake = import_optional('deltalake', 'reading a Delta table')
    text = str(err)
    lowered = text.lower()
    if isinstance(err, deltalake.exceptions.TableNotFoundError):
        return StorageNotFoundError(f'{display_url(url)} is not a Delta table: {what} ({text.splitlines()[0]})')
    if any(marker in lowered for marker in _NO_CREDENTIALS):
        return StorageCredentialsError(f'no credentials were found for the Delta table {display_url(url)} ({what}): '
                                       f'{text.splitlines()[0]}. Pass them in storage_options (for S3: key/secret '
                                       f'or profile; for GCS: token, a service account\'s file; for Azure: '
                                       f'account_key, sas_token or connection_string) or set them in the '
                                       f'environment')
    if any(marker in lowered for marker in ('403', 'forbidden', 'invalidaccesskeyid', 'signaturedoesnotmatch',
                                             'access denied', 'accessdenied', 'credential')):
        return StorageCredentialsError(f'the storage refused the credentials for the Delta table '
                                       f'{display_url(url)} ({what}): {text.splitlines()[0]}')
    if any(marker in lowered for marker in ('connection refused', 'error sending request', 'dns error')):
        return StorageError(f'cannot reach the Delta table {display_url(url)} ({what}): {text.splitlines()[0]}')
    return PetastormMetadataError(f'the Delta log of {display_url(url)} cannot be read ({what}): '
                                  f'{text.splitlines()[0] if text else type(err).__name__}')


def _load(url: str, storage_options: dict[str, Any] | None, version: VersionSpec) -> Any:
    """The ``deltalake.DeltaTable`` at ``version`` (latest, a version number, a timestamp)."""
    deltalake = import_optional('deltalake', 'reading a Delta table')
    uri = delta_uri(url)
    options = delta_storage_options(url, storage_options)
    if version is not None and not isinstance(version, bool) and isinstance(version, (int, np.integer)):
        try:
            return deltalake.DeltaTable(uri, version=int(version), storage_options=options)
        except (deltalake.exceptions.DeltaError, OSError) as err:
            latest = _latest_version(uri, options)
            if latest is not None and not 0 <= int(version) <= latest:
                raise TableVersionError(f'the Delta table {display_url(url)} has no version {int(version)}: its '
                                        f'versions go up to {latest}') from err
            raise _translate_error(err, url, f'version {int(version)}') from err
    try:
        table = deltalake.DeltaTable(uri, storage_options=options)
    except (deltalake.exceptions.DeltaError, OSError) as err:
        raise _translate_error(err, url, 'latest version') from err
    if version is None:
        return table
    when = _timestamp(version)
    if when is None:
        raise TableVersionError(f'table_version={version!r} does not name a version of the Delta table '
                                f'{display_url(url)}: pass a version number, a datetime or an ISO 8601 timestamp')
    try:
        table.load_as_version(when)
    except (deltalake.exceptions.DeltaError, OSError) as err:
        raise TableVersionError(f'the Delta table {display_url(url)} has no version at {when.isoformat()}: '
                                f'{str(err).splitlines()[0]}') from err
    first = _commit_timestamp(table, 0)
    if table.version() == 0 and first is not None and first > when.timestamp() * 1000:
        raise TableVersionError(f'the Delta table {display_url(url)} has no version at {when.isoformat()}: its '
                                f'first version was committed at '
                                f'{dt.datetime.fromtimestamp(first / 1000, dt.timezone.utc).isoformat()}')
    return table


def _latest_version(uri: str, options: dict[str, str]) -> int | None:
    deltalake = import_optional('deltalake', 'reading a Delta table')
    try:
        return int(deltalake.DeltaTable(uri, storage_options=options).version())
    except (deltalake.exceptions.DeltaError, OSError):
        return None


def _commit_timestamp(table: Any, version: int) -> int | None:
    for commit in table.history():
        if commit.get('version') == version:
            return commit.get('timestamp')
    return None


def _type_names(description: Any) -> set[str]:
    """Every type name in a Delta schema's JSON description (nested types included)."""
    if isinstance(description, str):
        return {description.split('(')[0]}
    if isinstance(description, list):
        return set().union(*(_type_names(item) for item in description)) if description else set()
    if isinstance(description, dict):
        names = {description['type']} if isinstance(description.get('type'), str) else set()
        for key in ('type', 'fields', 'elementType', 'keyType', 'valueType'):
            if key in description and not isinstance(description[key], str):
                names |= _type_names(description[key])
        return names
    return set()


def check_protocol(protocol: Any, url: str, schema_json: str) -> tuple[str, ...]:
    """The reader features of the table, refused when we do not read them correctly.

    A feature about a column type (``variantType``) is refused only when a column has that type.

    Raises:
        UnsupportedTableFeatureError: a reader version above 3 or a reader feature we do not read (named).
    """
    if protocol.min_reader_version > MAX_READER_VERSION:
        raise UnsupportedTableFeatureError(
            f'the Delta table {display_url(url)} needs reader version {protocol.min_reader_version}; this reader '
            f'implements reader versions up to {MAX_READER_VERSION}')
    features = tuple(protocol.reader_features or ())
    used_types = _type_names(json.loads(schema_json))
    unsupported = sorted(f for f in set(features) - SUPPORTED_READER_FEATURES
                         if f not in TYPE_READER_FEATURES or TYPE_READER_FEATURES[f] in used_types)
    if unsupported:
        raise UnsupportedTableFeatureError(
            f'the Delta table {display_url(url)} uses the reader feature(s) {", ".join(unsupported)}, which this '
            f'reader does not implement; it reads tables with {", ".join(sorted(SUPPORTED_READER_FEATURES))}')
    if protocol.min_reader_version == 2 and not features:
        return ('columnMapping',)
    return features


def _columns(schema_json: str, arrow_schema: pa.Schema, mapping: str) -> list[StoredColumn]:
    """Where each logical column is stored: its physical name (and field id) with column mapping."""
    fields = json.loads(schema_json)['fields']
    columns = []
    for description, arrow_field in zip(fields, arrow_schema, strict=True):
        metadata = description.get('metadata') or {}
        physical = metadata.get('delta.columnMapping.physicalName') if mapping != 'none' else None
        field_id = metadata.get('delta.columnMapping.id') if mapping == 'id' else None
        columns.append(StoredColumn(arrow_field.name, arrow_field.type, physical or arrow_field.name,
                                    None if field_id is None else int(field_id)))
    return columns


def _deleted_rows(table: Any, url: str) -> dict[str, np.ndarray]:
    """Deleted positions of every data file with a deletion vector, by its path relative to the table."""
    reader = table.deletion_vectors()
    result: dict[str, np.ndarray] = {}
    base = unquote(urlparse(table.table_uri).path).rstrip('/')
    for batch in reader:
        batch = pa.record_batch(batch)
        paths = batch.column('filepath').to_pylist()
        vectors = batch.column('selection_vector')
        for index, uri in enumerate(paths):
            keep = np.asarray(vectors[index].values, dtype=bool)
            path = unquote(urlparse(uri).path)
            relative = posixpath.relpath(path, base) if path.startswith(base + '/') else path
            # Rows past the end of the vector are kept.
            result[relative] = unique_positions(np.flatnonzero(~keep))
    return result


def _stats_guarantee(row: dict[str, Any], columns: list[StoredColumn], partitions: set[str]) -> Any:
    num_rows = row.get('num_records')
    parts = []
    for column in columns:
        if column.name in partitions:
            continue
        key = column.stored_name
        if f'min.{key}' not in row and f'null_count.{key}' not in row:
            continue
        parts.append(bounds_guarantee(column.name, normalized_type(column.arrow_type), row.get(f'min.{key}'),
                                      row.get(f'max.{key}'), row.get(f'null_count.{key}'), num_rows))
    return all_of(parts)


def _data_path(location: ResolvedLocation, root: str, relative: str) -> str:
    if '://' in relative:  # an absolute path (shallow clones): only on the table's own storage
        table_url = urlparse(str(location.url))
        parsed = urlparse(relative)
        if (parsed.scheme, parsed.netloc) != (table_url.scheme, table_url.netloc):
            raise UnsupportedTableFeatureError(
                f'the Delta table {display_url(str(location.url))} lists the data file {display_url(relative)} on '
                f'another storage; data files must be on the storage of the table')
        return path_in(relative)
    return posixpath.join(root, unquote(relative))


def open_delta_table(location: ResolvedLocation, storage_options: dict[str, Any] | None = None,
                     version: VersionSpec = None, *, filesystem: Any = None) -> TableStore:
    """The store of one version of the Delta table at ``location`` (the registry's opener of Delta tables).

    Args:
        location: the table's directory, resolved.
        storage_options: the reader's storage options (translated for delta-rs, see :mod:`petastorm.tables`).
        version: None (the latest), a version number, or a timestamp (``datetime`` or ISO 8601 string: the
            version that was current then).
        filesystem: the filesystem the user gave, if any: ``location`` was resolved with it and holds it.

    Raises:
        TableVersionError: the version or timestamp does not exist.
        UnsupportedTableFeatureError: the table needs a reader feature we do not implement.
        PetastormMetadataError: the log cannot be read.
        StorageCredentialsError: the storage refused the credentials.
    """
    url = str(location.url)
    table = _load(url, storage_options, version)
    delta_schema = table.schema()
    features = check_protocol(table.protocol(), url, delta_schema.to_json())
    metadata = table.metadata()
    configuration = dict(metadata.configuration or {})
    mapping = configuration.get('delta.columnMapping.mode', 'none') if 'columnMapping' in features else 'none'
    try:
        arrow_schema = pa.schema(delta_schema.to_arrow())
    except Exception as err:  # a type Arrow has no form for
        raise UnsupportedTableFeatureError(f'the schema of the Delta table {display_url(url)} has a type this '
                                           f'reader cannot read: {err}') from err
    columns = _columns(delta_schema.to_json(), arrow_schema, mapping)
    partitions = list(metadata.partition_columns)
    types = {c.name: normalized_type(c.arrow_type) for c in columns}
    deleted = _deleted_rows(table, url) if 'deletionVectors' in features else {}
    root = str(location.path)
    adds = pa.table(table.get_add_actions(flatten=True))
    entries = []
    file_guarantees = {}
    for row in adds.to_pylist():
        relative = unquote(row['path'])
        path = _data_path(location, root, row['path'])
        constants = tuple((name, types[name], row.get(f'partition.{name}')) for name in partitions)
        guarantee = _stats_guarantee(row, columns, set(partitions))
        if guarantee is not None:
            file_guarantees[path] = guarantee
        entries.append(DataFileEntry(path, constants, deleted.get(relative), guarantee, row.get('num_records')))
    what = f'version {table.version()} of the Delta table {display_url(url)}'
    planned = plan_files(location.filesystem, entries, columns, by_id=mapping == 'id', what=what)
    kv: dict[bytes, bytes] = {}
    if UNISCHEMA_PROPERTY in configuration and configuration[UNISCHEMA_PROPERTY]:
        kv[keys.SCHEMA_JSON_KEY] = configuration[UNISCHEMA_PROPERTY].encode()
    logical = pa.schema([pa.field(c.name, types[c.name], f.nullable) for c, f in zip(columns, arrow_schema,
                                                                                      strict=True)])
    return TableStore(
        location.filesystem, location.url, root, tuple(sorted(planned.files)), kv,
        f'{display_url(url)} (Delta table properties, version {table.version()})' if kv else None,
        version=TableVersion('delta', int(table.version())), arrow_schema=logical,
        table_partitions=tuple(partitions), pieces=planned.pieces, table_files=planned.files,
        file_guarantees=file_guarantees, footers=planned.footers, deleted_rows=planned.deleted_rows,
        features=features + ((f'columnMapping={mapping}',) if mapping != 'none' else ()))
