"""Rows of an Arrow table in a given order: what shuffling the rows of a row group does to its columns.

pyarrow's ``take`` of a list column first builds an index of every value the rows hold, then gathers the values
one by one: for ragged rows of a few hundred numbers each (token ids, variable-length arrays) that costs about 30
times a copy of the values. Where the compiled kernel is built, a list column of fixed-width numbers without
nulls is gathered a row's range at a time instead (one ``memcpy`` each, the GIL released); every other column,
and every column without the kernel, is pyarrow's ``take``. Both give the same table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from petastorm.shuffle._compiled import kernel_in_use

__all__ = ['take_rows']


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """Rows ``rows`` of ``table``, in that order (indexes in ``[0, table.num_rows)``).

    Raises:
        IndexError, ValueError: an index is out of range (pyarrow's or the kernel's error).
    """
    kernel = kernel_in_use()
    whole_ranges = [kernel is not None and _gathers_whole_ranges(column) for column in table.columns]
    if not any(whole_ranges):
        return table.take(pa.array(rows))
    order = np.ascontiguousarray(rows, dtype=np.int64)
    if order.size and (int(order.min()) < 0 or int(order.max()) >= table.num_rows):
        raise IndexError(f'row index out of bounds: rows {int(order.min())}..{int(order.max())} of a table of '
                         f'{table.num_rows} rows')
    indices = pa.array(order)
    columns = [_gather_ranges(kernel, column.chunk(0), order) if ranged else column.take(indices)
               for column, ranged in zip(table.columns, whole_ranges, strict=True)]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _gathers_whole_ranges(column: pa.ChunkedArray) -> bool:
    """A list column of fixed-width numbers without nulls, in one chunk: its rows are ranges of one buffer."""
    kind = column.type
    if column.num_chunks != 1 or not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return False
    value_type = kind.value_type
    if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        return False
    chunk = column.chunk(0)
    return chunk.null_count == 0 and chunk.values.null_count == 0


def _gather_ranges(kernel: object, array: pa.Array, order: np.ndarray) -> pa.Array:
    """The rows ``order`` of a list array of fixed-width numbers (see :func:`_gathers_whole_ranges`)."""
    offsets = np.asarray(array.offsets, dtype=np.int64)  # respects a slice of the array
    lengths = offsets[order + 1] - offsets[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    values = array.values  # the whole child: offsets index into it
    value_type = array.type.value_type
    source = np.frombuffer(values.buffers()[1], dtype=value_type.to_pandas_dtype(),
                           count=values.offset + len(values))[values.offset:]
    out = np.empty(int(new_offsets[-1]), dtype=source.dtype)
    kernel.gather(out, source, source.itemsize, offsets, order)  # type: ignore[attr-defined]
    offset_type = np.int64 if pa.types.is_large_list(array.type) else np.int32
    array_type = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
    return array_type.from_arrays(pa.array(new_offsets.astype(offset_type, copy=False)), pa.array(out),
                                  type=array.type)
