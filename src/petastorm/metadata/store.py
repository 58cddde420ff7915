"""Opening a Parquet store: its data files, its ``_common_metadata``, its schema and its row groups.

The order of row groups (sorted file path, then row-group number) is the piece order shared with Petastorm:
sharding, row-group indexes and cache keys all refer to positions in it.

A store may also be some files of a dataset: one file URL, a list of them, or a glob pattern
(``.../part-000*.parquet``, expanded here when no file has that very name). Their schema is then the dataset's,
found in the ``_common_metadata`` of the directory holding them (or of the dataset directory above their
``name=value`` partition directories).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import posixpath
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import display_url
from petastorm._warnings import warn_user
from petastorm.errors import (
    CorruptFooterError,
    MissingDataFilesError,
    PetastormMetadataError,
    StorageError,
    StorageNotFoundError,
)
from petastorm.fs import ResolvedLocation
from petastorm.fs._files import file_url, with_retries
from petastorm.metadata import keys
from petastorm.metadata.data_files import DataFiles, FooterStore
from petastorm.metadata.unify import UnifiedSchema, unify_file_schemas

__all__ = [
    'COMMON_METADATA',
    'DELTA_LOG',
    'LOCAL_FOOTER_THREADS',
    'REMOTE_FOOTER_THREADS',
    'SUMMARY_METADATA',
    'ParquetStore',
    'RowGroupPiece',
    'StoreListing',
    'check_no_missing_files',
    'data_file_schema',
    'footer_row_counts',
    'glob_files',
    'list_data_files',
    'load_row_groups',
    'look_at',
    'open_store',
    'partition_keys_of',
    'read_footers',
    'store_footers',
    'summary_footer',
    'table_format_of',
    'typed_partition_value',
    'unified_file_schema',
]

COMMON_METADATA = '_common_metadata'
#: The log directory of a Delta table.
DELTA_LOG = '_delta_log'
SUMMARY_METADATA = '_metadata'
#: missing data files a message names (all of them are in the error's ``urls``).
_NAMED_MISSING = 5


@dataclass(frozen=True)
class RowGroupPiece:
    """One row group of one file: the unit of work of every reader.

    ``table`` is None for plain Parquet; for a row group of a table version (Delta, Iceberg) it is the
    :class:`petastorm.tables.TableRowGroup` that says how its logical columns are read and which of its rows the
    version deleted (``num_rows`` then counts the live rows only).
    """

    path: str
    row_group: int
    num_rows: int
    partition_keys: tuple[tuple[str, str], ...] = ()
    table: Any = None


@dataclass(frozen=True)
class ParquetStore:
    """What is known about a store before reading any data."""

    filesystem: pafs.FileSystem
    url: str | list[str]
    root: str | None
    files: tuple[str, ...]
    metadata_kv: dict[bytes, bytes] = field(default_factory=dict)
    metadata_path: str | None = None
    #: the size of each data file when it was listed, by path (empty when unknown): a read checks it.
    file_sizes: dict[str, int] = field(default_factory=dict)
    #: the modification time (ns) of each data file when it was listed, where the filesystem reports one (the
    #: caches key row groups by it).
    file_mtimes: dict[str, int] = field(default_factory=dict, compare=False)
    #: the files are some of the dataset's at ``root`` (file URLs or a glob), described by its metadata.
    subset: bool = False
    #: whether ``root`` holds a ``_metadata`` summary file, when the listing told (None: not known, ask).
    has_summary: bool | None = None
    #: what was read from the files once (their footers, their unified schema), kept for the next steps
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def relpath(self, path: str) -> str:
        """``path`` relative to the dataset root (the key of the per-file metadata maps)."""
        return posixpath.relpath(path, self.root) if self.root else posixpath.basename(path)

    def url_of(self, path: str) -> str:
        """The URL of a file of the store (under the dataset URL as the user wrote it), for messages."""
        if isinstance(self.url, str):
            if self.files == (path,) and posixpath.basename(self.url.rstrip('/')) == posixpath.basename(path):
                return display_url(self.url)  # the URL of a single file
            if self.root and path.startswith(self.root.rstrip('/') + '/'):
                return display_url(f'{self.url.rstrip("/")}/{self.relpath(path)}')
        return display_url(file_url(self.filesystem, path))

    def table_schema(self) -> pa.Schema | None:
        """The logical schema of a table version; None for a plain store, whose schema is that of its files."""
        return None

    def planned_pieces(self) -> tuple[RowGroupPiece, ...] | None:
        """The row groups a table's log planned; None for a plain store, whose row groups are listed."""
        return None

    @property
    def partition_names(self) -> list[str]:
        """Hive partition column names (``name=value`` directories), outermost first."""
        names: list[str] = []
        for path in self.files:
            for name, _ in partition_keys_of(self.relpath(path)):
                if name not in names:
                    names.append(name)
        return names


def _is_hidden(relative: str) -> bool:
    return any(part.startswith(('_', '.')) or part.endswith(('.crc', '_$folder$'))
               for part in relative.split('/'))


def partition_keys_of(relative_path: str) -> tuple[tuple[str, str], ...]:
    """The ``(name, value)`` pairs of the hive partition directories in a relative file path."""
    keys_found = []
    for part in relative_path.split('/')[:-1]:
        if '=' in part:
            name, value = part.split('=', 1)
            keys_found.append((name, value))
    return tuple(keys_found)


def typed_partition_value(raw: str, numpy_type: Any) -> int | str:
    """A hive directory's value as its field holds it: an ``int`` for an integer field, else the string itself.

    Args:
        raw: the value as the directory name spells it (``'3'`` of ``part=3``).
        numpy_type: the field's numpy type (``np.str_`` for a partition column the schema does not name).
    """
    if isinstance(numpy_type, type) and issubclass(numpy_type, np.integer):
        return int(raw)
    return raw


@dataclass(frozen=True)
class StoreListing:
    """One look at a dataset URL: the entries directly under a directory, or what the path itself is.

    Everything planning needs to know before reading a byte is here (whether the directory is a table, which
    metadata files exist and how big they are, the data files when the directory has no subdirectories), so a
    flat store on an object store costs one listing request, not one request per question.
    """

    root: str
    #: the path itself: a directory (when it holds anything), a file, or not found.
    info: pafs.FileInfo
    #: the entries directly under a directory (files and subdirectories); empty otherwise.
    entries: tuple[pafs.FileInfo, ...] = ()

    def child(self, name: str) -> pafs.FileInfo | None:
        """The entry ``name`` directly under the directory, or None."""
        path = posixpath.join(self.root, name)
        return next((entry for entry in self.entries if entry.path.rstrip('/') == path), None)

    @property
    def is_directory(self) -> bool:
        """Whether the path is a directory with something in it."""
        return self.info.type == pafs.FileType.Directory

    @property
    def has_subdirectories(self) -> bool:
        """Whether a non-hidden subdirectory (a partition directory, say) holds more of the data files."""
        return any(entry.type == pafs.FileType.Directory and not _is_hidden(posixpath.basename(entry.path))
                   for entry in self.entries)


def look_at(filesystem: pafs.FileSystem, root: str) -> StoreListing:
    """List ``root`` once (not recursively); only an empty answer costs a second request, to tell what it is."""
    try:
        entries = filesystem.get_file_info(pafs.FileSelector(root, recursive=False, allow_not_found=True))
    except (NotADirectoryError, FileNotFoundError):
        entries = []
    except OSError as err:
        if err.errno not in (errno.ENOTDIR, errno.ENOENT):
            raise
        entries = []
    # An object store may answer the listing of a file's key with the file itself.
    entries = [entry for entry in entries if entry.path.rstrip('/') != root.rstrip('/')]
    if entries:
        return StoreListing(root, pafs.FileInfo(root, pafs.FileType.Directory), tuple(entries))
    return StoreListing(root, filesystem.get_file_info(root))


def list_data_files(filesystem: pafs.FileSystem, root: str, url: Any = None) -> list[str]:
    """Data files under ``root``, sorted, skipping names that start with ``_`` or ``.`` and ``.crc`` files.

    Raises:
        StorageNotFoundError: ``root`` does not exist (the message names the URL); a ``FileNotFoundError``.
    """
    return [info.path for info in _listed_data_files(filesystem, look_at(filesystem, root), url)]


def _listed_data_files(filesystem: pafs.FileSystem, listing: StoreListing, url: Any = None) -> list[pafs.FileInfo]:
    """What :func:`list_data_files` lists, with each file's size (no request per file).

    A directory without subdirectories is listed already; one with subdirectories is listed once more, recursively
    (one request per thousand objects on an object store).
    """
    root = listing.root
    if listing.info.type == pafs.FileType.NotFound:
        raise StorageNotFoundError(f'dataset {url or root} does not exist')
    if listing.info.type == pafs.FileType.File:
        return [listing.info]
    entries = listing.entries
    if listing.has_subdirectories:
        entries = tuple(filesystem.get_file_info(pafs.FileSelector(root, recursive=True)))
    files = [i for i in entries
             if i.type == pafs.FileType.File and not _is_hidden(posixpath.relpath(i.path, root))]
    return sorted(files, key=lambda i: i.path)


def _sizes_of(infos: Iterable[pafs.FileInfo]) -> dict[str, int]:
    return {info.path: info.size for info in infos if info.size is not None}


def _mtimes_of(infos: Iterable[pafs.FileInfo]) -> dict[str, int]:
    return {info.path: info.mtime_ns for info in infos if info.mtime_ns is not None}


def _read_footer(files: DataFiles, path: str) -> pq.FileMetaData:
    """The Parquet footer of ``path`` (retried on transient errors where the filesystem does not retry)."""
    return with_retries(files.filesystem, lambda: files.footer(path), 'reading the Parquet footer of', path)


def store_data_files(store: ParquetStore, footers: FooterStore | None = None) -> DataFiles:
    """The store's data files as its readers read them: the listing's sizes, the footers read once per process.

    Args:
        store: the opened store.
        footers: where footers read from a remote store are also kept (a reader's local disk cache), taken by
            the first call: make it before anything reads a footer of the store.
    """
    if 'data_files' not in store.memo:
        store.memo['data_files'] = DataFiles(store.filesystem, store.file_sizes, footers)
    return store.memo['data_files']  # type: ignore[no-any-return]


def _read_kv(filesystem: pafs.FileSystem, path: str, known: pafs.FileInfo | None | Literal['ask'] = 'ask'
             ) -> dict[bytes, bytes] | None:
    """The key-value metadata of the Parquet metadata file ``path``; None when there is no such file.

    ``known`` is what a listing already said of the path (None: not there), so that no request asks again.
    """
    info = filesystem.get_file_info(path) if known == 'ask' else known
    if info is None or info.type != pafs.FileType.File:
        return None
    try:
        metadata = _read_footer(DataFiles(filesystem, {path: info.size} if info.size is not None else None), path)
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise PetastormMetadataError(f'{display_url(file_url(filesystem, path))} is not a readable Parquet '
                                     f'metadata file: {err}') from err
    return dict(metadata.metadata or {})


def table_format_of(filesystem: pafs.FileSystem, root: str, listing: StoreListing | None = None) -> str | None:
    """The table format of the directory ``root``: None for a plain store (or a file).

    ``'delta'`` when it holds a ``_delta_log`` directory, ``'iceberg'`` when it holds Iceberg metadata
    (``metadata/*.metadata.json``). ``listing`` is :func:`look_at` of ``root`` when the caller has it.
    """
    listing = listing or look_at(filesystem, root)
    delta, metadata = listing.child(DELTA_LOG), listing.child('metadata')
    if delta is not None and delta.type == pafs.FileType.Directory:
        return 'delta'
    if metadata is not None and metadata.type == pafs.FileType.Directory and any(
            info.path.endswith('.metadata.json')
            for info in filesystem.get_file_info(pafs.FileSelector(metadata.path, recursive=False))):
        return 'iceberg'
    return None


def open_store(location: ResolvedLocation, *, plain: bool = False, listing: StoreListing | None = None) -> ParquetStore:
    """List a store's files and read its ``_common_metadata`` (or ``_metadata``) key-value metadata.

    A file URL, a list of them or a glob pattern gives the files named, with the metadata of the dataset they
    belong to (see the module docstring).

    Args:
        location: the store's URL, resolved.
        plain: read a directory that is a Delta or Iceberg table as plain Parquet files anyway (every file in
            it, those its log removed included); by default such a directory is refused.
        listing: :func:`look_at` of the location's path, when the caller looked already.

    Raises:
        StorageNotFoundError: the path does not exist, or a glob matches no file (a ``FileNotFoundError``).
        StorageError: a list of URLs names a directory (an ``OSError``, as Petastorm's refusal of non-file paths).
        PetastormMetadataError: a metadata file exists but cannot be read, or the directory is a table.
    """
    # Listing and reading the metadata is idempotent: through a filesystem without retries of ours (pyarrow's
    # own S3 client given as filesystem=), a transient failure that its client gave up on repeats it whole.
    where = location.path[0] if isinstance(location.path, list) else location.path
    return with_retries(location.filesystem, lambda: _open_store(location, plain, listing), 'opening the dataset at',
                        where)


def _open_store(location: ResolvedLocation, plain: bool, listing: StoreListing | None) -> ParquetStore:
    fs = location.filesystem
    if isinstance(location.path, list):  # a list of file URLs (location.is_file_list)
        files = tuple(sorted(p for path in location.path for p in _file_or_matches(fs, path, location.url)))
        infos = []
        for path in files:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                raise StorageError(f'dataset file {path} is a directory: a list of URLs names Parquet files; pass '
                                   f'a dataset directory as a single URL')
            if info.type != pafs.FileType.File:
                raise StorageNotFoundError(f'dataset file {path} does not exist')
            infos.append(info)
        return _store_of_files(fs, location.url, files, list_given=True, file_sizes=_sizes_of(infos))
    root = location.path
    listing = listing if listing is not None and listing.root == root else look_at(fs, root)
    if listing.info.type == pafs.FileType.NotFound and _GLOB_MAGIC.search(root):
        return _store_of_files(fs, location.url, tuple(_file_or_matches(fs, root, location.url)), list_given=True)
    listed = _listed_data_files(fs, listing, location.url)
    files = tuple(item.path for item in listed)
    if not listing.is_directory:
        return _store_of_files(fs, location.url, files, list_given=False, file_sizes=_sizes_of(listed))
    table_format = None if plain else table_format_of(fs, root, listing)
    if table_format is not None:
        raise PetastormMetadataError(
            f'{location.url} is a{"n Iceberg" if table_format == "iceberg" else " Delta"} table: its directory '
            f'also holds files that are not part of the current version. Read it with make_batch_reader or '
            f'make_reader (which read the table\'s log), or pass table_format=\'parquet\' to read every Parquet '
            f'file as plain files')
    kv: dict[bytes, bytes] = {}
    metadata_path = None
    for name in (COMMON_METADATA, SUMMARY_METADATA):
        found = _read_kv(fs, posixpath.join(root, name), listing.child(name))
        if found is not None:
            kv, metadata_path = found, posixpath.join(root, name)
            break
    summary = listing.child(SUMMARY_METADATA)
    return ParquetStore(fs, location.url, root, files, kv, metadata_path, _sizes_of(listed),
                        has_summary=summary is not None and summary.type == pafs.FileType.File,
                        file_mtimes=_mtimes_of(listed))


_GLOB_MAGIC = re.compile(r'[*?[]')


def glob_files(fs: pafs.FileSystem, pattern: str, url: Any = None) -> list[str]:
    """The data files a glob pattern matches (``*``, ``?`` and ``[...]`` within a name, ``**`` for directories).

    A path that exists as it is, or has no pattern characters, is returned alone.

    Raises:
        StorageNotFoundError: nothing matches (the message names the pattern and where it looked).
    """
    return _file_or_matches(fs, pattern, url or pattern)


def _file_or_matches(fs: pafs.FileSystem, path: str, url: Any) -> list[str]:
    """``[path]``, or the data files a glob pattern matches when no file or directory has that very name."""
    if not _GLOB_MAGIC.search(path) or fs.get_file_info(path).type != pafs.FileType.NotFound:
        return [path]
    parts = path.split('/')
    first = next(i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part))
    base = '/'.join(parts[:first]) or '/'
    deep = len(parts) - first > 1
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=deep, allow_not_found=True))
    matches = sorted(i.path for i in infos if i.type == pafs.FileType.File
                     and not _is_hidden(posixpath.relpath(i.path, base)) and _glob_match(i.path.split('/'), parts))
    if not matches:
        raise StorageNotFoundError(f'no data file matches {url} (glob pattern {path!r}, looked under {base!r})')
    return matches


def _glob_match(names: list[str], patterns: list[str]) -> bool:
    """Path components against pattern components: ``*``, ``?``, ``[...]`` within one, ``**`` for any number."""
    if not patterns:
        return not names
    if patterns[0] == '**':
        return any(_glob_match(names[i:], patterns[1:]) for i in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], patterns[0]) and _glob_match(names[1:], patterns[1:])


def _store_of_files(fs: pafs.FileSystem, url: Any, files: tuple[str, ...], list_given: bool,
                    file_sizes: dict[str, int] | None = None) -> ParquetStore:
    """A store of some files: with the metadata of the Petastorm dataset they belong to, when there is one."""
    directory = posixpath.commonpath([posixpath.dirname(p) for p in files]) if files else ''
    candidate = directory
    while candidate:
        for name in (COMMON_METADATA, SUMMARY_METADATA):
            path = posixpath.join(candidate, name)
            kv = _read_kv(fs, path)
            if kv is not None and any(k.startswith((b'petastorm.', b'dataset-toolkit.')) for k in kv):
                return ParquetStore(fs, url, candidate, files, kv, path, file_sizes or {}, subset=True)
        if '=' not in posixpath.basename(candidate):  # only partition directories lead further up
            break
        candidate = posixpath.dirname(candidate)
    if list_given:
        return ParquetStore(fs, url, None, files, file_sizes=file_sizes or {})
    return ParquetStore(fs, url, directory, files, file_sizes=file_sizes or {})


#: footers read at a time from local disk (parsing them is the cost) and from remote storage (a round trip each).
LOCAL_FOOTER_THREADS = 16
REMOTE_FOOTER_THREADS = 64


def read_footers(filesystem: pafs.FileSystem, paths: list[str], files: DataFiles | None = None
                 ) -> dict[str, pq.FileMetaData]:
    """The Parquet footers of the files, read 16 at a time from local disk and 64 at a time from remote storage.

    Args:
        filesystem: where the files are.
        paths: the files.
        files: the store's data files, which keep the footers for its readers (default: read them here only).

    Raises:
        CorruptFooterError: a file is not readable Parquet (the message names its URL); a
            ``PetastormMetadataError`` and a ``CorruptDataError``.
    """
    through = files if files is not None else DataFiles(filesystem)

    def read(path: str) -> pq.FileMetaData:
        return _footer_of_data_file(through, path)

    if not paths:
        return {}
    threads = LOCAL_FOOTER_THREADS if isinstance(filesystem, pafs.LocalFileSystem) else REMOTE_FOOTER_THREADS
    with ThreadPoolExecutor(max_workers=min(threads, len(paths))) as pool:
        return dict(zip(paths, pool.map(read, paths), strict=True))


def footer_row_counts(filesystem: pafs.FileSystem, paths: list[str]) -> dict[str, list[int]]:
    """The rows of each row group of each file, read from the Parquet footers (see :func:`read_footers`).

    Args:
        filesystem: where the files are.
        paths: the data files.

    Returns:
        ``{path: [rows of row group 0, 1, ...]}``.

    Raises:
        CorruptFooterError: a file is not readable Parquet (the message names its URL); a
            ``PetastormMetadataError`` and a ``CorruptDataError``.
    """
    return {path: _row_counts(metadata) for path, metadata in read_footers(filesystem, paths).items()}


def _row_counts(metadata: pq.FileMetaData) -> list[int]:
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def store_footers(store: ParquetStore) -> dict[str, pq.FileMetaData]:
    """The footers of every data file of the store, read once (and kept in ``store.memo``)."""
    if 'footers' not in store.memo:
        store.memo['footers'] = read_footers(store.filesystem, list(store.files), store_data_files(store))
    return store.memo['footers']  # type: ignore[no-any-return]


def unified_file_schema(store: ParquetStore) -> UnifiedSchema:
    """The data files' Arrow schemas unified (:mod:`petastorm.metadata.unify`), computed once per store.

    Raises:
        PetastormMetadataError: a file is not readable Parquet.
        SchemaError: the files' schemas cannot be unified (naming the column and files).
    """
    if 'unified' not in store.memo:
        summary = summary_footer(store)
        if summary is not None:  # the files a summary describes share its schema (its writers check that)
            store.memo['unified'] = UnifiedSchema(summary.schema.to_arrow_schema())
            return store.memo['unified']  # type: ignore[no-any-return]
        footers = store_footers(store)
        schemas = {}
        for path in store.files:
            try:
                schemas[path] = footers[path].schema.to_arrow_schema()
            except (pa.ArrowException, ValueError) as err:
                raise PetastormMetadataError(f'{path}: cannot read its Arrow schema: {err}') from err
        store.memo['unified'] = unify_file_schemas(schemas)
    return store.memo['unified']  # type: ignore[no-any-return]


def _footer_of_data_file(files: DataFiles, path: str, url: str | None = None) -> pq.FileMetaData:
    filesystem = files.filesystem
    try:
        return _read_footer(files, path)
    except StorageError:
        raise  # the storage failed (or the file vanished): the file itself may be fine
    except (OSError, pa.ArrowException) as err:
        if isinstance(err, OSError) and err.errno is not None:
            raise
        shown = url or display_url(file_url(filesystem, path))
        raise CorruptFooterError(f'{shown} is not a readable Parquet file: expected a Parquet footer at its end '
                                 f'(the file is truncated, corrupt or not Parquet): {err}') from err


def data_file_schema(store: ParquetStore, path: str) -> pa.Schema:
    """The Arrow schema of one data file of the store: from its footer, or the store's ``_metadata`` summary.

    Raises:
        CorruptFooterError: the footer is unreadable (the message names the file's URL).
    """
    summary = summary_footer(store)
    if summary is not None:
        return summary.schema.to_arrow_schema()
    return _footer_of_data_file(store_data_files(store), path, store.url_of(path)).schema.to_arrow_schema()


def _metadata_file_names(store: ParquetStore) -> set[str]:
    """The data files (relative paths) that the store's key-value metadata says it has: ours and Petastorm's maps."""
    names: set[str] = set()
    for key in (keys.ROW_GROUPS_JSON_KEY, keys.ROW_GROUPS_PER_FILE_KEY):
        raw = store.metadata_kv.get(key)
        if raw is None:
            continue
        try:
            document = json.loads(raw)
            files = document['files'] if key == keys.ROW_GROUPS_JSON_KEY else document
        except (ValueError, KeyError, TypeError):
            continue  # reported where the map is read for its row counts (ours), or never used (Petastorm's)
        if isinstance(files, dict):
            names.update(str(name) for name in files)
    return names


def check_no_missing_files(store: ParquetStore, names: Iterable[str], named_by: str | None) -> None:
    """Raise :class:`MissingDataFilesError` if a file the metadata names (relative paths) was not listed."""
    listed = {store.relpath(path) for path in store.files}
    gone = sorted(set(names) - listed)
    if not gone or store.root is None or store.subset:  # some files of a dataset: the others are not read
        return
    urls = tuple(display_url(f'{str(store.url).rstrip("/")}/{name}') for name in gone)
    shown = ', '.join(urls[:_NAMED_MISSING]) + (f' and {len(urls) - _NAMED_MISSING} more'
                                                  if len(urls) > _NAMED_MISSING else '')
    where = store.url_of(named_by) if named_by else f'the metadata of {store.url}'
    raise MissingDataFilesError(
        f'{where} names {len(gone)} data file(s) that are not in the store: {shown}. They were deleted or never '
        f'uploaded, and their rows cannot be read ({len(listed)} data file(s) are there). Restore them, or if they '
        f'were removed on purpose, refresh the metadata with petastorm-generate-metadata.py --dataset_url '
        f'{display_url(str(store.url))}', urls)


def _row_counts_from_json(store: ParquetStore) -> dict[str, list[int]] | None:
    raw = store.metadata_kv.get(keys.ROW_GROUPS_JSON_KEY)
    if raw is None:
        return None
    try:
        document = json.loads(raw)
        version = document['format_version']
        files = document['files']
    except (ValueError, KeyError, TypeError) as err:
        raise PetastormMetadataError(f'{store.metadata_path}: malformed {keys.ROW_GROUPS_JSON_KEY.decode()} '
                                     f'({err})') from err
    if not isinstance(version, int) or version > keys.ROW_GROUPS_FORMAT_VERSION:
        raise PetastormMetadataError(
            f'{store.metadata_path}: row-group metadata format_version {version!r} is newer than this petastorm '
            f'reads (<= {keys.ROW_GROUPS_FORMAT_VERSION}); upgrade petastorm.')
    by_path = {}
    for path in store.files:
        counts = files.get(store.relpath(path))
        if counts is None:
            return None  # a file the metadata does not know: fall back to the footers
        by_path[path] = [int(c) for c in counts]
    return by_path


def summary_footer(store: ParquetStore) -> pq.FileMetaData | None:
    """The store's ``_metadata`` summary (every file's row groups and statistics in one footer), read once.

    None when the store has none, or when it does not describe every data file (a file added since it was written
    must be read from its own footer). A summary naming files that are gone is refused.

    Raises:
        MissingDataFilesError: the summary names data files that are not in the store.
    """
    if 'summary' not in store.memo:
        store.memo['summary'] = _read_summary(store)
    return store.memo['summary']  # type: ignore[no-any-return]


def _read_summary(store: ParquetStore) -> pq.FileMetaData | None:
    if store.metadata_path is None or store.root is None:
        return None
    summary = posixpath.join(store.root, SUMMARY_METADATA)
    present = store.has_summary if store.has_summary is not None else \
        store.filesystem.get_file_info(summary).type == pafs.FileType.File
    if not present:
        return None
    metadata = _read_footer(DataFiles(store.filesystem), summary)
    if metadata.num_row_groups == 0:
        return None
    named = {metadata.row_group(i).column(0).file_path for i in range(metadata.num_row_groups)}
    check_no_missing_files(store, named, summary)
    return metadata if named >= {store.relpath(path) for path in store.files} else None


def _row_counts_from_summary(store: ParquetStore) -> dict[str, list[int]] | None:
    metadata = summary_footer(store)
    if metadata is None:
        return None
    by_relpath: dict[str, list[int]] = {}
    for i in range(metadata.num_row_groups):
        row_group = metadata.row_group(i)
        by_relpath.setdefault(row_group.column(0).file_path, []).append(row_group.num_rows)
    return {path: by_relpath[store.relpath(path)] for path in store.files}


def _warn_if_deprecated_metadata(store: ParquetStore) -> None:
    """Petastorm datasets from before row-group maps carry a schema but no row-group information."""
    has_schema = keys.SCHEMA_JSON_KEY in store.metadata_kv or keys.UNISCHEMA_KEY in store.metadata_kv
    has_row_groups = keys.ROW_GROUPS_JSON_KEY in store.metadata_kv or keys.ROW_GROUPS_PER_FILE_KEY in \
        store.metadata_kv
    if has_schema and not has_row_groups:
        warn_user(f'You are using a deprecated metadata version. Please run petastorm-generate-metadata.py on '
                  f'spark to update. (petastorm-generate-metadata.py --dataset_url {store.url}); row groups are '
                  f'read from the file footers meanwhile.')


def load_row_groups(store: ParquetStore) -> list[RowGroupPiece]:
    """Every row group of the store, in piece order (sorted path, then row-group number).

    Row counts come from our metadata when it lists every file, else from ``_metadata``, else from the file
    footers, read in parallel. A store whose metadata names files that are gone is refused here, before any row
    is read, rather than read as a smaller (or empty) dataset.

    Raises:
        MissingDataFilesError: the metadata names data files that are not in the store.
        CorruptFooterError: a footer that had to be read is not readable Parquet.
    """
    planned = store.planned_pieces()
    if planned is not None:
        return list(planned)
    check_no_missing_files(store, _metadata_file_names(store), store.metadata_path)
    counts = _row_counts_from_json(store) or _row_counts_from_summary(store)
    if counts is None:
        _warn_if_deprecated_metadata(store)
        counts = {path: _row_counts(metadata) for path, metadata in store_footers(store).items()}
    pieces: list[RowGroupPiece] = []
    for path in store.files:
        partition = partition_keys_of(store.relpath(path)) if store.root else ()
        pieces.extend(RowGroupPiece(path, i, n, partition) for i, n in enumerate(counts[path]))
    return pieces
