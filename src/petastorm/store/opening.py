"""Opening a store: recognising a URL's format and opening one version of a table, or a plain Parquet store.

:func:`open_any_store` is the one way a store is opened for reading, whatever it is: a table (recognised by the
registry of :mod:`petastorm.store.formats`, and opened by its format's module) or plain Parquet, opened here
(:func:`open_store`): its data files and its ``_common_metadata``.

A plain store may also be some files of a dataset: one file URL, a list of them, or a glob pattern
(``.../part-000*.parquet``, expanded here when no file has that very name). Their schema is then the dataset's,
found in the ``_common_metadata`` of the directory holding them (or of the dataset directory above their
``name=value`` partition directories). Its row groups are the store's to list
(:meth:`~petastorm.store.plain.PlainStore.row_groups`).

A reader that reads the footers itself, alone or as rank 0 of a job (``first_footer_ahead``), has the first data
file's footer read while the ``_common_metadata`` is: it reads that footer next in any case (the columns the files
hold), and far away the two reads (a round trip or two each) then cost the time of one. The footer and the file
opened for it are kept in the store's data files (:attr:`~petastorm.store.model.StoreReads.data_files`), where the
reader's reads find them.

A GCS store of :data:`MANY_GCS_FILES` or more data files opened with pyarrow's own client is read through gcsfs
instead, made from the same options (:attr:`~petastorm.fs.ResolvedLocation.fsspec_twin`) and listed once more
through it: pyarrow's client opens files one after the other whatever the threads (docs/storage.md, "GCS"), where
gcsfs reads many at once. An epoch of 1,000 files of 100 rows behind 10 ms took 32.6 s through pyarrow's client and
1.6 s through gcsfs; a store of a few large files stays with pyarrow's client, which decodes while it reads.

This module builds on :mod:`petastorm.store.listing` (what the store's directory holds),
:mod:`petastorm.store.formats` (which table formats there are) and :mod:`petastorm.store.plain` (the plain store).
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

from petastorm._describe import display_url
from petastorm.errors import MissingDependencyError, PetastormMetadataError, StorageError, StorageNotFoundError
from petastorm.fs import ResolvedLocation, resolve_location
from petastorm.fs._files import file_url, with_retries
from petastorm.store.data_files import DataFiles
from petastorm.store.footers import read_footer
from petastorm.store.formats import TABLE_FORMAT_REGISTRY, TableFormatEntry, format_named, table_format_of
from petastorm.store.listing import (
    COMMON_METADATA,
    SUMMARY_METADATA,
    Look,
    StoreListing,
    glob_files,
    is_glob_pattern,
    listed_data_files,
    look_at,
    mtimes_of,
    sizes_of,
)
from petastorm.store.model import ParquetStore
from petastorm.store.plain import PlainStore
from petastorm.store.plain_or_sized import keeps_files_open

__all__ = ['MANY_GCS_FILES', 'open_any_store', 'open_store']

#: data files from which a GCS store opened with pyarrow's client is read through gcsfs (module docstring).
MANY_GCS_FILES = 32


def open_any_store(url_or_table: Any, *, storage_options: dict[str, Any] | None = None, filesystem: Any = None,
                   table_format: str = 'auto', table_version: Any = None, split: str | None = None,
                   first_footer_ahead: bool = False, look: Look = look_at) -> ParquetStore:
    """The store a reader reads: one version of a table, or a plain Parquet store.

    Args:
        url_or_table: a dataset URL, a list of Parquet file URLs, a table directory URL, a URL naming a file read as
            a table (an Iceberg metadata file, ``.../metadata/00003-....metadata.json``) or a table object of a
            format's library (a ``pyiceberg`` table, from any catalog).
        storage_options: fsspec options for the URL (the table libraries get them translated).
        filesystem: a ready filesystem for the data files, instead of resolving the URL.
        table_format: ``'auto'`` (recognise tables), a format of the registry (``'delta'``, ``'iceberg'``) or
            ``'parquet'`` (read the directory's files as plain Parquet, a table's too).
        table_version: None (the latest), or the version to read (see :func:`petastorm.reader.make_reader`).
        split: of a plain Parquet directory, only the files of this split (Hugging Face ``datasets``' naming:
            :func:`petastorm.store.listing.split_of`); None: every file.
        first_footer_ahead: the caller reads the first data file's footer next (a reader that plans from the
            footers): of a remote plain directory, it is read while the ``_common_metadata`` is (the module docstring).
        look: lists the URL's directory (:func:`~petastorm.store.listing.look_at`; the ranks of a job take rank
            0's listing instead).

    Raises:
        ValueError: ``table_version`` given for plain Parquet, or a table object of another format than
            ``table_format``.
        PetastormMetadataError: ``table_format`` does not match what is there.
        TableVersionError, UnsupportedTableFeatureError: see the format modules.
    """
    of_object = _format_of_object(url_or_table, table_format)
    if split is not None and of_object is not None:
        raise ValueError(f'split={split!r} chooses the files of a Parquet directory; a table object has none')
    if of_object is not None:
        return of_object.opener(of_object=True)(url_or_table, version=table_version,
                                                storage_options=storage_options, filesystem=filesystem)
    location = resolve_location(url_or_table, storage_options, filesystem)
    if table_format == 'parquet' or location.is_file_list:
        if table_version is not None:
            raise ValueError(f'table_version={table_version!r} needs a table ({_any_table()}); '
                             f'{display_url(str(url_or_table))} is read as plain Parquet')
        return open_store(location, plain=True, split=split, first_footer_ahead=first_footer_ahead, look=look)
    found, listing = _recognise(location, table_format, look)
    if found is not None and split is not None:
        raise ValueError(f'split={split!r} chooses the files of a Parquet directory, but '
                         f'{display_url(str(location.url))} is {_a(found.title)} table: read its version')
    if found is not None:
        return found.opener()(location, version=table_version, storage_options=storage_options,
                              filesystem=filesystem)
    if table_version is not None:
        raise ValueError(f'table_version={table_version!r} needs a table, but {display_url(str(location.url))} '
                         f'is not {_a(_any_table())} table')
    return open_store(location, plain=True, listing=listing, split=split, first_footer_ahead=first_footer_ahead)


def _format_of_object(value: Any, table_format: str) -> TableFormatEntry | None:
    """The format whose library's table object ``value`` is (None: it is none), checked against ``table_format``."""
    found = next((entry for entry in TABLE_FORMAT_REGISTRY if entry.is_table_object(value)), None)
    if found is not None and table_format not in ('auto', found.name):
        raise ValueError(f'table_format={table_format!r} cannot read a {found.library} table; pass '
                         f"table_format='auto' or '{found.name}'")
    return found


def _recognise(location: ResolvedLocation, table_format: str,
               look: Look) -> tuple[TableFormatEntry | None, StoreListing | None]:
    """The table format of a single URL (None: plain Parquet), checked against ``table_format``, and its listing.

    A URL naming a file that a format reads as a table is that format's; a directory is listed once, and that one
    listing both answers whether it is a table and, for a plain store, what it holds.
    """
    fs, root = location.filesystem, str(location.path)
    listing = None
    found = next((entry for entry in TABLE_FORMAT_REGISTRY
                  if entry.names_table_file(root) and table_format in ('auto', entry.name)), None)
    if found is None:
        listing = with_retries(fs, lambda: look(fs, root), 'listing', root)
        found = format_named(table_format_of(fs, root, listing))
    found_name = None if found is None else found.name
    if table_format not in ('auto', found_name):
        raise PetastormMetadataError(f'table_format={table_format!r}, but {display_url(str(location.url))} is '
                                     f'{"not a table" if found_name is None else "a " + found_name + " table"}')
    return found, listing


def _any_table() -> str:
    """``'Delta or Iceberg'``: the formats of the registry, for messages."""
    return ' or '.join(entry.title for entry in TABLE_FORMAT_REGISTRY)


def _a(title: str) -> str:
    """``'a Delta'``, ``'an Iceberg'``."""
    return f'{"an" if title[:1].lower() in "aeiou" else "a"} {title}'


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


def open_store(location: ResolvedLocation, *, plain: bool = False, listing: StoreListing | None = None,
               split: str | None = None, first_footer_ahead: bool = False, look: Look = look_at) -> PlainStore:
    """The plain Parquet store at ``location``: its files listed, its ``_common_metadata`` (or ``_metadata``) read.

    A file URL, a list of them or a glob pattern gives the files named, with the metadata of the dataset they
    belong to (see the module docstring).

    Args:
        location: the store's URL, resolved.
        plain: read a directory that is a Delta or Iceberg table as plain Parquet files anyway (every file in
            it, those its log removed included); by default such a directory is refused.
        listing: :func:`look_at` of the location's path, when the caller looked already.
        split: only the files of this split of a directory (see :func:`open_any_store`).
        first_footer_ahead: see :func:`open_any_store`.
        look: see :func:`open_any_store`.

    Raises:
        StorageNotFoundError: the path does not exist, or a glob matches no file (a ``FileNotFoundError``).
        StorageError: a list of URLs names a directory (an ``OSError``, as Petastorm's refusal of non-file paths).
        PetastormMetadataError: a metadata file exists but cannot be read, or the directory is a table.
    """
    # Listing and reading the metadata is idempotent: through a filesystem without retries of ours (pyarrow's
    # own S3 client given as filesystem=), a transient failure that its client gave up on repeats it whole.
    where = location.path[0] if isinstance(location.path, list) else location.path
    if split is not None and (location.is_file_list or is_glob_pattern(str(location.path))):
        raise ValueError(f'split={split!r} chooses among the files of a directory, but {location.url} names its '
                         f'files already: pass the directory (or leave split out)')
    return with_retries(location.filesystem,
                        lambda: _open_store(location, plain, listing, split, first_footer_ahead, look),
                        'opening the dataset at', where)


def _open_store(location: ResolvedLocation, plain: bool, listing: StoreListing | None, split: str | None,
                first_footer_ahead: bool, look: Look) -> PlainStore:
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
    listing = listing if listing is not None and listing.root == root else look(fs, root)
    if listing.info.type == pafs.FileType.NotFound and is_glob_pattern(root):
        return _store_of_files(fs, location.url, tuple(glob_files(fs, root, location.url)), list_given=True)
    listed = listed_data_files(fs, listing, location.url, split)
    if not listing.is_directory:
        files = tuple(item.path for item in listed)
        return _store_of_files(fs, location.url, files, list_given=False, file_sizes=sizes_of(listed))
    table_format = format_named(None if plain else table_format_of(fs, root, listing))
    if table_format is not None:
        raise PetastormMetadataError(
            f'{location.url} is {_a(table_format.title)} table: its directory also holds files that are not part '
            f'of the current version. Read it with make_batch_reader or make_reader (which read the table\'s log), '
            f'or pass table_format=\'parquet\' to read every Parquet file as plain files')
    fs, listing, listed = _many_files_through_fsspec(location, listing, listed, split)
    files = tuple(item.path for item in listed)
    summary = listing.child(SUMMARY_METADATA)
    has_summary = _is_file(listing, SUMMARY_METADATA)
    data_files = None
    if first_footer_ahead and files and not has_summary and keeps_files_open(fs) and \
            _is_file(listing, COMMON_METADATA):
        data_files = DataFiles(fs, sizes_of(listed), listing_seconds=listing.seconds)
    kv, metadata_path = _metadata_with_first_footer(fs, root, listing, data_files, files)
    store = PlainStore(fs, location.url, root, files, kv, metadata_path, sizes_of(listed), has_summary=has_summary,
                       summary_size=summary.size if summary is not None else None,
                       file_mtimes=mtimes_of(listed), listing_seconds=listing.seconds)
    store.reads.data_files = data_files
    return store


def _many_files_through_fsspec(location: ResolvedLocation, listing: StoreListing, listed: list[pafs.FileInfo],
                               split: str | None) -> tuple[pafs.FileSystem, StoreListing, list[pafs.FileInfo]]:
    """The filesystem the store is read through, and its listing there (gcsfs for many GCS files: module docstring).

    The listing is the store's own unless the store is read through gcsfs, which lists it again.
    """
    if location.fsspec_twin is None or len(listed) < MANY_GCS_FILES:
        return location.filesystem, listing, listed
    try:
        fs = location.fsspec_twin()
    except MissingDependencyError:
        return location.filesystem, listing, listed  # gcsfs is not installed: pyarrow's client reads them
    again = look_at(fs, listing.root)
    return fs, again, listed_data_files(fs, again, location.url, split)


def _is_file(listing: StoreListing, name: str) -> bool:
    child = listing.child(name)
    return child is not None and child.type == pafs.FileType.File


def _metadata_with_first_footer(fs: pafs.FileSystem, root: str, listing: StoreListing, data_files: DataFiles | None,
                                files: tuple[str, ...]) -> tuple[dict[bytes, bytes], str | None]:
    """The store's key-value metadata and where it is (``_common_metadata``, else ``_metadata``; none: ``{}``).

    With ``data_files``, the first data file's footer is read through them meanwhile, in a thread joined here. A
    failed read of it is dropped: nothing is kept, and the reader's own read of the footer, next, raises it.
    """
    if data_files is None:
        return _metadata_kv(fs, root, listing)
    with ThreadPoolExecutor(1, thread_name_prefix='petastorm-first-footer') as pool:
        ahead = pool.submit(data_files.footer, files[0])
        found = _metadata_kv(fs, root, listing)
    ahead.exception()  # taken, not raised (the docstring)
    return found


def _metadata_kv(fs: pafs.FileSystem, root: str, listing: StoreListing) -> tuple[dict[bytes, bytes], str | None]:
    for name in (COMMON_METADATA, SUMMARY_METADATA):
        found = _read_kv(fs, posixpath.join(root, name), listing.child(name))
        if found is not None:
            return found, posixpath.join(root, name)
    return {}, None


def _store_of_files(fs: pafs.FileSystem, url: Any, files: tuple[str, ...], list_given: bool,
                    file_sizes: dict[str, int] | None = None) -> PlainStore:
    """A store of some files: with the metadata of the Petastorm dataset they belong to, when there is one."""
    directory = posixpath.commonpath([posixpath.dirname(p) for p in files]) if files else ''
    candidate = directory
    while candidate:
        for name in (COMMON_METADATA, SUMMARY_METADATA):
            path = posixpath.join(candidate, name)
            kv = _read_kv(fs, path)
            if kv is not None and any(k.startswith((b'petastorm.', b'dataset-toolkit.')) for k in kv):
                return PlainStore(fs, url, candidate, files, kv, path, file_sizes or {}, subset=True)
        if '=' not in posixpath.basename(candidate):  # only partition directories lead further up
            break
        candidate = posixpath.dirname(candidate)
    if list_given:
        return PlainStore(fs, url, None, files, file_sizes=file_sizes or {})
    return PlainStore(fs, url, directory, files, file_sizes=file_sizes or {})
