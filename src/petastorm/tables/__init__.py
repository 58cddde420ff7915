"""Tables: Delta Lake and Apache Iceberg versions read as the reader's store, exactly the rows of one version.

A table is Parquet files plus a log saying which files (and which rows of them) make up each version. The
reader reads the log at the version asked for (the latest, a pinned version, snapshot, tag or timestamp) and
turns it into the same planned row groups it reads from plain Parquet (:class:`TableStore`), with what the files
alone cannot say: which files are in the version, which of their rows were deleted (Delta deletion vectors,
Iceberg position and equality deletes, applied as masks of the row groups), the partition values, the logical
column names (Delta column mapping, Iceberg field ids) and the columns added since a file was written (nulls).

* :func:`open_dataset`: a reader's URL (or a ``pyiceberg`` table) to its store: a table version, or plain Parquet.
* :mod:`~petastorm.tables.delta`: Delta tables, through ``deltalake`` (the ``delta`` extra).
* :mod:`~petastorm.tables.iceberg`: Iceberg tables, through ``pyiceberg`` (the ``iceberg`` extra).
* :mod:`~petastorm.tables.read`: what a worker does with a table's row group.
* :func:`matching_row_groups`, :func:`filter_statistics`: ``filters`` against partition values and statistics,
  for any store.

A directory holding a ``_delta_log`` is a Delta table and one holding ``metadata/*.metadata.json`` an Iceberg
table; neither is ever read as plain files unless ``table_format='parquet'`` says so.
"""

from __future__ import annotations

from typing import Any

from petastorm._describe import display_url
from petastorm.errors import PetastormMetadataError
from petastorm.fs import resolve_location
from petastorm.fs._files import with_retries
from petastorm.store.filters import FilterStatistics
from petastorm.store.filters import filter_statistics as _plain_filter_statistics
from petastorm.store.filters import matching_row_groups as _plain_matching_row_groups
from petastorm.store.listing import look_at, table_format_of
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_store
from petastorm.tables._model import (
    TABLE_FORMATS,
    TableFile,
    TableFormat,
    TableRowGroup,
    TableStore,
    TableVersion,
)
from petastorm.tables._pruning import matching_table_row_groups

__all__ = ['TABLE_FORMATS', 'TableFile', 'TableFormat', 'TableRowGroup', 'TableStore', 'TableVersion',
           'filter_statistics', 'is_iceberg_table', 'matching_row_groups', 'open_dataset']


def is_iceberg_table(value: Any) -> bool:
    """True when ``value`` is a ``pyiceberg`` table object (checked without importing pyiceberg)."""
    return any(cls.__module__.startswith('pyiceberg.') and cls.__name__ == 'Table' for cls in type(value).__mro__)


def open_dataset(url_or_table: Any, *, storage_options: dict[str, Any] | None = None, filesystem: Any = None,
                 table_format: str = 'auto', table_version: Any = None) -> ParquetStore:
    """The store a reader reads: a table version, or a plain Parquet store.

    Args:
        url_or_table: a dataset URL, a list of Parquet file URLs, a table directory URL, an Iceberg metadata file
            URL (``.../metadata/00003-....metadata.json``) or a ``pyiceberg`` table (from any catalog).
        storage_options: fsspec options for the URL (the table libraries get them translated).
        filesystem: a ready filesystem for the data files, instead of resolving the URL.
        table_format: ``'auto'`` (recognise tables), ``'delta'``, ``'iceberg'`` or ``'parquet'`` (read the
            directory's files as plain Parquet, a table's too).
        table_version: None (latest), or the version to read (see :func:`petastorm.reader.make_reader`).

    Raises:
        ValueError: ``table_version`` given for plain Parquet, or ``table_format`` does not match what is there.
        TableVersionError, UnsupportedTableFeatureError, PetastormMetadataError: see the format modules.
    """
    if is_iceberg_table(url_or_table):
        if table_format not in ('auto', 'iceberg'):
            raise ValueError(f'table_format={table_format!r} cannot read a pyiceberg table; pass '
                             f"table_format='auto' or 'iceberg'")
        from petastorm.tables.iceberg import open_iceberg_table

        return open_iceberg_table(url_or_table, table_version, storage_options=storage_options,
                                  filesystem=filesystem)
    location = resolve_location(url_or_table, storage_options, filesystem)
    if table_format == 'parquet' or location.is_file_list:
        if table_version is not None:
            raise ValueError(f'table_version={table_version!r} needs a table (Delta or Iceberg); '
                             f'{display_url(str(url_or_table))} is read as plain Parquet')
        return open_store(location, plain=True)
    root = str(location.path)
    listing = None
    if str(root).endswith('.metadata.json') and table_format in ('auto', 'iceberg'):
        found: str | None = 'iceberg'
    else:
        # One listing answers whether the directory is a table and, for a plain store, what it holds.
        listing = with_retries(location.filesystem, lambda: look_at(location.filesystem, root), 'listing', root)
        found = table_format_of(location.filesystem, root, listing)
    if table_format not in ('auto', found):
        raise PetastormMetadataError(f'table_format={table_format!r}, but {display_url(str(location.url))} is '
                                     f'{"not a table" if found is None else "a " + found + " table"}')
    if found == 'delta':
        from petastorm.tables.delta import open_delta_table

        return open_delta_table(location, storage_options, table_version)
    if found == 'iceberg':
        from petastorm.tables.iceberg import open_iceberg_location

        return open_iceberg_location(location, table_version, storage_options=storage_options,
                                     filesystem=filesystem)
    if table_version is not None:
        raise ValueError(f'table_version={table_version!r} needs a table, but {display_url(str(location.url))} '
                         f'is not a Delta or Iceberg table')
    return open_store(location, plain=True, listing=listing)


def matching_row_groups(store: ParquetStore, expression: Any) -> set[tuple[str, int]]:
    """``(path, row group)`` of the row groups whose partition values and statistics may match ``expression``.

    Raises:
        ValueError: the expression names a column the store does not have, or cannot be applied to its types.
    """
    if isinstance(store, TableStore):
        return matching_table_row_groups(store, expression)
    return _plain_matching_row_groups(store, expression)


def filter_statistics(store: ParquetStore, expression: Any) -> FilterStatistics:
    """Which row groups may match ``expression`` and which match in every row, for any store.

    A table's row groups are pruned by its log (partition values and file statistics); which of them match in
    every row is left undecided there (an empty set), since the rows a version deleted are not in the footers'
    statistics: ``len()`` of a filtered table reader then needs ``count_rows=True``.

    Raises:
        ValueError: the expression names a column the store does not have, or cannot be applied to its types.
    """
    if isinstance(store, TableStore):
        return FilterStatistics(frozenset(matching_table_row_groups(store, expression)), frozenset())
    return _plain_filter_statistics(store, expression)
