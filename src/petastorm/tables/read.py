"""The worker's side of a table: the stored columns to read, and the logical rows of the version made from them.

A worker reads a table's row group as it reads any row group (through the row-group cache when there is one,
which therefore holds the stored columns of the file, before deletes: one entry serves every version the file is
part of). :func:`logical_table` then turns what was read into the version's rows of the logical columns: stored
names become the table's names, widened types are cast, columns added to the table after the file was written
are nulls, and the deleted rows are dropped with one mask over the whole table (never row by row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from petastorm.tables._model import TableRowGroup
from petastorm.typemaps.scalars import scalar_column_to_numpy
from petastorm.unischema import Unischema, UnischemaField

__all__ = ['constant_column', 'logical_table', 'stored_columns', 'table_partition_values']


def stored_columns(row_group: TableRowGroup, names: Sequence[str]) -> list[str]:
    """The stored names of the logical columns ``names`` that the file stores, in ``names`` order."""
    stored = dict(row_group.file.stored)
    return [stored[name] for name in names if name in stored]


def logical_table(row_group: TableRowGroup, table: pa.Table, names: Sequence[str]) -> pa.Table:
    """The version's rows of logical columns ``names`` from ``table``, the stored columns read for them.

    Args:
        row_group: the row group read.
        table: its stored columns (:func:`stored_columns` of ``names``), every stored row.
        names: the logical columns wanted (partition columns excluded: the reader appends them).
    """
    file = row_group.file
    stored = dict(file.stored)
    casts = dict(file.casts)
    missing = dict(file.missing)
    keep = row_group.keep_mask()
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


def constant_column(row_group: TableRowGroup, name: str, num_rows: int) -> pa.Array:
    """The column of partition column ``name`` for ``num_rows`` rows of the row group (its file's value)."""
    found = row_group.file.constant(name)
    if found is None:
        raise KeyError(f'column {name!r} is not a partition column of the table file {row_group.file.path}')
    arrow_type, value = found
    if value is None:
        return pa.nulls(num_rows, arrow_type)
    return pa.repeat(pa.scalar(value, type=arrow_type), num_rows)


def table_partition_values(row_group: TableRowGroup, schema: Unischema) -> dict[str, Any]:
    """The partition values of the row group's file, as the reader delivers them (a predicate sees these)."""
    values = {}
    for name, arrow_type, value in row_group.file.constants:
        field = schema.fields.get(name) or UnischemaField(name, object, (), None, True)
        column = pa.array([value], type=arrow_type)
        values[name] = scalar_column_to_numpy(field, column)[0]
    return values
