"""How the decoded-column cache lays out a decoded numpy column in Arrow, and how it gets the numpy column back.

Two layouts, both plain Arrow that any Arrow tool reads, and both sliced and gathered by Arrow itself (so a work
item's rows are taken from a cached row group in C++, not row by row):

* **dense**: a ``(rows, *shape)`` array of integers or floats (native byte order) is an
  ``arrow.fixed_shape_tensor(value_type, shape)`` column, or a plain numeric column when ``shape`` is ``()``.
  Reading it back gives one numpy array that views the Arrow buffer: no copy, and no decoding.
* **ragged**: an object column of arrays that differ in shape (every row an integer or float array of one dtype
  and one number of dimensions, no ``None``) is a ``struct<data: large_list<value_type>, shape:
  fixed_size_list<int64>[ndim]>`` column: the row-major values of each row and its shape. Reading it back gives
  each row as a view of the values, assembled by :func:`petastorm.codecs.stack_or_objects` -- as the codecs
  assemble the rows they decode, so a selection of rows whose shapes happen to agree becomes one stacked array
  exactly as decoding those rows would make it.

Any other column (strings, booleans, Decimals, objects, ``None`` values, zero-size shapes, an empty column) has
no layout here: :func:`pack_column` returns None, and the cache keeps the column as it is stored in the file.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from petastorm.codecs import stack_or_objects

_NUMERIC_KINDS = 'iuf'
_DATA = 'data'
_SHAPE = 'shape'


def _arrow_value_type(dtype: np.dtype) -> pa.DataType | None:
    """The Arrow type whose buffers hold values of ``dtype`` byte for byte, or None."""
    if dtype.kind not in _NUMERIC_KINDS or not dtype.isnative:
        return None
    try:
        arrow_type = pa.from_numpy_dtype(dtype)
    except (NotImplementedError, pa.ArrowNotImplementedError, TypeError):
        return None
    return arrow_type if np.dtype(arrow_type.to_pandas_dtype()) == dtype else None


def _values_array(flat: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """A numeric Arrow array viewing the contiguous 1-d numpy array ``flat`` (no copy)."""
    return pa.Array.from_buffers(value_type, len(flat), [None, pa.py_buffer(flat)])


def pack_column(values: np.ndarray) -> pa.Array | None:
    """The decoded column ``values`` in one of the layouts (see the module doc), or None when none fits.

    A dense column is not copied when it is C-contiguous: the Arrow array views its memory.
    """
    if not len(values):
        return None
    if values.dtype != object:
        return _pack_dense(values)
    return _pack_ragged(values)


def _pack_dense(values: np.ndarray) -> pa.Array | None:
    value_type = _arrow_value_type(values.dtype)
    shape = values.shape[1:]
    if value_type is None or 0 in shape:
        return None
    flat = np.ascontiguousarray(values).reshape(-1)
    if not shape:
        return _values_array(flat, value_type)
    storage = pa.FixedSizeListArray.from_arrays(_values_array(flat, value_type), math.prod(shape))
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(value_type, shape), storage)


def _pack_ragged(values: np.ndarray) -> pa.Array | None:
    rows = list(values)
    first = rows[0]
    if type(first) is not np.ndarray or first.ndim == 0:
        return None
    value_type = _arrow_value_type(first.dtype)
    if value_type is None:
        return None
    if any(type(row) is not np.ndarray or row.dtype != first.dtype or row.ndim != first.ndim for row in rows):
        return None
    sizes = np.fromiter((row.size for row in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
    flat = np.concatenate([row.reshape(-1) for row in rows])
    data = pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), _values_array(flat, value_type))
    shapes = np.array([row.shape for row in rows], dtype=np.int64).reshape(-1)
    shape = pa.FixedSizeListArray.from_arrays(pa.array(shapes, type=pa.int64()), first.ndim)
    return pa.StructArray.from_arrays([data, shape], names=[_DATA, _SHAPE])


def is_packed(arrow_type: pa.DataType) -> bool:
    """True when a column of ``arrow_type`` is in one of the layouts (for columns of codecs storing bytes)."""
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        return True
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return True
    return (pa.types.is_struct(arrow_type) and arrow_type.num_fields == 2
            and [arrow_type.field(i).name for i in range(2)] == [_DATA, _SHAPE])


def unpack_column(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The numpy column of a packed column (any slice or selection of its rows; see :func:`is_packed`).

    Dense columns come back as a view of the Arrow buffer, so a column read from the cache's memory map is not
    copied; ragged columns as each row's view, stacked when their shapes agree.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if isinstance(column.type, pa.FixedShapeTensorType):
        storage = column.storage
        size = storage.type.list_size
        flat = _numbers(storage.values, storage.offset * size, len(storage) * size)
        return flat.reshape((len(storage), *column.type.shape))
    if pa.types.is_struct(column.type):
        return _unpack_ragged(column)
    return _numbers(column, 0, len(column))


def _numbers(values: pa.Array, start: int, count: int) -> np.ndarray:
    """``count`` numbers of the numeric array ``values`` from position ``start``, viewing its buffer."""
    dtype = np.dtype(values.type.to_pandas_dtype())
    return np.frombuffer(values.buffers()[1], dtype=dtype, count=count,
                         offset=(values.offset + start) * dtype.itemsize)


def _unpack_ragged(column: pa.StructArray) -> np.ndarray:
    data, shape = column.flatten()  # the children, sliced like the struct
    ndim = shape.type.list_size
    shapes = _numbers(shape.values, shape.offset * ndim, len(shape) * ndim).reshape(len(shape), ndim)
    bounds = data.offsets.to_numpy()
    flat = _numbers(data.values, 0, len(data.values))
    rows = [flat[bounds[i]:bounds[i + 1]].reshape(shapes[i]) for i in range(len(data))]
    return stack_or_objects(rows)
