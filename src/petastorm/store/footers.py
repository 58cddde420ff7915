"""The footers of a store's data files and its ``_metadata`` summary: read once, in parallel, checked.

This module owns reading Parquet footers (one file's, with retries; many files', 16 at a time from local disk and
64 from remote storage), the error a footer that is not Parquet gives, and what a store learns from its footers
and summary, kept in the store's :attr:`~petastorm.store.model.ParquetStore.reads` so that each is read once per
store: every file's footer, the summary of every file, the Arrow schema of one file and the unified schema of all,
and the row counts of the row groups (from our row-group map of ``_common_metadata`` or the summary, when they
describe every file, without reading a data file).

The store is :mod:`petastorm.store.model`'s; opening it and planning its row groups is
:mod:`petastorm.store.opening`'s.
"""

from __future__ import annotations

import json
import posixpath
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import display_url
from petastorm.errors import CorruptFooterError, PetastormMetadataError, StorageError
from petastorm.fs._files import file_url, with_retries
from petastorm.store import keys
from petastorm.store.data_files import DataFiles, FooterStore
from petastorm.store.listing import SUMMARY_METADATA
from petastorm.store.model import ParquetStore, check_no_missing_files
from petastorm.store.unify import UnifiedSchema, unify_file_schemas

__all__ = [
    'LOCAL_FOOTER_THREADS',
    'REMOTE_FOOTER_THREADS',
    'data_file_schema',
    'footer_row_counts',
    'footer_threads',
    'metadata_row_counts',
    'read_data_file_footer',
    'read_footer',
    'read_footers',
    'store_data_files',
    'store_footer_row_counts',
    'store_footers',
    'summary_footer',
    'unified_file_schema',
]

#: footers read at a time from local disk (parsing them is the cost) and from remote storage (a round trip each).
LOCAL_FOOTER_THREADS = 16
REMOTE_FOOTER_THREADS = 64


def footer_threads(filesystem: pafs.FileSystem) -> int:
    """Footers read at once from ``filesystem``: :data:`LOCAL_FOOTER_THREADS` or :data:`REMOTE_FOOTER_THREADS`."""
    return LOCAL_FOOTER_THREADS if isinstance(filesystem, pafs.LocalFileSystem) else REMOTE_FOOTER_THREADS


def read_footer(files: DataFiles, path: str) -> pq.FileMetaData:
    """The Parquet footer of ``path`` (retried on transient errors where the filesystem does not retry)."""
    return with_retries(files.filesystem, lambda: files.footer(path), 'reading the Parquet footer of', path)


def store_data_files(store: ParquetStore, footers: FooterStore | None = None) -> DataFiles:
    """The store's data files as its readers read them: the listing's sizes, the footers read once per process.

    Args:
        store: the opened store.
        footers: where footers read from a remote store are also kept (a reader's local disk cache), taken by
            the first call: make it before anything reads a footer of the store.
    """
    reads = store.reads
    if reads.data_files is None:
        reads.data_files = DataFiles(store.filesystem, store.file_sizes, footers, listing_seconds=store.listing_seconds)
        reads.data_files.known_footers.update(reads.footer_bytes or {})
    return reads.data_files


def read_footers(filesystem: pafs.FileSystem, paths: list[str], files: DataFiles | None = None,
                 threads: int | None = None) -> dict[str, pq.FileMetaData]:
    """The Parquet footers of the files, read 16 at a time from local disk and 64 at a time from remote storage.

    Args:
        filesystem: where the files are.
        paths: the files.
        files: the store's data files, which keep the footers for its readers (default: read them here only).
        threads: how many to read at a time instead (the ranks of a job each read a share of a store's).

    Raises:
        CorruptFooterError: a file is not readable Parquet (the message names its URL); a
            ``PetastormMetadataError`` and a ``CorruptDataError``.
    """
    through = files if files is not None else DataFiles(filesystem)

    def read(path: str) -> pq.FileMetaData:
        return _footer_of_data_file(through, path)

    if not paths:
        return {}
    through.read_footers_together(paths)
    with ThreadPoolExecutor(max_workers=min(threads or footer_threads(filesystem), len(paths))) as pool:
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


def read_data_file_footer(files: DataFiles, path: str) -> pq.FileMetaData:
    """The footer of the data file ``path`` read through ``files`` (see :func:`read_footers` for the errors)."""
    return _footer_of_data_file(files, path)


def _row_counts(metadata: pq.FileMetaData) -> list[int]:
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


def _footer_of_data_file(files: DataFiles, path: str, url: str | None = None) -> pq.FileMetaData:
    filesystem = files.filesystem
    try:
        return read_footer(files, path)
    except StorageError:
        raise  # the storage failed (or the file vanished): the file itself may be fine
    except (OSError, pa.ArrowException) as err:
        if isinstance(err, OSError) and err.errno is not None:
            raise
        shown = url or display_url(file_url(filesystem, path))
        raise CorruptFooterError(f'{shown} is not a readable Parquet file: expected a Parquet footer at its end '
                                 f'(the file is truncated, corrupt or not Parquet): {err}') from err


def store_footers(store: ParquetStore) -> dict[str, pq.FileMetaData]:
    """The footers of every data file of the store, read once (and kept in ``store.reads``)."""
    reads = store.reads
    if reads.footers is None and reads.footer_stream is not None:
        reads.footers = reads.footer_stream.footers()  # a reader's stream is reading them (None: it was stopped)
    if reads.footers is None:
        reads.footers = read_footers(store.filesystem, list(store.files), store_data_files(store))
    return reads.footers


def store_footer_row_counts(store: ParquetStore) -> dict[str, list[int]]:
    """The rows of each row group of each data file of the store, from its footers (see :func:`store_footers`).

    Raises:
        CorruptFooterError: a footer is not readable Parquet.
    """
    return {path: _row_counts(metadata) for path, metadata in store_footers(store).items()}


def unified_file_schema(store: ParquetStore) -> UnifiedSchema:
    """The data files' Arrow schemas unified (:mod:`petastorm.store.unify`), computed once per store.

    Raises:
        PetastormMetadataError: a file is not readable Parquet.
        SchemaError: the files' schemas cannot be unified (naming the column and files).
    """
    reads = store.reads
    if reads.unified is None:
        summary = summary_footer(store)
        if summary is not None:  # the files a summary describes share its schema (its writers check that)
            reads.unified = UnifiedSchema(summary.schema.to_arrow_schema())
            return reads.unified
        footers = store_footers(store)
        schemas = {}
        for path in store.files:
            try:
                schemas[path] = footers[path].schema.to_arrow_schema()
            except (pa.ArrowException, ValueError) as err:
                raise PetastormMetadataError(f'{path}: cannot read its Arrow schema: {err}') from err
        reads.unified = unify_file_schemas(schemas)
    return reads.unified


def data_file_schema(store: ParquetStore, path: str) -> pa.Schema:
    """The Arrow schema of one data file of the store: from its footer, or the store's ``_metadata`` summary.

    Raises:
        CorruptFooterError: the footer is unreadable (the message names the file's URL).
    """
    summary = summary_footer(store)
    if summary is not None:
        return summary.schema.to_arrow_schema()
    return _footer_of_data_file(store_data_files(store), path, store.url_of(path)).schema.to_arrow_schema()


def summary_footer(store: ParquetStore) -> pq.FileMetaData | None:
    """The store's ``_metadata`` summary (every file's row groups and statistics in one footer), read once.

    None when the store has none, or when it does not describe every data file (a file added since it was written
    must be read from its own footer). A summary naming files that are gone is refused.

    Raises:
        MissingDataFilesError: the summary names data files that are not in the store.
    """
    reads = store.reads
    if not reads.summary_read:
        reads.summary, reads.summary_read = _read_summary(store), True
    return reads.summary


def _read_summary(store: ParquetStore) -> pq.FileMetaData | None:
    if store.metadata_path is None or store.root is None:
        return None
    summary = posixpath.join(store.root, SUMMARY_METADATA)
    present = store.has_summary if store.has_summary is not None else \
        store.filesystem.get_file_info(summary).type == pafs.FileType.File
    if not present:
        return None
    sizes = {summary: store.summary_size} if store.summary_size is not None else None
    metadata = read_footer(DataFiles(store.filesystem, sizes), summary)
    if metadata.num_row_groups == 0:
        return None
    named = {metadata.row_group(i).column(0).file_path for i in range(metadata.num_row_groups)}
    check_no_missing_files(store, named, summary)
    return metadata if named >= {store.relpath(path) for path in store.files} else None


def metadata_row_counts(store: ParquetStore) -> dict[str, list[int]] | None:
    """The rows of each row group of each data file as the store's metadata gives them, without a data file read.

    From our row-group map of ``_common_metadata`` when it lists every file, else from the ``_metadata`` summary
    when it describes every file; None when neither does (the footers then give them).

    Raises:
        PetastormMetadataError: our row-group map is malformed, or of a format newer than this package reads.
        MissingDataFilesError: the summary names data files that are not in the store.
    """
    return _row_counts_from_json(store) or _row_counts_from_summary(store)


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


def _row_counts_from_summary(store: ParquetStore) -> dict[str, list[int]] | None:
    metadata = summary_footer(store)
    if metadata is None:
        return None
    by_relpath: dict[str, list[int]] = {}
    for i in range(metadata.num_row_groups):
        row_group = metadata.row_group(i)
        by_relpath.setdefault(row_group.column(0).file_path, []).append(row_group.num_rows)
    return {path: by_relpath[store.relpath(path)] for path in store.files}
