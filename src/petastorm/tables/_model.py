"""What a table version is made of once its log was read: which version it is, and how its files are read.

:class:`TableVersion` says which version of which table a reader reads; :class:`TableFile` how the table's logical
columns are read from one of its data files (stored names, widened types, columns added since, partition values).
Each row group of a version carries a :class:`~petastorm.tables.read.TableRowGroup` (its file, and which of its
stored rows the version deleted), and the version itself is a :class:`~petastorm.tables.TableStore`. Everything
here is plain frozen data that workers receive with the pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ['TableFile', 'TableVersion']


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

    def __repr__(self) -> str:
        when = '' if self.timestamp_ms is None else f', timestamp_ms={self.timestamp_ms}'
        return f'TableVersion(format={self.format!r}, version={self.version!r}{when})'


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
