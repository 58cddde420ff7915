"""Translation between Spark SQL types and Arrow types, without importing pyspark.

Spark type objects are recognised by class name (and the decimal's precision/scale) so that a schema holding
``ScalarCodec(IntegerType())`` can be stored, compared and read on a machine that has no pyspark. pyspark
itself is only needed to *create* Spark types, and the caller passes its ``pyspark.sql.types`` module in.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pyarrow as pa

from petastorm.errors import SchemaError

__all__ = ['arrow_type_from_spark', 'is_spark_type', 'spark_type_from_arrow']

# Spark type class name -> Arrow type (all parameterless Spark types).
_SPARK_NAME_TO_ARROW = {
    'ByteType': pa.int8(),
    'ShortType': pa.int16(),
    'IntegerType': pa.int32(),
    'LongType': pa.int64(),
    'FloatType': pa.float32(),
    'DoubleType': pa.float64(),
    'BooleanType': pa.bool_(),
    'StringType': pa.string(),
    'BinaryType': pa.binary(),
    'DateType': pa.date32(),
    'TimestampType': pa.timestamp('us', tz='UTC'),
    'TimestampNTZType': pa.timestamp('us'),
}


def is_spark_type(obj: Any) -> bool:
    """Whether ``obj`` is an instance of a pyspark SQL data type (checked without importing pyspark)."""
    return any(cls.__module__.startswith('pyspark.sql') and cls.__name__ == 'DataType'
               for cls in type(obj).__mro__)


def arrow_type_from_spark(spark_type: Any) -> pa.DataType:
    """The Arrow type Spark writes to Parquet for ``spark_type`` (a pyspark type instance or its stand-in)."""
    name = type(spark_type).__name__
    if name == 'DecimalType':
        return pa.decimal128(int(spark_type.precision), int(spark_type.scale))
    if name in _SPARK_NAME_TO_ARROW:
        return _SPARK_NAME_TO_ARROW[name]
    if name == 'ArrayType':
        return pa.list_(pa.field('element', arrow_type_from_spark(spark_type.elementType),
                                 nullable=bool(spark_type.containsNull)))
    if name == 'StructType':
        return pa.struct([pa.field(f.name, arrow_type_from_spark(f.dataType), nullable=bool(f.nullable))
                          for f in spark_type.fields])
    if name == 'MapType':
        return pa.map_(arrow_type_from_spark(spark_type.keyType),
                       pa.field('value', arrow_type_from_spark(spark_type.valueType),
                                nullable=bool(spark_type.valueContainsNull)))
    raise SchemaError(f'Spark type {spark_type!r} is not supported as a column type; supported: '
                      f'{", ".join(sorted(_SPARK_NAME_TO_ARROW))}, DecimalType, ArrayType, StructType, MapType')


def spark_type_from_arrow(arrow_type: pa.DataType, types: ModuleType) -> Any:
    """The pyspark type that stores Arrow type ``arrow_type``; ``types`` is ``pyspark.sql.types``."""
    if pa.types.is_decimal(arrow_type):
        return types.DecimalType(arrow_type.precision, arrow_type.scale)
    if pa.types.is_timestamp(arrow_type):
        return types.TimestampType() if arrow_type.tz else types.TimestampNTZType()
    nested = _nested_spark_type(arrow_type, types)
    if nested is not None:
        return nested
    if pa.types.is_date64(arrow_type):
        return types.DateType()
    for name, candidate in _SPARK_NAME_TO_ARROW.items():
        if candidate == arrow_type and not name.startswith('Timestamp'):
            return getattr(types, name)()
    return _wider_spark_type(arrow_type, types)


def _nested_spark_type(arrow_type: pa.DataType, types: ModuleType) -> Any:
    """The pyspark type of a list, struct, map or dictionary type (its children mapped too); else None."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return types.ArrayType(spark_type_from_arrow(arrow_type.value_type, types), arrow_type.value_field.nullable)
    if pa.types.is_struct(arrow_type):
        return types.StructType([types.StructField(arrow_type.field(i).name,
                                                   spark_type_from_arrow(arrow_type.field(i).type, types),
                                                   arrow_type.field(i).nullable)
                                 for i in range(arrow_type.num_fields)])
    if pa.types.is_map(arrow_type):
        return types.MapType(spark_type_from_arrow(arrow_type.key_type, types),
                             spark_type_from_arrow(arrow_type.item_type, types), arrow_type.item_field.nullable)
    if isinstance(arrow_type, pa.DictionaryType):
        return spark_type_from_arrow(arrow_type.value_type, types)
    return None


def _wider_spark_type(arrow_type: pa.DataType, types: ModuleType) -> Any:
    """The pyspark type of an Arrow type Spark has no exact counterpart of: unsigned integers, large text."""
    if arrow_type == pa.uint8():
        return types.ShortType()
    if arrow_type in (pa.uint16(), pa.uint32()):
        return types.LongType() if arrow_type == pa.uint32() else types.IntegerType()
    if pa.types.is_large_string(arrow_type):
        return types.StringType()
    if pa.types.is_large_binary(arrow_type):
        return types.BinaryType()
    raise ValueError(f'Was not able to map type {arrow_type} to a spark type.')
