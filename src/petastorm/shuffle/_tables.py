"""Tables: dicts ``{column name: array}`` whose arrays all have the same first dimension (the rows).

The unit every buffer of this package takes in and hands out; the arrays are numpy arrays (or the masked, list
and struct columns of :mod:`petastorm.columns`), or tensors of an array framework when the caller's
:class:`~petastorm.shuffle.ArrayOps` works on those.
"""

from __future__ import annotations

from typing import Any

from petastorm.columns import StructColumn, is_nested, slice_column

Table = dict[str, Any]


def num_rows(table: Table) -> int:
    """Rows of a table (0 for a table without columns)."""
    for array in table.values():
        return array.num_rows if isinstance(array, StructColumn) else len(array)
    return 0


def slice_rows(table: Table, start: int, stop: int) -> Table:
    """Rows ``[start, stop)`` of every column (views where the array type allows)."""
    return {name: slice_column(array, start, stop) if is_nested(array) else array[start:stop]
            for name, array in table.items()}
