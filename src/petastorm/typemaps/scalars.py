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
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._compat import is_nested_type
from petastorm.columns import (
    Column,
    ListColumn,
    MapColumn,
    MaskedColumn,
    cast_leaves,
    from_arrow,
    list_depth,
    num_rows,
    primitive_to_numpy,
    single_chunk,
)
from petastorm.errors import CodecError, SchemaError

__all__ = [
    'arrow_type_from_json', 'arrow_type_to_json', 'field_type_of_arrow', 'fit_shape', 'native_arrow_type',
    'numpy_type_of_arrow', 'scalar_column_to_numpy', 'to_arrow_scalar', 'to_arrow_value',
]

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
    shape = tuple(field.shape)
    if shape == ():
        return scalar
    if len(shape) == 1:
        return pa.list_(scalar)
    if shape[0] is None:
        # Ragged rows of several dimensions: a list of (lists of) the inner dimensions, fixed-size where fixed.
        arrow_type = scalar
        for size in reversed(shape[1:]):
            arrow_type = pa.list_(arrow_type) if size is None else pa.list_(arrow_type, size)
        return pa.list_(arrow_type)
    raise ValueError(f"An instance of non-scalar UnischemaField '{field.name}' has codec set to None and "
                     f'{len(shape)} fixed dimensions; only lists (a first dimension None, or 1-d fields) are stored '
                     f'natively. Use NdarrayCodec() or ArrowTensorCodec().')


def numpy_type_of_arrow(arrow_type: pa.DataType) -> Any:
    """The numpy scalar type (or ``Decimal``) of values of an Arrow scalar type, or None if there is none.

    Dictionary-encoded types map as their value type; dates and timestamps map to ``np.datetime64``, times of day
    and durations to ``np.timedelta64``, the null type to ``np.float64`` (every value null).
    """
    if isinstance(arrow_type, pa.DictionaryType):
        arrow_type = arrow_type.value_type
    if arrow_type in _ARROW_TO_NUMPY:
        return _ARROW_TO_NUMPY[arrow_type]
    if pa.types.is_decimal(arrow_type):
        return decimal.Decimal
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return np.datetime64
    if pa.types.is_time(arrow_type) or pa.types.is_duration(arrow_type):
        return np.timedelta64
    if pa.types.is_fixed_size_binary(arrow_type) or _view_of(arrow_type, 'binary'):
        return np.bytes_
    if _view_of(arrow_type, 'string'):
        return np.str_
    if pa.types.is_null(arrow_type):
        return np.float64
    return None


def _view_of(arrow_type: pa.DataType, kind: str) -> bool:
    check = getattr(pa.types, f'is_{kind}_view', None)
    return bool(check is not None and check(arrow_type))


def _is_list_like(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type) or _view_of(arrow_type, 'list')
            or _view_of(arrow_type, 'large_list'))


def field_type_of_arrow(arrow_type: pa.DataType) -> tuple[Any, tuple[int | None, ...], bool] | None:
    """How a field describes a column of ``arrow_type``: ``(numpy type, shape, needs ScalarCodec)``, or None.

    Lists add a dimension (``None`` for a list, the size for a fixed-size list) in front of their elements' shape,
    at any depth; structs and maps are fields of type ``dict``. The third item is True when the numpy type and the
    shape do not say everything about the stored type (nested lists, structs, maps, temporal units and time
    zones, decimal precision): the field then carries ``ScalarCodec(arrow_type)``, which does.
    """
    if isinstance(arrow_type, pa.BaseExtensionType):
        return field_type_of_arrow(arrow_type.storage_type)
    if isinstance(arrow_type, pa.DictionaryType):
        return field_type_of_arrow(arrow_type.value_type)
    if pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type):
        return dict, (), True
    if _is_list_like(arrow_type):
        inner = field_type_of_arrow(arrow_type.value_type)
        if inner is None:
            return None
        numpy_type, shape, needs_codec = inner
        size = arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None
        return numpy_type, (size, *shape), needs_codec or bool(shape) or numpy_type is dict or \
            _view_of(arrow_type, 'list') or _view_of(arrow_type, 'large_list')
    numpy_type = numpy_type_of_arrow(arrow_type)
    if numpy_type is None:
        return None
    exact = numpy_type not in (np.datetime64, np.timedelta64, decimal.Decimal) and not pa.types.is_null(arrow_type)
    return numpy_type, (), not exact


def arrow_type_to_json(arrow_type: pa.DataType) -> dict[str, Any]:
    """A JSON description of an Arrow type: scalars, and lists, maps and structs of them at any depth."""
    if pa.types.is_decimal(arrow_type):
        return {'type': 'decimal', 'precision': arrow_type.precision, 'scale': arrow_type.scale}
    if pa.types.is_timestamp(arrow_type):
        return {'type': 'timestamp', 'unit': arrow_type.unit, 'tz': arrow_type.tz}
    if pa.types.is_time(arrow_type) or pa.types.is_duration(arrow_type):
        kind = 'duration' if pa.types.is_duration(arrow_type) else 'time'
        return {'type': kind, 'unit': arrow_type.unit}
    if pa.types.is_fixed_size_binary(arrow_type):
        return {'type': 'fixed_size_binary', 'byte_width': arrow_type.byte_width}
    nested = _nested_type_to_json(arrow_type)
    if nested is not None:
        return nested
    name = str(arrow_type)
    if name not in _ARROW_BY_NAME:
        raise SchemaError(f'Arrow type {arrow_type} cannot be described in the schema metadata')
    return {'type': name}


def _nested_type_to_json(arrow_type: pa.DataType) -> dict[str, Any] | None:
    """The JSON description of a dictionary, map, list or struct type (its children described too); else None."""
    if isinstance(arrow_type, pa.DictionaryType):
        return {'type': 'dictionary', 'index': arrow_type_to_json(arrow_type.index_type),
                'value': arrow_type_to_json(arrow_type.value_type)}
    if pa.types.is_map(arrow_type):
        return {'type': 'map', 'key': arrow_type_to_json(arrow_type.key_type),
                'item': _field_to_json(arrow_type.item_field)}
    if pa.types.is_fixed_size_list(arrow_type):
        return {'type': 'fixed_size_list', 'size': arrow_type.list_size, 'item': _field_to_json(arrow_type.value_field)}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return {'type': 'large_list' if pa.types.is_large_list(arrow_type) else 'list',
                'item': _field_to_json(arrow_type.value_field)}
    if pa.types.is_struct(arrow_type):
        return {'type': 'struct', 'fields': [_field_to_json(arrow_type.field(i)) for i in range(arrow_type.num_fields)]}
    return None


def _field_to_json(field: pa.Field) -> dict[str, Any]:
    return {'name': field.name, 'nullable': field.nullable, **arrow_type_to_json(field.type)}


def _field_from_json(description: dict[str, Any]) -> pa.Field:
    return pa.field(str(description.get('name', 'item')), arrow_type_from_json(description),
                    nullable=bool(description.get('nullable', True)))


def arrow_type_from_json(description: dict[str, Any]) -> pa.DataType:
    """Inverse of :func:`arrow_type_to_json`."""
    kind = description.get('type')
    build = _TYPE_FROM_JSON.get(kind) if isinstance(kind, str) else None
    if build is not None:
        return build(description)
    if kind not in _ARROW_BY_NAME:
        raise SchemaError(f'unknown scalar type {kind!r} in the schema metadata; expected one of '
                          f'{", ".join(sorted(_ARROW_BY_NAME))}, decimal, timestamp, time, duration, list, '
                          f'large_list, fixed_size_list, map, struct, dictionary')
    return _ARROW_BY_NAME[kind]


def _decimal_from_json(description: dict[str, Any]) -> pa.DataType:
    precision, scale = int(description['precision']), int(description['scale'])
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _time_from_json(description: dict[str, Any]) -> pa.DataType:
    unit = description['unit']
    return pa.time32(unit) if unit in ('s', 'ms') else pa.time64(unit)


#: How each ``type`` of a description that says more than a name becomes an Arrow type.
_TYPE_FROM_JSON: dict[str, Callable[[dict[str, Any]], pa.DataType]] = {
    'decimal': _decimal_from_json,
    'timestamp': lambda d: pa.timestamp(d.get('unit', 'us'), tz=d.get('tz')),
    'time': _time_from_json,
    'duration': lambda d: pa.duration(d['unit']),
    'fixed_size_binary': lambda d: pa.binary(int(d['byte_width'])),
    'dictionary': lambda d: pa.dictionary(arrow_type_from_json(d['index']), arrow_type_from_json(d['value'])),
    'map': lambda d: pa.map_(arrow_type_from_json(d['key']), _field_from_json(d['item'])),
    'fixed_size_list': lambda d: pa.list_(_field_from_json(d['item']), int(d['size'])),
    'list': lambda d: pa.list_(_field_from_json(d['item'])),
    'large_list': lambda d: pa.large_list(_field_from_json(d['item'])),
    'struct': lambda d: pa.struct([_field_from_json(f) for f in d['fields']]),
}


_ARROW_BY_NAME = {str(t): t for t in (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
    pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.string(), pa.large_string(), pa.binary(),
    pa.large_binary(), pa.date32(), pa.date64(), pa.null())}


def to_arrow_scalar(name: str, arrow_type: pa.DataType, value: Any) -> Any:
    """Convert one value to the Python value stored in a column of ``arrow_type``, checking its type and range.

    Raises:
        SchemaError: the value does not fit (naming the field, the expected type and the value).
    """
    if isinstance(value, np.ndarray):
        value = value[()]
    try:
        return _scalar_value(arrow_type, value)
    except (TypeError, ValueError, OverflowError) as err:
        raise SchemaError(f'field {name!r}: value {value!r} does not fit the column type {arrow_type}: {err}') \
            from err


def _scalar_value(arrow_type: pa.DataType, value: Any) -> Any:
    """The Python value a column of ``arrow_type`` stores for ``value``; TypeError or ValueError when it won't fit."""
    if pa.types.is_integer(arrow_type):
        return _integer_value(arrow_type, value)
    if pa.types.is_floating(arrow_type):
        return _of_type(value, (int, float, np.integer, np.floating, bool, np.bool_), 'a number', float)
    if pa.types.is_boolean(arrow_type):
        return _of_type(value, (bool, np.bool_, int, np.integer), 'a bool', bool)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return _of_type(value, str, 'a str', str)
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return _of_type(value, (bytes, bytearray, memoryview), 'bytes', bytes)
    if pa.types.is_timestamp(arrow_type) and isinstance(value, np.datetime64):
        return _timestamp_value(arrow_type, value)
    if pa.types.is_decimal(arrow_type):
        return _checked_decimal(value, arrow_type)
    return value


def _of_type(value: Any, accepted: type | tuple[type, ...], expected: str, convert: Callable[[Any], Any]) -> Any:
    """``convert(value)`` when ``value`` is of an ``accepted`` type; a TypeError that says ``expected`` otherwise."""
    if not isinstance(value, accepted):
        raise TypeError(f'expected {expected}, got {type(value).__name__}')
    return convert(value)


def _integer_value(arrow_type: pa.DataType, value: Any) -> int:
    """An integral number as ``int``, within the range of the integer type."""
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


def _timestamp_value(arrow_type: pa.DataType, value: np.datetime64) -> Any:
    """A numpy time as a ``datetime`` of the column's unit (UTC when the column has a zone); ns stay numpy."""
    if arrow_type.unit not in ('s', 'ms', 'us'):
        return value
    moment = value.astype(f'datetime64[{arrow_type.unit}]').astype(object)
    # numpy times carry no zone and mean UTC; say so, or Spark would read them as local time.
    return moment.replace(tzinfo=datetime.timezone.utc) if arrow_type.tz else moment


def to_arrow_value(name: str, arrow_type: pa.DataType, value: Any, nullable: bool = True) -> Any:
    """Convert one value of any native type (lists, structs, maps at any depth) to the Python value Arrow stores.

    Lists take sequences or arrays (fixed-size lists of their size only), structs mappings of their fields (a
    missing field is a null), maps mappings or sequences of ``(key, value)`` pairs; scalars are checked as
    :func:`to_arrow_scalar` checks them.

    Raises:
        SchemaError: the value does not fit (naming the field or the element, e.g. ``'boxes[]'``, ``'st.a'``).
    """
    if value is None:
        if not nullable:
            raise SchemaError(f'field {name!r} is not nullable, but got None')
        return None
    if isinstance(arrow_type, pa.DictionaryType):
        arrow_type = arrow_type.value_type
    if _is_list_like(arrow_type):
        items = _sequence(name, value)
        if pa.types.is_fixed_size_list(arrow_type) and len(items) != arrow_type.list_size:
            raise SchemaError(f'field {name!r}: expected {arrow_type.list_size} elements, got {len(items)}')
        element = arrow_type.value_field
        return [to_arrow_value(f'{name}[]', element.type, item, element.nullable) for item in items]
    if pa.types.is_struct(arrow_type):
        if not hasattr(value, 'keys'):
            raise SchemaError(f'field {name!r}: a struct takes a dict of its fields, got {type(value).__name__}')
        fields = {arrow_type.field(i).name: arrow_type.field(i) for i in range(arrow_type.num_fields)}
        unknown = sorted(str(k) for k in value if k not in fields)
        if unknown:
            raise SchemaError(f'field {name!r}: {unknown} are not fields of the struct (its fields: '
                              f'{", ".join(fields)})')
        return {key: to_arrow_value(f'{name}.{key}', child.type, value.get(key), child.nullable)
                for key, child in fields.items()}
    if pa.types.is_map(arrow_type):
        pairs = list(value.items()) if hasattr(value, 'items') else _sequence(name, value)
        checked = [(to_arrow_value(f'{name}.key', arrow_type.key_type, pair[0], False),
                    to_arrow_value(f'{name}.value', arrow_type.item_type, pair[1], arrow_type.item_field.nullable))
                   for pair in pairs]
        # A dict stays a dict (what Spark's MapType takes, and Arrow too); pairs stay pairs (keys may repeat).
        return dict(checked) if hasattr(value, 'items') else checked
    return to_arrow_scalar(name, arrow_type, value)


def _sequence(name: str, value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return list(value) if value.ndim else [value[()]]
    if isinstance(value, (str, bytes)) or not hasattr(value, '__iter__'):
        raise SchemaError(f'field {name!r}: a list takes a sequence or an array, got {type(value).__name__}')
    return list(value)


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


def scalar_column_to_numpy(field: Any, column: pa.Array | pa.ChunkedArray, text_as_objects: bool = False) -> Column:
    """Decode a native Arrow column into a column of ``field``'s values (see :mod:`petastorm.columns`).

    Null-free flat columns are numpy arrays whose elements are of ``field.numpy_dtype`` (strings fixed-width
    unicode, decimals an object array of ``Decimal``); a column with nulls is a :class:`MaskedColumn`; lists,
    maps and structs are list and struct columns over the Arrow buffers, dense ``(rows, *shape)`` arrays where the
    field's shape fixes a list's length.

    ``text_as_objects``: null-free strings and binaries become an object array of ``str``/``bytes`` (what a pandas
    DataFrame holds) instead of a fixed-width array as wide as the longest value.
    """
    column = single_chunk(column)
    if isinstance(column.type, pa.DictionaryType):
        column = column.dictionary_decode()
    if isinstance(column.type, pa.BaseExtensionType):
        column = column.storage
    dtype = field.numpy_dtype
    if is_nested_type(column.type):
        return fit_shape(field, cast_leaves(from_arrow(column), dtype), tuple(field.shape))
    if column.null_count:
        masked = from_arrow(column)
        assert isinstance(masked, MaskedColumn)
        return MaskedColumn(_typed(dtype, masked.values), masked.valid)
    if text_as_objects and dtype in (np.str_, np.bytes_):
        return column.to_numpy(zero_copy_only=False)
    return _typed(dtype, _to_numpy(column))


def _typed(dtype: Any, values: np.ndarray) -> np.ndarray:
    """Null-free values as an array of the field's numpy type."""
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
    """The values of a null-free flat column, reading numbers and times straight from the data buffer.

    pyarrow converts through its pandas layer, which imports pandas on first use even for plain numbers: about a
    quarter of a CPU second in every fresh worker process, before its first row. A view of the buffer is the same
    read-only array, without that import.
    """
    if column.null_count:
        return column.to_numpy(zero_copy_only=False)
    return primitive_to_numpy(column)


def fit_shape(field: Any, column: Column, shape: tuple[int | None, ...]) -> Column:
    """A decoded list column in the layout the field's shape asks for.

    Dimensions the shape fixes become dense (a list whose rows all hold ``d`` elements is a ``(rows, d, ...)``
    array; with null rows, a :class:`MaskedColumn` of it); ``None`` dimensions stay list columns. A flat list
    holding a fixed n-d shape row-major (Petastorm's layout for codec-less fields of several dimensions) is
    reshaped.

    Raises:
        CodecError: a row's length does not match a fixed dimension of the shape.
    """
    if not shape:
        return column
    if isinstance(column, ListColumn) and not isinstance(column, MapColumn):
        if shape[0] is None:
            inner = fit_shape(field, column.normalized().values, shape[1:])
            return ListColumn(inner, column.normalized().offsets, column.valid)
        fixed = tuple(d for d in shape if d is not None)
        if len(shape) > 1 and len(fixed) == len(shape) and list_depth(column) == 1:
            # A flat list of the row-major values of a fixed n-d shape.
            flat = _dense_rows(field, column, (math.prod(d for d in shape if d is not None),))
            if isinstance(flat, MaskedColumn):
                return MaskedColumn(flat.values.reshape((len(flat), *fixed)), flat.valid)
            return flat.reshape((num_rows(flat), *fixed)) if isinstance(flat, np.ndarray) else flat
        return _dense_rows(field, column, shape)
    if isinstance(column, np.ndarray) and column.dtype != object and len(shape) > 1 and None not in shape and \
            column.ndim == 2 and column.shape[1] == math.prod(d for d in shape if d is not None) and \
            column.shape[1:] != shape:
        return column.reshape((len(column), *(d for d in shape if d is not None)))
    return column


def _dense_rows(field: Any, column: ListColumn, shape: tuple[int | None, ...]) -> Column:
    size = shape[0]
    lengths = column.lengths
    valid = column.valid
    present = lengths if valid is None else lengths[valid]
    if len(shape) == 1 and valid is None and (present != size).any() and len(present) and \
            (present == present[0]).all():
        # A codec-less field of a fixed shape (n,) holding other lengths: Petastorm read what was stored.
        size = int(present[0])
    elif (present != size).any():
        raise CodecError(f'field {getattr(field, "name", "?")}: stored lists hold '
                         f'{sorted(set(present.tolist()))[:5]} elements; the schema shape {shape} needs {size}')
    normalized = column.normalized()
    inner = fit_shape(field, normalized.values, shape[1:])
    n = len(column)
    if isinstance(inner, MaskedColumn) or not isinstance(inner, np.ndarray) or inner.dtype == object:
        return ListColumn(inner, normalized.offsets, valid)
    if valid is None:
        return inner.reshape((n, size, *inner.shape[1:]))
    dense = np.zeros((n, size, *inner.shape[1:]), dtype=inner.dtype)
    dense[valid] = inner.reshape((-1, size, *inner.shape[1:]))
    return MaskedColumn(dense, valid)
