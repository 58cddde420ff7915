"""Arrow arrays to columns and back, straight from the Arrow buffers.

:func:`from_arrow` turns any Arrow array a Parquet file can hold into a column of :mod:`petastorm.columns`:
numbers view the Arrow data buffer, list offsets are the Arrow offsets (as int64), validity bitmaps become bool
arrays, and nested types nest. :func:`to_arrow` is the inverse for the Ray datasource and the writers.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from petastorm._compat import map_array
from petastorm.columns._kinds import Column, ListColumn, MapColumn, MaskedColumn, StructColumn

# Arrow temporal types -> the numpy unit their integers count (dates count days or milliseconds).
_TIME_KINDS = ('timestamp', 'duration', 'time32', 'time64')


def single_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One array holding a chunked array's rows (the array itself when it is one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        if column.num_chunks == 0:
            return pa.array([], type=column.type)
        return column.combine_chunks()
    return column


def _validity(array: pa.Array) -> np.ndarray | None:
    if not array.null_count:
        return None
    if pa.types.is_null(array.type) or array.buffers()[0] is None:
        return np.zeros(len(array), dtype=bool) if pa.types.is_null(array.type) else \
            array.is_valid().to_numpy(zero_copy_only=False)
    return _bits(array.buffers()[0], array.offset, len(array))


def _bits(buffer: pa.Buffer, offset: int, count: int) -> np.ndarray:
    """``count`` bits of an Arrow bitmap from bit ``offset`` (least significant bit first) as a bool array.

    Unpacked with numpy: pyarrow's own ``to_numpy`` of a bool array goes through pandas, which it imports on first
    use (a quarter of a CPU second in every fresh worker).
    """
    first = offset // 8
    size = (offset + count + 7) // 8 - first
    packed = np.frombuffer(buffer, dtype=np.uint8, count=size, offset=first)
    return np.unpackbits(packed, bitorder='little')[offset % 8:offset % 8 + count].view(bool)


def _buffer_view(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The fixed-width values of a null-free array as a read-only view of its data buffer."""
    data = array.buffers()[1]
    if data is None:
        return np.zeros(len(array), dtype=dtype)
    view = np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    view.flags.writeable = False  # the memory belongs to Arrow
    return view


def list_offsets(array: pa.Array) -> np.ndarray:
    """The ``rows + 1`` offsets of a (possibly sliced) list, large list or map array, as int64."""
    width = np.int64 if pa.types.is_large_list(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=width, count=len(array) + 1,
                            offset=array.offset * np.dtype(width).itemsize)
    return offsets.astype(np.int64)


def _fill(array: pa.Array, value: Any) -> pa.Array:
    return pc.fill_null(array, pa.scalar(value, type=array.type))


def _fill_value(arrow_type: pa.DataType) -> Any:
    if pa.types.is_boolean(arrow_type):
        return False
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or _is_view(arrow_type, 'string'):
        return ''
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or _is_view(arrow_type, 'binary'):
        return b''
    if pa.types.is_fixed_size_binary(arrow_type):
        return b'\0' * arrow_type.byte_width
    if pa.types.is_decimal(arrow_type):
        return decimal.Decimal(0)
    if pa.types.is_date(arrow_type):
        return datetime.date(1970, 1, 1)
    return 0


def _is_view(arrow_type: pa.DataType, kind: str) -> bool:
    check = getattr(pa.types, f'is_{kind}_view', None)
    return bool(check is not None and check(arrow_type))


def primitive_to_numpy(array: pa.Array) -> np.ndarray:
    """The values of a null-free array of a non-nested type as numpy.

    Numbers, timestamps, durations and 64-bit dates view the Arrow buffer; 32-bit dates and times are widened to
    ``datetime64[D]`` / ``timedelta64``; strings become ``np.str_``, binaries ``np.bytes_``, decimals an object
    array of ``Decimal``.

    Raises:
        TypeError: the type has no numpy form (intervals, unions).
    """
    arrow_type = array.type
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return _buffer_view(array, np.dtype(arrow_type.to_pandas_dtype()))
    if pa.types.is_boolean(arrow_type):
        data = array.buffers()[1]
        return _bits(data, array.offset, len(array)) if data is not None else np.zeros(len(array), dtype=bool)
    if pa.types.is_temporal(arrow_type) and not pa.types.is_interval(arrow_type):
        return _temporal_to_numpy(array)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or _is_view(arrow_type, 'string'):
        values = array.to_numpy(zero_copy_only=False)
        return values.astype(np.str_) if len(values) else np.empty(0, dtype=np.str_)
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or \
            pa.types.is_fixed_size_binary(arrow_type) or _is_view(arrow_type, 'binary'):
        values = array.to_numpy(zero_copy_only=False)
        return values.astype(np.bytes_) if len(values) else np.empty(0, dtype=np.bytes_)
    if pa.types.is_decimal(arrow_type):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_null(arrow_type):
        return np.zeros(len(array), dtype=np.float64)
    raise TypeError(f'Arrow type {arrow_type} has no numpy form')


def _temporal_to_numpy(array: pa.Array) -> np.ndarray:
    """Timestamps, durations, times and dates: views of the Arrow integers as ``datetime64``/``timedelta64``."""
    arrow_type = array.type
    if pa.types.is_date32(arrow_type):
        return _buffer_view(array, np.dtype(np.int32)).astype('datetime64[D]')
    if pa.types.is_date64(arrow_type):
        return _buffer_view(array, np.dtype(np.int64)).view('datetime64[ms]')
    kind = next(kind for kind in _TIME_KINDS if getattr(pa.types, f'is_{kind}')(arrow_type))
    width = np.dtype(np.int32) if kind == 'time32' else np.dtype(np.int64)
    numbers = _buffer_view(array, width)
    target = np.dtype(f'{"datetime64" if kind == "timestamp" else "timedelta64"}[{arrow_type.unit}]')
    return numbers.view(target) if width.itemsize == 8 else numbers.astype(np.int64).view(target)


def from_arrow(column: pa.Array | pa.ChunkedArray) -> Column:
    """A column of the rows of an Arrow array of any type a Parquet file holds.

    Null-free arrays of numbers become numpy views of the Arrow data; arrays with nulls a :class:`MaskedColumn`
    (fill values at the nulls); lists and maps a :class:`ListColumn` / :class:`MapColumn` over the child's column
    (fixed-size lists of null-free values a ``(rows, size, ...)`` array); structs a :class:`StructColumn`;
    dictionary-encoded arrays their decoded values; extension arrays their storage.

    Raises:
        TypeError: the type has no column form (intervals, unions).
    """
    array = single_chunk(column)
    arrow_type = array.type
    if isinstance(arrow_type, pa.BaseExtensionType):
        return from_arrow(array.storage)
    if pa.types.is_dictionary(arrow_type):
        return from_arrow(array.dictionary_decode())
    if pa.types.is_struct(arrow_type):
        fields = {arrow_type.field(i).name: from_arrow(array.field(i)) for i in range(arrow_type.num_fields)}
        return StructColumn(fields, len(array), _validity(array))
    if pa.types.is_map(arrow_type):
        offsets = list_offsets(array)
        entries = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        struct = from_arrow(entries)
        assert isinstance(struct, StructColumn)
        keyed = StructColumn({'key': struct[entries.type.field(0).name], 'value': struct[entries.type.field(1).name]},
                             struct.num_rows)
        return MapColumn(keyed, offsets - offsets[0], _validity(array))
    if _is_view(arrow_type, 'list') or _is_view(arrow_type, 'large_list'):
        return from_arrow(array.cast(pa.large_list(arrow_type.value_field)))
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        offsets = list_offsets(array)
        values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        return ListColumn(from_arrow(values), offsets - offsets[0], _validity(array))
    if pa.types.is_fixed_size_list(arrow_type):
        return _fixed_size_list(array)
    valid = _validity(array)
    return primitive_to_numpy(array) if valid is None else _masked(array, valid)


def _masked(array: pa.Array, valid: np.ndarray) -> MaskedColumn:
    """A non-nested array with nulls: its values (a fill value at the nulls) and ``valid``."""
    arrow_type = array.type
    if pa.types.is_null(arrow_type):
        return MaskedColumn(np.zeros(len(array), dtype=np.float64), valid)
    if _fixed_width(arrow_type):
        # The data buffer holds something at the nulls: a copy with zeros there (numpy, no pandas import).
        values = np.array(primitive_to_numpy(array), copy=True)
        values[~valid] = np.zeros(1, dtype=values.dtype)[0]
        return MaskedColumn(values, valid)
    return MaskedColumn(primitive_to_numpy(_fill(array, _fill_value(arrow_type))), valid)


def _fixed_width(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)
            or pa.types.is_temporal(arrow_type)) and not pa.types.is_interval(arrow_type)


def _fixed_size_list(array: pa.Array) -> Column:
    size = array.type.list_size
    n = len(array)
    child = from_arrow(array.values.slice(array.offset * size, n * size))
    valid = _validity(array)
    if isinstance(child, np.ndarray) and child.dtype != object:
        dense = child.reshape((n, size, *child.shape[1:]))
        return dense if valid is None else MaskedColumn(dense, valid)
    if isinstance(child, MaskedColumn) and valid is not None and child.values.dtype != object:
        # The slots of null rows may hold nulls themselves: the rows are null, not their elements.
        element_valid = child.valid.reshape(n, size)
        if (element_valid | ~valid[:, None]).all():
            return MaskedColumn(child.values.reshape((n, size, *child.values.shape[1:])), valid)
    # Null elements (or lists, structs) inside: a list column whose rows all hold ``size`` elements.
    return ListColumn(child, np.arange(n + 1, dtype=np.int64) * size, valid)


def to_arrow(column: Column, arrow_type: pa.DataType | None = None) -> pa.Array:
    """An Arrow array of a column's rows (of ``arrow_type`` when given, else the type the column suggests).

    The inverse of :func:`from_arrow` for lists, maps, structs and masked values; numpy arrays go through
    ``pa.array`` (fixed-shape arrays become fixed-size lists).
    """
    if arrow_type is not None and isinstance(arrow_type, pa.BaseExtensionType):
        storage = to_arrow(column, arrow_type.storage_type)
        return pa.ExtensionArray.from_storage(arrow_type, storage)
    if isinstance(column, StructColumn):
        types = {arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)} \
            if arrow_type is not None and pa.types.is_struct(arrow_type) else {}
        names = list(column)
        children = [to_arrow(column[name], types.get(name)) for name in names]
        mask = None if column.valid is None else pa.array(~column.valid)
        if not names:
            return pa.array([{}] * column.num_rows, type=pa.struct([]))
        fields = [pa.field(name, child.type) for name, child in zip(names, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if isinstance(column, ListColumn):
        normalized = column.normalized()
        mask = None if column.valid is None else pa.array(~column.valid)
        if isinstance(column, MapColumn):
            key_type = item_type = None
            if arrow_type is not None and pa.types.is_map(arrow_type):
                key_type, item_type = arrow_type.key_type, arrow_type.item_type
            values = normalized.values
            assert isinstance(values, StructColumn)
            keys = to_arrow(values['key'], key_type)
            items = to_arrow(values['value'], item_type)
            return map_array(normalized.offsets.astype(np.int32), keys, items,
                             None if column.valid is None else ~column.valid)
        child_type = arrow_type.value_type if arrow_type is not None and (
            pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type)) else None
        values = to_arrow(normalized.values, child_type)
        large = arrow_type is not None and pa.types.is_large_list(arrow_type) or normalized.offsets[-1] >= 2**31
        offsets = pa.array(normalized.offsets if large else normalized.offsets.astype(np.int32))
        cls = pa.LargeListArray if large else pa.ListArray
        result = cls.from_arrays(offsets, values, mask=mask)
        if arrow_type is not None and pa.types.is_fixed_size_list(arrow_type):
            return result.cast(arrow_type)
        return result
    if isinstance(column, MaskedColumn):
        return _numpy_to_arrow(column.values, arrow_type, mask=~column.valid)
    return _numpy_to_arrow(column, arrow_type)


def _numpy_to_arrow(values: np.ndarray, arrow_type: pa.DataType | None, mask: np.ndarray | None = None) -> pa.Array:
    if values.ndim > 1:
        n = len(values)
        size = values.shape[1]
        flat = values.reshape((n * size, *values.shape[2:]))
        child_type = arrow_type.value_type if arrow_type is not None and (
            pa.types.is_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)
            or pa.types.is_large_list(arrow_type)) else None
        child = _numpy_to_arrow(flat, child_type)
        lists = pa.FixedSizeListArray.from_arrays(child, size, mask=None if mask is None else pa.array(mask))
        return lists if arrow_type is None else lists.cast(arrow_type)
    if values.dtype.kind == 'U' or (values.dtype.kind == 'S' and arrow_type is not None
                                    and pa.types.is_large_binary(arrow_type)):
        values = values.astype(object)  # pyarrow before 20 converts numpy bytes only to binary, not large_binary
    if arrow_type is not None and pa.types.is_date32(arrow_type) and values.dtype.kind == 'M':
        values = values.astype('datetime64[D]')
    if arrow_type is not None and pa.types.is_time(arrow_type) and values.dtype.kind == 'm':
        numbers = values.astype(f'timedelta64[{arrow_type.unit}]').astype(np.int64)
        width = pa.int64() if pa.types.is_time64(arrow_type) else pa.int32()
        return pa.array(numbers, mask=mask).cast(width).cast(arrow_type)
    array = pa.array(values, mask=mask, from_pandas=False) if arrow_type is None else pa.array(
        values, type=arrow_type, mask=mask) if values.dtype != object else pa.array(list(values), type=arrow_type,
                                                                                     mask=mask)
    return array


