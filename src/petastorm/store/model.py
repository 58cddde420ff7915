"""What a Parquet store is once opened: its files and metadata, its row groups, its partitions.

This module owns the plain data every step after opening shares: :class:`ParquetStore` (what is known about a
store before reading any data), :class:`StoreReads` (what was read from its files once, for the next steps),
:class:`RowGroupPiece` (one row group, the unit of work of every reader), the hive partition values in the files'
paths, and the check that the metadata names no data file the store lacks.

It sits below the modules that fill it in and read through it: :mod:`petastorm.store.footers` (the footers and
the ``_metadata`` summary, kept in :attr:`ParquetStore.reads`) and :mod:`petastorm.store.opening` (opening a store
and listing its row groups).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import display_url
from petastorm.errors import MissingDataFilesError
from petastorm.fs._files import file_url
from petastorm.store.data_files import DataFiles
from petastorm.store.unify import UnifiedSchema

__all__ = [
    'ParquetStore',
    'RowGroupPiece',
    'StoreReads',
    'check_no_missing_files',
    'partition_keys_of',
    'typed_partition_value',
]

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


@dataclass(eq=False)
class StoreReads:
    """What was read from a store's files once, kept for the later steps: each is filled in when first needed.

    Attributes:
        data_files: the data files as its readers read them (see :func:`petastorm.store.footers.store_data_files`).
        footers: the footer of every data file, by path.
        summary: the ``_metadata`` summary, when it describes every data file (see ``summary_read``).
        summary_read: whether the summary was looked for (``summary`` is None also when there is none).
        unified: the data files' Arrow schemas unified (:mod:`petastorm.store.unify`).
    """

    data_files: DataFiles | None = None
    footers: dict[str, pq.FileMetaData] | None = None
    summary: pq.FileMetaData | None = None
    summary_read: bool = False
    unified: UnifiedSchema | None = None


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
    #: what was read from the files once (their footers, their unified schema), kept for the next steps.
    reads: StoreReads = field(default_factory=StoreReads, compare=False, repr=False)

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
