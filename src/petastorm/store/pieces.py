"""A store's row groups: the unit of work of every reader, and how the rows it delivers are made from a file's.

This module owns :class:`RowGroupPiece` (one row group of one file, as planning and the workers see it) and the
one question that differs between the kinds of store once a row group is read, :class:`LogicalRows`: which
stored columns hold the columns asked for, which rows of the row group are delivered, and the values of the
partition columns, which no file stores. A piece of plain Parquet answers with :data:`PLAIN_ROWS` (the stored
columns as they are, its hive directories' values); a piece of a table version with its
:class:`petastorm.tables.TableRowGroup` (the table's names, types and deletes). The workers and the planner ask
the piece (:meth:`RowGroupPiece.stored_paths`, :meth:`RowGroupPiece.logical_table`,
:meth:`RowGroupPiece.partition_column`, :meth:`RowGroupPiece.partition_values`), never its kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from petastorm.unischema import Unischema, UnischemaField

__all__ = ['PLAIN_ROWS', 'LogicalRows', 'PlainRows', 'RowGroupPiece', 'partition_keys_of', 'typed_partition_value']


class LogicalRows(Protocol):
    """How the rows a reader delivers of a row group are made from what its file stores.

    Each method gets the piece it is asked about, whose ``partition_keys`` and ``path`` it may need.
    """

    def stored_paths(self, piece: RowGroupPiece, paths: Sequence[str]) -> list[str]:
        """The file's Parquet paths that hold the column paths ``paths`` (a struct's leaves as ``'s.a'``).

        A column the file does not store has no path; ``paths`` name no partition column.
        """

    def logical_table(self, piece: RowGroupPiece, table: pa.Table, names: Sequence[str]) -> pa.Table:
        """The delivered rows of columns ``names`` from ``table``, the row group's stored columns read for them.

        ``table`` holds every stored row of the row group; the result, every row the store delivers, in order.
        """

    def partition_column(self, piece: RowGroupPiece, field: UnischemaField, num_rows: int) -> pa.Array:
        """The column of partition field ``field`` for ``num_rows`` rows of the piece (one value per file)."""

    def partition_values(self, piece: RowGroupPiece, schema: Unischema) -> dict[str, Any]:
        """The piece's partition values as the reader delivers them (typed as ``schema``'s fields).

        What a predicate on partition fields sees, when planning decides it per piece.
        """


@dataclass(frozen=True)
class PlainRows:
    """The rows of plain Parquet: the stored columns as they are, partition values from hive directories.

    A hive directory's value (``part=3``) is typed as the schema's field: an integer field holds ``int``, anything
    else the directory name's text; a partition column the schema does not name is text.
    """

    def stored_paths(self, piece: RowGroupPiece, paths: Sequence[str]) -> list[str]:
        """``paths`` themselves: the file stores the columns under their names."""
        return list(paths)

    def logical_table(self, piece: RowGroupPiece, table: pa.Table, names: Sequence[str]) -> pa.Table:
        """``table`` itself: every stored row is delivered."""
        return table

    def partition_column(self, piece: RowGroupPiece, field: UnischemaField, num_rows: int) -> pa.Array:
        """The value of the piece's directory named for ``field`` (nulls when it has none), typed as the field."""
        value = dict(piece.partition_keys).get(field.name)
        if value is None:
            return pa.nulls(num_rows)
        typed = typed_partition_value(value, field.numpy_dtype)
        if isinstance(typed, int):
            return pa.array(np.full(num_rows, typed, dtype=np.int64))
        return pa.array([typed] * num_rows, type=pa.string())

    def partition_values(self, piece: RowGroupPiece, schema: Unischema) -> dict[str, Any]:
        """The values of the piece's hive directories, typed as the schema's fields (strings otherwise)."""
        values: dict[str, Any] = {}
        for name, raw in piece.partition_keys:
            field = schema.fields.get(name)
            dtype = field.numpy_dtype if field is not None else np.str_
            values[name] = dtype(typed_partition_value(raw, dtype))
        return values


#: How every piece of plain Parquet answers (stateless: pieces share it).
PLAIN_ROWS = PlainRows()


@dataclass(frozen=True, slots=True)  # a million of them plan 100,000 files
class RowGroupPiece:
    """One row group of one file: the unit of work of every reader.

    Attributes:
        path: the data file on the store's filesystem.
        row_group: the row group's number in the file.
        num_rows: the rows the store delivers of it (of a table version: the rows it did not delete).
        partition_keys: ``(column, value as text)`` of its partition columns.
        logical: how its delivered rows are made from the stored ones: :data:`PLAIN_ROWS` for plain Parquet, a
            :class:`petastorm.tables.TableRowGroup` for a row group of a table version.
    """

    path: str
    row_group: int
    num_rows: int
    partition_keys: tuple[tuple[str, str], ...] = ()
    logical: LogicalRows = PLAIN_ROWS

    def stored_paths(self, paths: Sequence[str]) -> list[str]:
        """The file's Parquet paths of the (non-partition) column paths ``paths`` (see :class:`LogicalRows`)."""
        return self.logical.stored_paths(self, paths)

    def logical_table(self, table: pa.Table, names: Sequence[str]) -> pa.Table:
        """The delivered rows of columns ``names`` from the stored columns ``table`` (see :class:`LogicalRows`)."""
        return self.logical.logical_table(self, table, names)

    def partition_column(self, field: UnischemaField, num_rows: int) -> pa.Array:
        """The column of partition field ``field`` for ``num_rows`` rows of the piece."""
        return self.logical.partition_column(self, field, num_rows)

    def partition_values(self, schema: Unischema) -> dict[str, Any]:
        """The piece's partition values, typed as ``schema``'s fields, as a predicate on them sees them."""
        return self.logical.partition_values(self, schema)


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
