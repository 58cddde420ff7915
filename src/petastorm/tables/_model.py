"""What a table snapshot is made of once its log was read: the store, its data files and their row groups.

A :class:`TableStore` is a :class:`~petastorm.store.model.ParquetStore` whose files are those of one table
version (never a listing of the directory), whose partition columns come from the log, and whose row-group
pieces are already planned (:attr:`TableStore.pieces`). Each piece of a table carries a :class:`TableRowGroup`:
how the table's logical columns are made from the stored ones of its file (:class:`TableFile`) and which of its
stored rows the version deleted. Everything here is plain frozen data that workers receive with the pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from petastorm.store.model import ParquetStore, RowGroupPiece

#: The table formats a reader recognises; ``'parquet'`` reads a directory's files as plain Parquet.
TableFormat = Literal['auto', 'delta', 'iceberg', 'parquet']
TABLE_FORMATS: tuple[str, ...] = ('auto', 'delta', 'iceberg', 'parquet')


@dataclass(frozen=True)
class TableVersion:
    """Which version of which table a reader reads.

    Attributes:
        format: ``'delta'`` or ``'iceberg'``.
        version: the Delta version, or the Iceberg snapshot id (None: an Iceberg table without snapshots).
        timestamp_ms: when that version was committed (milliseconds since the epoch), when the log says.
    """

    format: str
    version: int | None
    timestamp_ms: int | None = None

    def to_state(self) -> dict[str, Any]:
        """What a reader's ``state_dict`` records of the version (plain values)."""
        return {'format': self.format, 'version': self.version}

    def describe(self) -> str:
        """``'Delta version 3'`` or ``'Iceberg snapshot 123'``."""
        if self.format == 'delta':
            return f'Delta version {self.version}'
        return f'Iceberg snapshot {self.version}'


@dataclass(frozen=True)
class TableFile:
    """How the logical columns of a table are read from one of its data files.

    Attributes:
        path: the data file on the store's filesystem.
        stored: ``(logical name, stored name)`` of the table's columns that the file stores.
        casts: ``(logical name, table type)`` of stored columns whose type is not the table's (widened types).
        missing: ``(logical name, table type)`` of the table's columns the file does not store (added later):
            they read as nulls.
        constants: ``(logical name, table type, value)`` of the partition columns: one value for the whole file.
        stored_rows: rows stored in the file.
        deleted_rows: rows of the file the version deleted.
    """

    path: str
    stored: tuple[tuple[str, str], ...]
    casts: tuple[tuple[str, pa.DataType], ...] = ()
    missing: tuple[tuple[str, pa.DataType], ...] = ()
    constants: tuple[tuple[str, pa.DataType, Any], ...] = ()
    stored_rows: int = 0
    deleted_rows: int = 0

    def constant(self, name: str) -> tuple[pa.DataType, Any] | None:
        """``(type, value)`` of partition column ``name``, or None when it is not one."""
        for column, arrow_type, value in self.constants:
            if column == name:
                return arrow_type, value
        return None


@dataclass(frozen=True)
class TableRowGroup:
    """A row group of a table's data file and the rows of it that the version deleted.

    Attributes:
        file: the data file.
        stored_rows: rows stored in the row group (the piece's ``num_rows`` counts the live ones).
        deleted: ``numpy.packbits`` of the deleted-row mask over the stored rows; empty when none is deleted.
    """

    file: TableFile
    stored_rows: int
    deleted: bytes = b''

    def keep_mask(self) -> np.ndarray | None:
        """The rows to keep (True) of the stored rows, or None when every row is kept."""
        if not self.deleted:
            return None
        bits = np.unpackbits(np.frombuffer(self.deleted, dtype=np.uint8), count=self.stored_rows)
        return bits == 0


@dataclass(frozen=True)
class TableStore(ParquetStore):
    """One version of a table, with its data files and planned row groups.

    Attributes:
        version: which version this is.
        arrow_schema: the table's logical schema (partition columns included, in the table's order).
        table_partitions: the partition columns whose values the log gives per file.
        pieces: every live row group, in piece order (sorted path, then row group).
        table_files: the data files, by path.
        file_guarantees: by data file, what the log's statistics say every row of it satisfies (a
            ``pyarrow.compute.Expression``), for pruning by ``filters``.
        footers: the Parquet footers of the data files, by path (row-group statistics, for pruning).
        deleted_rows: rows the version deletes from its data files (deletion vectors, delete files).
        delete_files: delete files of the version (Iceberg), for inspection.
        features: table features in use, for inspection.
    """

    version: TableVersion = field(default_factory=lambda: TableVersion('delta', None))
    arrow_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    table_partitions: tuple[str, ...] = ()
    pieces: tuple[RowGroupPiece, ...] = ()
    table_files: dict[str, TableFile] = field(default_factory=dict)
    file_guarantees: dict[str, Any] = field(default_factory=dict)
    footers: dict[str, Any] = field(default_factory=dict)
    deleted_rows: int = 0
    delete_files: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

    @property
    def partition_names(self) -> list[str]:
        """The partition columns the log gives values of (never taken from directory names)."""
        return list(self.table_partitions)

    def table_schema(self) -> pa.Schema:
        """The table's logical schema."""
        return self.arrow_schema

    def planned_pieces(self) -> tuple[RowGroupPiece, ...]:
        """The live row groups of the version."""
        return self.pieces
