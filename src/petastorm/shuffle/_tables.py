"""Tables: dicts ``{column name: array}`` whose arrays all have the same first dimension (the rows).

The unit every buffer of this package takes in and hands out; the arrays are numpy arrays, or tensors of an
array framework when the caller's :class:`~petastorm.shuffle.ArrayOps` works on those.
"""

from __future__ import annotations

from typing import Any

Table = dict[str, Any]


def num_rows(table: Table) -> int:
    """Rows of a table (0 for a table without columns)."""
    for array in table.values():
        return len(array)
    return 0


def slice_rows(table: Table, start: int, stop: int) -> Table:
    """Rows ``[start, stop)`` of every column (views where the array type allows)."""
    return {name: array[start:stop] for name, array in table.items()}
