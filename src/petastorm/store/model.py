"""What a store is: the store interface every kind of store implements, and the data all of them share.

A reader reads plain Parquet and one version of a Delta or Iceberg table alike. What differs between them is
:class:`Store`, a small interface: the reader's setup, the planner, the workers (through the store's pieces:
:class:`~petastorm.store.pieces.LogicalRows`), ``petastorm-inspect`` and the Ray datasource ask a store, never which
kind it is. :class:`ParquetStore` is what every store is besides: its filesystem and data files (as listed: sizes
and modification times, which the caches key entries by), its key-value metadata, and :class:`StoreReads`, what
was read from its files once for the next steps. The kinds are :class:`petastorm.store.plain.PlainStore` and
:class:`petastorm.tables.TableStore`; which kind a URL is, is recognised when it is opened
(:func:`petastorm.store.opening.open_any_store`).

This module also owns the check that the metadata names no data file the store lacks. It sits below the modules
that fill a store in and read through it: :mod:`petastorm.store.footers` (the footers and the ``_metadata``
summary, kept in :attr:`ParquetStore.reads`) and :mod:`petastorm.store.opening` (opening a store).
"""

from __future__ import annotations

import abc
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import display_url
from petastorm.errors import MissingDataFilesError
from petastorm.fs._files import file_url
from petastorm.store.data_files import DataFiles
from petastorm.store.pieces import RowGroupPiece
from petastorm.store.unify import UnifiedSchema

__all__ = [
    'FilterStatistics',
    'ParquetStore',
    'Store',
    'StoreReads',
    'StoreSchema',
    'check_no_missing_files',
]

#: missing data files a message names (all of them are in the error's ``urls``).
_NAMED_MISSING = 5


@dataclass(frozen=True)
class FilterStatistics:
    """What a store's statistics and partition values say about ``filters``, per ``(path, row group)``.

    Attributes:
        matching: the row groups some row of which may match (the others match in no row).
        matching_all: those among them that match in every row (no row can fail, and none is null).
    """

    matching: frozenset[tuple[str, int]]
    matching_all: frozenset[tuple[str, int]]


class StoreSchema(NamedTuple):
    """The Arrow schema of a store's rows, as a schema is inferred from it when its metadata has none.

    Attributes:
        arrow: the columns' Arrow schema (a table's partition columns included, typed by its log).
        partition_values: the values of the hive partition directories, by column, whose type they decide
            (a partition column whose every value is an integer is one).
        differences: how the data files' schemas differ from ``arrow`` ('' when they agree): the reader warns.
    """

    arrow: pa.Schema
    partition_values: Mapping[str, list[str]]
    differences: str = ''


class Store(abc.ABC):
    """The store interface: what a reader asks of a store, which each kind of store answers its own way.

    Plain Parquet (:class:`petastorm.store.plain.PlainStore`) lists its row groups from its metadata or footers,
    takes its partitions from hive directories and its statistics from the footers; a table version
    (:class:`petastorm.tables.TableStore`) has them from its log, and deletes rows.
    """

    @property
    @abc.abstractmethod
    def partition_names(self) -> list[str]:
        """The partition columns (whose values no file stores), outermost first."""

    @abc.abstractmethod
    def row_groups(self) -> list[RowGroupPiece]:
        """Every row group the store delivers rows of, in piece order (sorted path, then row-group number).

        The piece order is shared with Petastorm: sharding, row-group indexes and cache keys refer to it.
        """

    @abc.abstractmethod
    def logical_schema(self) -> StoreSchema:
        """The Arrow schema of the store's rows, that a schema is inferred from when its metadata has none."""

    @abc.abstractmethod
    def column_names(self) -> set[str]:
        """The columns the data files hold (partition columns aside), as the reader reads them."""

    @abc.abstractmethod
    def filter_statistics(self, expression: Any, whole: bool = True) -> FilterStatistics:
        """Which row groups may match the filter ``expression`` and, with ``whole``, which match in every row.

        Raises:
            ValueError: the expression names a column the store does not have, or cannot be applied to its types.
        """

    @abc.abstractmethod
    def deleted_rows_by_file(self) -> dict[str, int]:
        """The rows of each data file that the store does not deliver (a table's deletes), by path."""

    @abc.abstractmethod
    def version_key(self) -> tuple[str, int | None] | None:
        """``(format, version)`` of the table version the store is, as saved positions record it.

        None for a store without versions (plain Parquet).
        """

    @abc.abstractmethod
    def describe_version(self) -> dict[str, Any] | None:
        """The table version as ``petastorm-inspect`` describes it (format, version, features, deletes)."""

    @abc.abstractmethod
    def metadata_source(self) -> str | None:
        """Where the store's key-value metadata came from, as ``petastorm-inspect`` names it (None: none)."""


@dataclass(eq=False)
class StoreReads:
    """What was read from a store's files once, kept for the later steps: each is filled in when first needed.

    Attributes:
        data_files: the data files as its readers read them (see :func:`petastorm.store.footers.store_data_files`).
        footers: the footer of every data file, by path.
        summary: the ``_metadata`` summary, when it describes every data file (see ``summary_read``).
        summary_read: whether the summary was looked for (``summary`` is None also when there is none).
        unified: the data files' Arrow schemas unified (:mod:`petastorm.store.unify`).
        row_counts: the rows of each row group of each data file, by path, when a saved plan gave them
            (:mod:`petastorm.store.saved_plan`): no footer is read for them then.
        footer_bytes: the footers that came as Parquet metadata bytes (with a saved plan, or from the other ranks
            of a job), by path: the files a reader opens need not be asked for them.
        footer_stream: the :class:`~petastorm.store.footer_stream.FooterStream` reading the footers behind a
            reader, when one is: what needs every footer waits for it instead of reading them again.
    """

    data_files: DataFiles | None = None
    footers: dict[str, pq.FileMetaData] | None = None
    summary: pq.FileMetaData | None = None
    summary_read: bool = False
    unified: UnifiedSchema | None = None
    row_counts: dict[str, list[int]] | None = None
    footer_bytes: dict[str, bytes] | None = None
    footer_stream: Any = None


@dataclass(frozen=True)
class ParquetStore(Store):
    """What is known about a store of Parquet files before reading any data, whatever its kind.

    Attributes:
        filesystem: where its files are.
        url: the URL (or URLs) it was opened from, as the user wrote it.
        root: its directory (None: files named one by one, outside any dataset).
        files: its data files, sorted.
        metadata_kv: the key-value metadata describing it (``_common_metadata``, or a table's properties).
        metadata_path: where that metadata is (None: none).
    """

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
    #: the size of that ``_metadata`` when the listing gave it (its read then asks no size).
    summary_size: int | None = field(default=None, compare=False)
    #: seconds the request listing ``root`` took (None: not timed): a small store listed quickly is read without
    #: importing ``pyarrow.dataset`` (:func:`~petastorm.store.plain_or_sized.plain_opens`).
    listing_seconds: float | None = field(default=None, compare=False)
    #: what was read from the files once (their footers, their unified schema), kept for the next steps.
    reads: StoreReads = field(default_factory=StoreReads, compare=False, repr=False)

    def relpath(self, path: str) -> str:
        """``path`` relative to the dataset root (the key of the per-file metadata maps)."""
        if not self.root:
            return posixpath.basename(path)
        prefix = self.root.rstrip('/') + '/'
        if path.startswith(prefix) and '/.' not in path and '//' not in path:  # a listed path: no need to normalize
            return path[len(prefix):]
        return posixpath.relpath(path, self.root)

    def url_of(self, path: str) -> str:
        """The URL of a file of the store (under the dataset URL as the user wrote it), for messages."""
        if isinstance(self.url, str):
            if self.files == (path,) and posixpath.basename(self.url.rstrip('/')) == posixpath.basename(path):
                return display_url(self.url)  # the URL of a single file
            if self.root and path.startswith(self.root.rstrip('/') + '/'):
                return display_url(f'{self.url.rstrip("/")}/{self.relpath(path)}')
        return display_url(file_url(self.filesystem, path))


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
