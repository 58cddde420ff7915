"""The table formats a reader recognises: how a table of each is told from plain Parquet, and what opens it.

A store is plain Parquet unless it is recognised as a table. :data:`TABLE_FORMAT_REGISTRY` holds one entry per
table format: how its directory is recognised from the one listing of it (Delta: a ``_delta_log`` directory;
Iceberg: ``metadata/*.metadata.json``), which URLs name a file that is read as the table (an Iceberg metadata file),
which objects are tables of it (a ``pyiceberg`` table), and the functions that open one version of it. The
functions are named (``'module:function'``), not imported: a format's module builds on this package (its stores
are ``ParquetStore`` subclasses) and is imported only when a table of that format is opened, as fsspec names its
filesystems, so nothing in this package depends on a table format. :func:`petastorm.store.opening.open_any_store`
asks the registry.

Adding a table format is one module (under :mod:`petastorm.tables`) whose function opens a version of a table as
:class:`OpenTable` says, and its entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import pyarrow.fs as pafs

from petastorm.store.listing import DELTA_LOG, StoreListing, look_at
from petastorm.store.model import ParquetStore

__all__ = ['TABLE_FORMATS', 'TABLE_FORMAT_REGISTRY', 'OpenTable', 'TableFormat', 'TableFormatEntry', 'format_named',
           'is_iceberg_table', 'table_format_of']

#: The ``table_format`` a reader takes; ``'parquet'`` reads a directory's files as plain Parquet, a table's too.
TableFormat = Literal['auto', 'delta', 'iceberg', 'parquet']
#: Every ``table_format``: ``'auto'``, the registry's formats, ``'parquet'``.
TABLE_FORMATS: tuple[str, ...] = ('auto', 'delta', 'iceberg', 'parquet')


class OpenTable(Protocol):
    """A format's function that opens one version of a table as a store (it is called with keyword arguments)."""

    def __call__(self, source: Any, *, version: Any = None, storage_options: dict[str, Any] | None = None,
                 filesystem: Any = None) -> ParquetStore:
        """The store of ``version`` (None: the latest) of the table ``source`` names.

        Args:
            source: the table's :class:`~petastorm.fs.ResolvedLocation` (its directory, or a file the format reads
                as the table), or a table object of the format's library.
            version: the version, snapshot, tag or timestamp to read (``table_version``); None: the latest.
            storage_options: the reader's storage options (the format's library gets them translated).
            filesystem: the filesystem the user gave for the data files, if any.
        """


def _never(_: Any) -> bool:
    return False


@dataclass(frozen=True)
class TableFormatEntry:
    """One table format: how its tables are recognised, and what opens them.

    Attributes:
        name: the ``table_format`` that asks for it.
        title: its name in messages (``'Delta'``).
        opens: the function that opens a version of a table at a location (``'module:function'``, an
            :class:`OpenTable`).
        marks_directory: whether a directory, as its one listing shows it, holds a table of the format.
        names_table_file: whether a URL's path names a file that is read as a table of the format.
        is_table_object: whether a value is a table object of the format's library (checked without importing it).
        library: the library whose table objects ``opens_objects`` opens, for messages.
        opens_objects: the function that opens a version of such an object (``'module:function'``).
    """

    name: str
    title: str
    opens: str
    marks_directory: Callable[[pafs.FileSystem, StoreListing], bool]
    names_table_file: Callable[[str], bool] = _never
    is_table_object: Callable[[Any], bool] = _never
    library: str = ''
    opens_objects: str = ''

    def opener(self, of_object: bool = False) -> OpenTable:
        """The function that opens a table of the format (of one of its library's objects with ``of_object``)."""
        module, _, function = (self.opens_objects if of_object else self.opens).partition(':')
        return cast(OpenTable, getattr(importlib.import_module(module), function))


def _has_delta_log(filesystem: pafs.FileSystem, listing: StoreListing) -> bool:
    log = listing.child(DELTA_LOG)
    return log is not None and log.type == pafs.FileType.Directory


def _has_iceberg_metadata(filesystem: pafs.FileSystem, listing: StoreListing) -> bool:
    metadata = listing.child('metadata')
    return metadata is not None and metadata.type == pafs.FileType.Directory and any(
        info.path.endswith('.metadata.json')
        for info in filesystem.get_file_info(pafs.FileSelector(metadata.path, recursive=False)))


def is_iceberg_table(value: Any) -> bool:
    """True when ``value`` is a ``pyiceberg`` table object (checked without importing pyiceberg)."""
    return any(cls.__module__.startswith('pyiceberg.') and cls.__name__ == 'Table' for cls in type(value).__mro__)


#: The table formats, in the order a directory is tested for them.
TABLE_FORMAT_REGISTRY: tuple[TableFormatEntry, ...] = (
    TableFormatEntry('delta', 'Delta', 'petastorm.tables.delta:open_delta_table', _has_delta_log),
    TableFormatEntry('iceberg', 'Iceberg', 'petastorm.tables.iceberg:open_iceberg_location', _has_iceberg_metadata,
                     names_table_file=lambda path: path.endswith('.metadata.json'), is_table_object=is_iceberg_table,
                     library='pyiceberg', opens_objects='petastorm.tables.iceberg:open_iceberg_table'),
)


def format_named(name: str | None) -> TableFormatEntry | None:
    """The registry's entry of the table format ``name`` (None for any other name, ``'parquet'`` included)."""
    return next((entry for entry in TABLE_FORMAT_REGISTRY if entry.name == name), None)


def table_format_of(filesystem: pafs.FileSystem, root: str, listing: StoreListing | None = None) -> str | None:
    """The table format of the directory ``root``: None for a plain store (or a file).

    ``listing`` is :func:`~petastorm.store.listing.look_at` of ``root`` when the caller has it.
    """
    listing = listing or look_at(filesystem, root)
    return next((entry.name for entry in TABLE_FORMAT_REGISTRY if entry.marks_directory(filesystem, listing)), None)
