"""A row group of a table version, as the workers read it: the stored columns, the version's rows made of them.

:class:`TableRowGroup` is how a piece of a table answers the store's :class:`~petastorm.store.pieces.LogicalRows`.
A worker reads a table's row group as it reads any row group (through the row-group cache when there is one,
which therefore holds the stored columns of the file, before deletes: one entry serves every version the file is
part of), asking the piece which stored columns hold the logical ones. :meth:`TableRowGroup.logical_table` then
turns what was read into the version's rows of the logical columns: stored names become the table's names,
widened types are cast, columns added to the table after the file was written are nulls, and the deleted rows are
dropped with one mask over the whole table (never row by row). Partition values are the log's, typed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.store.pieces import RowGroupPiece
from petastorm.tables._model import TableFile
from petastorm.typemaps.scalars import scalar_column_to_numpy
from petastorm.unischema import Unischema, UnischemaField

__all__ = ['TableRowGroup']


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

    def stored_paths(self, piece: RowGroupPiece, paths: Sequence[str]) -> list[str]:
        """The file's stored Parquet paths of logical column paths (a struct's leaves keep their names).

        A column the file does not store (added to the table later) has none.
        """
        stored = dict(self.file.stored)
        out: list[str] = []
        for path in paths:
            top, dot, rest = path.partition('.')
            if top in stored:
                out.append(stored[top] + dot + rest)
        return out

    def logical_table(self, piece: RowGroupPiece, table: pa.Table, names: Sequence[str]) -> pa.Table:
        """The version's rows of logical columns ``names`` from ``table``, the stored columns read for them.

        Args:
            piece: the row group's piece.
            table: its stored columns (:meth:`stored_paths` of ``names``), every stored row.
            names: the logical columns wanted (partition columns excluded: the reader appends them).
        """
        file = self.file
        stored = dict(file.stored)
        casts = dict(file.casts)
        missing = dict(file.missing)
        keep = self.keep_mask()
        if keep is not None:
            table = table.filter(pa.array(keep))
        num_rows = table.num_rows
        arrays = []
        for name in names:
            if name in stored:
                column = table.column(stored[name])
                target = casts.get(name)
                arrays.append(column if target is None else column.cast(target))
            elif name in missing:
                arrays.append(pa.nulls(num_rows, missing[name]))
            else:
                raise KeyError(f'column {name!r} is not a column of the table file {file.path}')
        if not arrays:
            # No column wanted (only partition columns): keep the row count.
            return table.select([])
        return pa.Table.from_arrays(arrays, names=list(names))

    def partition_column(self, piece: RowGroupPiece, field: UnischemaField, num_rows: int) -> pa.Array:
        """The column of partition column ``field`` for ``num_rows`` rows of the row group (its file's value)."""
        found = self.file.constant(field.name)
        if found is None:
            raise KeyError(f'column {field.name!r} is not a partition column of the table file {self.file.path}')
        arrow_type, value = found
        if value is None:
            return pa.nulls(num_rows, arrow_type)
        return pa.repeat(pa.scalar(value, type=arrow_type), num_rows)

    def partition_values(self, piece: RowGroupPiece, schema: Unischema) -> dict[str, Any]:
        """The partition values of the row group's file, as the reader delivers them (a predicate sees these)."""
        values = {}
        for name, arrow_type, value in self.file.constants:
            field = schema.fields.get(name) or UnischemaField(name, object, (), None, True)
            column = pa.array([value], type=arrow_type)
            values[name] = scalar_column_to_numpy(field, column)[0]
        return values
