"""Inferring a Unischema from the Arrow schema of a plain Parquet store.

Fields get no codec, except Arrow tensor extension columns (``arrow.fixed_shape_tensor``,
``arrow.variable_shape_tensor``), which become n-d fields decoded by ``ArrowTensorCodec``.
"""

from __future__ import annotations

import decimal
import warnings
from typing import Any

import numpy as np
import pyarrow as pa

_ARROW_TO_NUMPY = {
    pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
    pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
    pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64, pa.bool_(): np.bool_,
    pa.string(): np.str_, pa.large_string(): np.str_, pa.binary(): np.bytes_, pa.large_binary(): np.bytes_,
}


def numpy_type_of_arrow(arrow_type: pa.DataType) -> Any:
    """The numpy scalar type (or ``Decimal``) for an Arrow scalar type, or None if unsupported."""
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


def _tensor_field(arrow_field: pa.Field) -> Any:
    """The n-d field of an Arrow tensor extension column of numbers, or None for any other column."""
    from petastorm.codecs import ArrowTensorCodec
    from petastorm.codecs._tensor import FIXED_SHAPE_TENSOR, VARIABLE_SHAPE_TENSOR, VariableShapeTensorType
    from petastorm.unischema import UnischemaField

    arrow_type = arrow_field.type
    name = getattr(arrow_type, 'extension_name', None)
    if name == FIXED_SHAPE_TENSOR:
        value_type, shape = arrow_type.value_type, tuple(int(d) for d in arrow_type.shape)
    elif name == VARIABLE_SHAPE_TENSOR:
        storage = arrow_type.storage_type
        value_type = storage.field('data').type.value_type
        # pyarrow's own type does not expose the uniform_shape metadata: every dimension is taken as free.
        shape = arrow_type.uniform_shape if isinstance(arrow_type, VariableShapeTensorType) else \
            (None,) * storage.field('shape').type.list_size
    else:
        return None
    numpy_type = numpy_type_of_arrow(value_type)
    if numpy_type is None or np.dtype(numpy_type).kind not in 'iuf':
        return None
    return UnischemaField(arrow_field.name, numpy_type, shape, ArrowTensorCodec(), arrow_field.nullable)


def _field_for(arrow_field: pa.Field, omit_unsupported: bool) -> Any:
    from petastorm.unischema import UnischemaField

    tensor = _tensor_field(arrow_field)
    if tensor is not None:
        return tensor
    arrow_type = arrow_field.type
    shape: tuple = ()
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        value_type = arrow_type.value_type
        if pa.types.is_nested(value_type):
            warnings.warn(f'[ARROW-1644] Ignoring unsupported structure {arrow_type!r} for field '
                          f'{arrow_field.name!r}', UserWarning, stacklevel=4)
            return None
        shape = (arrow_type.list_size,) if pa.types.is_fixed_size_list(arrow_type) else (None,)
        arrow_type = value_type
    numpy_type = numpy_type_of_arrow(arrow_type)
    if numpy_type is None:
        if not omit_unsupported:
            raise ValueError(f'Cannot auto-create unischema due to unsupported column type {arrow_field.type} '
                             f'of column {arrow_field.name!r}')
        warnings.warn(f'Column {arrow_field.name!r} has an unsupported field {arrow_field.type}. Ignoring...',
                      UserWarning, stacklevel=4)
        return None
    return UnischemaField(arrow_field.name, numpy_type, shape, None, arrow_field.nullable)


def infer_unischema(source: Any, omit_unsupported_fields: bool = True, partitions: dict[str, list[str]] | None = None,
                    name: str = 'inferred_schema') -> Any:
    """A Unischema with the partition columns first, then the file columns in file order.

    Args:
        source: a ``pyarrow.Schema`` or a ``pyarrow.dataset.Dataset`` (its schema is used).
        omit_unsupported_fields: skip unsupported columns with a warning instead of raising ``ValueError``.
        partitions: ``{partition column: values seen}``; a column is int64 when every value parses as an int.
        name: the schema name.
    """
    from petastorm.unischema import Unischema, UnischemaField

    schema = source if isinstance(source, pa.Schema) else source.schema
    fields = []
    partitions = partitions or {}
    for column, values in partitions.items():
        is_int = all(_parses_as_int(v) for v in values)
        fields.append(UnischemaField(column, np.int64 if is_int else np.str_, (), None, False))
    for arrow_field in schema:
        if arrow_field.name in partitions:
            continue
        field = _field_for(arrow_field, omit_unsupported_fields)
        if field is not None:
            fields.append(field)
    return Unischema(name, fields)


def _parses_as_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True
