"""Opening a Parquet store: its data files, its ``_common_metadata`` and its row groups.

The order of row groups (sorted file path, then row-group number) is the piece order shared with Petastorm:
sharding, row-group indexes and cache keys all refer to positions in it.

A store may also be some files of a dataset: one file URL, a list of them, or a glob pattern
(``.../part-000*.parquet``, expanded here when no file has that very name). Their schema is then the dataset's,
found in the ``_common_metadata`` of the directory holding them (or of the dataset directory above their
``name=value`` partition directories).

This module owns opening a store (:func:`open_store`) and listing its row groups (:func:`load_row_groups`); it
builds on three others: :mod:`petastorm.store.listing` (what the store's directory holds),
:mod:`petastorm.store.model` (the store and its row groups as data) and :mod:`petastorm.store.footers`
(the footers and the ``_metadata`` summary).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

from petastorm._describe import display_url
from petastorm._warnings import warn_user
from petastorm.errors import PetastormMetadataError, StorageError, StorageNotFoundError
from petastorm.fs import ResolvedLocation
from petastorm.fs._files import file_url, with_retries
from petastorm.store import keys
from petastorm.store.data_files import DataFiles
from petastorm.store.footers import metadata_row_counts, read_footer, store_footer_row_counts
from petastorm.store.listing import (
    COMMON_METADATA,
    SUMMARY_METADATA,
    StoreListing,
    glob_files,
    is_glob_pattern,
    listed_data_files,
    look_at,
    mtimes_of,
    sizes_of,
    table_format_of,
)
from petastorm.store.model import ParquetStore, RowGroupPiece, check_no_missing_files, partition_keys_of

__all__ = ['load_row_groups', 'open_store']


def _read_kv(filesystem: pafs.FileSystem, path: str, known: pafs.FileInfo | None | Literal['ask'] = 'ask'
             ) -> dict[bytes, bytes] | None:
    """The key-value metadata of the Parquet metadata file ``path``; None when there is no such file.

    ``known`` is what a listing already said of the path (None: not there), so that no request asks again.
    """
    info = filesystem.get_file_info(path) if known == 'ask' else known
    if info is None or info.type != pafs.FileType.File:
        return None
    try:
        metadata = read_footer(DataFiles(filesystem, {path: info.size} if info.size is not None else None), path)
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise PetastormMetadataError(f'{display_url(file_url(filesystem, path))} is not a readable Parquet '
                                     f'metadata file: {err}') from err
    return dict(metadata.metadata or {})


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
        files = tuple(sorted(p for path in location.path for p in glob_files(fs, path, location.url)))
        infos = []
        for path in files:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                raise StorageError(f'dataset file {path} is a directory: a list of URLs names Parquet files; pass '
                                   f'a dataset directory as a single URL')
            if info.type != pafs.FileType.File:
                raise StorageNotFoundError(f'dataset file {path} does not exist')
            infos.append(info)
        return _store_of_files(fs, location.url, files, list_given=True, file_sizes=sizes_of(infos))
    root = location.path
    listing = listing if listing is not None and listing.root == root else look_at(fs, root)
    if listing.info.type == pafs.FileType.NotFound and is_glob_pattern(root):
        return _store_of_files(fs, location.url, tuple(glob_files(fs, root, location.url)), list_given=True)
    listed = listed_data_files(fs, listing, location.url)
    files = tuple(item.path for item in listed)
    if not listing.is_directory:
        return _store_of_files(fs, location.url, files, list_given=False, file_sizes=sizes_of(listed))
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
    return ParquetStore(fs, location.url, root, files, kv, metadata_path, sizes_of(listed),
                        has_summary=summary is not None and summary.type == pafs.FileType.File,
                        file_mtimes=mtimes_of(listed))


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
    counts = metadata_row_counts(store)
    if counts is None:
        _warn_if_deprecated_metadata(store)
        counts = store_footer_row_counts(store)
    pieces: list[RowGroupPiece] = []
    for path in store.files:
        partition = partition_keys_of(store.relpath(path)) if store.root else ()
        pieces.extend(RowGroupPiece(path, i, n, partition) for i, n in enumerate(counts[path]))
    return pieces
