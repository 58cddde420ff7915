"""Native (non-codec) columns: their types, Python values for Arrow columns on write, numpy columns on read.

Scalar fields and codec-less list fields are stored as native Parquet values. This module maps numpy types to
the Arrow types of such columns and back (:func:`native_arrow_type`, :func:`numpy_type_of_arrow`), checks and
converts one value for writing (:func:`to_arrow_scalar`), converts whole Arrow columns to numpy arrays of the
field's type for reading (:func:`scalar_column_to_numpy`), and describes scalar Arrow types in JSON for the
metadata. It sits below the codecs and the Unischema, which both use it.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.errors import SchemaError

# numpy scalar type -> Arrow type of a native column, following Spark's mapping so that datasets written with
# Spark and without it are interchangeable (uint8 is stored as a 16-bit integer, uint16 as 32-bit, ...).
_NUMPY_TO_ARROW = {
    np.int8: pa.int8(),
    np.uint8: pa.int16(),
    np.int16: pa.int16(),
    np.uint16: pa.int32(),
    np.int32: pa.int32(),
    np.uint32: pa.int64(),
    np.int64: pa.int64(),
    np.float16: pa.float32(),
    np.float32: pa.float32(),
    np.float64: pa.float64(),
    np.bool_: pa.bool_(),
    np.str_: pa.string(),
    np.bytes_: pa.binary(),
    np.datetime64: pa.timestamp('us'),
    decimal.Decimal: pa.decimal128(38, 18),
}

# Arrow scalar type -> numpy scalar type of the field inferred for a column of it.
_ARROW_TO_NUMPY = {
    pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
    pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
    pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64, pa.bool_(): np.bool_,
    pa.string(): np.str_, pa.large_string(): np.str_, pa.binary(): np.bytes_, pa.large_binary(): np.bytes_,
}


def native_arrow_type(field: Any) -> pa.DataType:
    """The Arrow type of the native column that stores a codec-less field: a scalar, or a list for 1-d fields.

    Args:
        field: a :class:`~petastorm.unischema.UnischemaField` (anything with ``name``, ``numpy_dtype`` and
            ``shape``); its codec is not looked at.

    Raises:
        ValueError: the numpy type has no native column type, or the field has more than one dimension (such
            fields need a codec).
    """
    scalar = _NUMPY_TO_ARROW.get(field.numpy_dtype)
    if scalar is None:
        raise ValueError(f'Was not able to map type {field.numpy_dtype} of field {field.name!r} to an Arrow '
                         f'or Spark type; give the field a codec.')
    if tuple(field.shape) == ():
        return scalar
    if len(field.shape) == 1:
        return pa.list_(scalar)
    raise ValueError(f"An instance of non-scalar UnischemaField '{field.name}' has codec set to None and "
                     f'{len(field.shape)} dimensions; only 1-d fields can be stored as lists. Use NdarrayCodec().')


def numpy_type_of_arrow(arrow_type: pa.DataType) -> Any:
    """The numpy scalar type (or ``Decimal``) of values of an Arrow scalar type, or None if there is none.

    Dictionary-encoded types map as their value type; dates and timestamps map to ``np.datetime64``.
    """
    if isinstance(arrow_type, pa.DictionaryType):
        arrow_type = arrow_type.value_type
    if arrow_type in _ARROW_TO_NUMPY:
        return _ARROW_TO_NUMPY[arrow_type]
    if pa.types.is_decimal(arrow_type):
        return decimal.Decimal
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return np.datetime64
    if pa.types.is_fixed_size_binary(arrow_type):
        return np.bytes_
    return None


def arrow_type_to_json(arrow_type: pa.DataType) -> dict[str, Any]:
    """A JSON description of a scalar Arrow type."""
    if pa.types.is_decimal(arrow_type):
        return {'type': 'decimal', 'precision': arrow_type.precision, 'scale': arrow_type.scale}
    if pa.types.is_timestamp(arrow_type):
        return {'type': 'timestamp', 'unit': arrow_type.unit, 'tz': arrow_type.tz}
    name = str(arrow_type)
    if name not in _ARROW_BY_NAME:
        raise SchemaError(f'Arrow type {arrow_type} cannot be described in the schema metadata')
    return {'type': name}


def arrow_type_from_json(description: dict[str, Any]) -> pa.DataType:
    """Inverse of :func:`arrow_type_to_json`."""
    kind = description.get('type')
    if kind == 'decimal':
        return pa.decimal128(int(description['precision']), int(description['scale']))
    if kind == 'timestamp':
        return pa.timestamp(description.get('unit', 'us'), tz=description.get('tz'))
    if kind not in _ARROW_BY_NAME:
        raise SchemaError(f'unknown scalar type {kind!r} in the schema metadata; expected one of '
                          f'{", ".join(sorted(_ARROW_BY_NAME))}, decimal, timestamp')
    return _ARROW_BY_NAME[kind]


_ARROW_BY_NAME = {str(t): t for t in (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
    pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.string(), pa.large_string(), pa.binary(),
    pa.large_binary(), pa.date32(), pa.date64())}


def to_arrow_scalar(name: str, arrow_type: pa.DataType, value: Any) -> Any:
    """Convert one value to the Python value stored in a column of ``arrow_type``, checking its type and range.

    Raises:
        SchemaError: the value does not fit (naming the field, the expected type and the value).
    """
    if isinstance(value, np.ndarray):
        value = value[()]
    try:
        if pa.types.is_integer(arrow_type):
            if isinstance(value, (float, np.floating)):
                if not float(value).is_integer():
                    raise ValueError('not an integral value')
            elif not isinstance(value, (int, np.integer, bool, np.bool_)):
                raise TypeError(f'expected an integer, got {type(value).__name__}')
            result = int(value)
            info = np.iinfo(arrow_type.to_pandas_dtype())
            if not info.min <= result <= info.max:
                raise ValueError(f'out of range [{info.min}, {info.max}]')
            return result
        if pa.types.is_floating(arrow_type):
            if not isinstance(value, (int, float, np.integer, np.floating, bool, np.bool_)):
                raise TypeError(f'expected a number, got {type(value).__name__}')
            return float(value)
        if pa.types.is_boolean(arrow_type):
            if not isinstance(value, (bool, np.bool_, int, np.integer)):
                raise TypeError(f'expected a bool, got {type(value).__name__}')
            return bool(value)
        if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
            if not isinstance(value, str):
                raise TypeError(f'expected a str, got {type(value).__name__}')
            return str(value)
        if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f'expected bytes, got {type(value).__name__}')
            return bytes(value)
        if pa.types.is_timestamp(arrow_type) and isinstance(value, np.datetime64):
            if arrow_type.unit not in ('s', 'ms', 'us'):
                return value
            moment = value.astype(f'datetime64[{arrow_type.unit}]').astype(object)
            # numpy times carry no zone and mean UTC; say so, or Spark would read them as local time.
            return moment.replace(tzinfo=datetime.timezone.utc) if arrow_type.tz else moment
        if pa.types.is_decimal(arrow_type):
            return _checked_decimal(value, arrow_type)
        return value
    except (TypeError, ValueError, OverflowError) as err:
        raise SchemaError(f'field {name!r}: value {value!r} does not fit the column type {arrow_type}: {err}') \
            from err


def _checked_decimal(value: Any, arrow_type: pa.DataType) -> decimal.Decimal:
    if not isinstance(value, (decimal.Decimal, int, float, str, np.integer, np.floating)):
        raise TypeError(f'expected a Decimal, got {type(value).__name__}')
    number = decimal.Decimal(str(value)) if not isinstance(value, decimal.Decimal) else value
    if not number.is_finite():
        raise ValueError('not a finite number')
    integer_digits = number.adjusted() + 1
    if integer_digits > arrow_type.precision - arrow_type.scale:
        raise ValueError(f'more than {arrow_type.precision - arrow_type.scale} digits before the decimal point')
    return number


def scalar_column_to_numpy(field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Convert a native Arrow column to a numpy array whose elements are of ``field.numpy_dtype``.

    Strings become fixed-width unicode arrays (elements are ``np.str_``), decimals an object array of
    ``Decimal``, lists of equal length a 2-d array, and a column with nulls an object array holding ``None``.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if isinstance(column.type, pa.DictionaryType):
        column = column.dictionary_decode()
    dtype = field.numpy_dtype
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        return _list_column_to_numpy(field, column)
    if column.null_count:
        filled = column.to_numpy(zero_copy_only=False)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        out = np.empty(len(column), dtype=object)
        for i in np.flatnonzero(valid):
            out[i] = _cast_scalar(dtype, filled[i])
        return out
    values = _to_numpy(column)
    if dtype in (np.str_, np.bytes_):
        return values.astype(dtype) if len(values) else np.empty(0, dtype=dtype)
    if isinstance(dtype, type) and issubclass(dtype, np.generic) and dtype not in (np.datetime64, np.timedelta64):
        if values.dtype.type is not dtype:
            values = values.astype(dtype)
        return values
    if dtype is np.datetime64:
        return values if values.dtype.kind == 'M' else values.astype('datetime64[us]')
    return values


def _to_numpy(column: pa.Array) -> np.ndarray:
    """``column.to_numpy(zero_copy_only=False)``, reading null-free numbers straight from the data buffer.

    pyarrow converts through its pandas layer, which imports pandas on first use even for plain numbers: about a
    quarter of a CPU second in every fresh worker process, before its first row. A view of the buffer is the same
    read-only array, without that import.
    """
    arrow_type = column.type
    if column.null_count or not (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)):
        return column.to_numpy(zero_copy_only=False)
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    values = np.frombuffer(column.buffers()[1], dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)
    values.flags.writeable = False  # as pyarrow's view: the memory belongs to Arrow
    return values


def _cast_scalar(dtype: Any, value: Any) -> Any:
    if dtype is None or value is None:
        return value
    if dtype is np.datetime64 and not isinstance(value, np.datetime64):
        return np.datetime64(value)
    try:
        return dtype(value)
    except (TypeError, ValueError):
        return value


def _list_column_to_numpy(field: Any, column: pa.Array) -> np.ndarray:
    dtype = field.numpy_dtype
    n = len(column)
    if not column.null_count and n:
        lengths = _to_numpy(column.value_lengths()) if not pa.types.is_fixed_size_list(
            column.type) else np.full(n, column.type.list_size)
        flat = column.flatten()
        if (lengths == lengths[0]).all() and not flat.null_count:
            values = _to_numpy(flat)
            if isinstance(dtype, type) and issubclass(dtype, np.generic) and values.dtype.type is not dtype:
                values = values.astype(dtype)
            shape = tuple(field.shape)
            if len(shape) > 1 and None not in shape:
                return values.reshape((n, *shape))
            return values.reshape(n, int(lengths[0]))
    out = np.empty(n, dtype=object)
    for i, item in enumerate(column.to_pylist()):
        out[i] = None if item is None else np.asarray(item, dtype=dtype if dtype not in (None,) else None)
    return out
