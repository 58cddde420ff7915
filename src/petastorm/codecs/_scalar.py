"""Native Parquet scalars: the codec for fields stored as plain Spark/Arrow values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._compat import is_nested_type
from petastorm.codecs._base import DataframeColumnCodec, _field_name
from petastorm.errors import SchemaError
from petastorm.typemaps.scalars import (
    arrow_type_from_json,
    arrow_type_to_json,
    scalar_column_to_numpy,
    to_arrow_scalar,
    to_arrow_value,
)
from petastorm.typemaps.spark import arrow_type_from_spark, is_spark_type


class ScalarCodec(DataframeColumnCodec):
    """Stores a scalar as a native Parquet value of a Spark SQL type or an Arrow type.

    Args:
        spark_type: a ``pyspark.sql.types`` instance (``IntegerType()``, ``DecimalType(10, 9)``, ...) or a
            ``pyarrow.DataType`` (``pa.int32()``); pyspark is not needed for the latter.
    """

    codec_name = 'scalar'

    def __init__(self, spark_type: Any) -> None:
        if isinstance(spark_type, pa.DataType):
            self._arrow_type = spark_type
        elif is_spark_type(spark_type) or type(spark_type).__name__.endswith('Type'):
            self._arrow_type = arrow_type_from_spark(spark_type)
        else:
            raise SchemaError(f'ScalarCodec expects a pyspark SQL type or a pyarrow DataType, got {spark_type!r}')
        self._spark_type = spark_type

    def arrow_type(self) -> pa.DataType:
        return self._arrow_type

    def spark_dtype(self) -> Any:
        if not isinstance(self._spark_type, pa.DataType) and is_spark_type(self._spark_type):
            return self._spark_type
        from petastorm._optional import import_optional
        from petastorm.typemaps.spark import spark_type_from_arrow

        return spark_type_from_arrow(self._arrow_type, import_optional('pyspark.sql.types', 'spark_dtype()'))

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, **arrow_type_to_json(self._arrow_type)}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> ScalarCodec:
        return cls(arrow_type_from_json(description))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScalarCodec) and self._arrow_type == other._arrow_type

    def __hash__(self) -> int:
        return hash(str(self._arrow_type))

    def __getstate__(self) -> dict:
        # Arrow types pickle everywhere; a Spark type is kept only for spark_dtype() on machines with pyspark.
        # Subclasses' attributes (a ClassLabelCodec's names) travel too.
        return dict(self.__dict__)

    def encode(self, unischema_field: Any, value: Any) -> Any:
        name = _field_name(unischema_field)
        if is_nested_type(self._arrow_type):
            # Lists, structs and maps: the value as Arrow stores it, checked element by element.
            return to_arrow_value(name, self._arrow_type, value)
        if hasattr(value, '__len__') and not isinstance(value, (str, bytes)) and not (
                isinstance(value, np.ndarray) and value.ndim == 0):
            raise TypeError(f"Expected a scalar as a value for field '{name}'. Got a non-numpy type'{type(value)}'")
        if tuple(unischema_field.shape) != ():
            raise SchemaError(f'The shape field of a scalar field {name!r} must be an empty tuple (i.e. \'()\'). '
                              f'Got {unischema_field.shape}')
        return to_arrow_scalar(name, self._arrow_type, value)

    def decode(self, unischema_field: Any, value: Any) -> Any:
        return unischema_field.numpy_dtype(value)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> Any:
        return scalar_column_to_numpy(unischema_field, column)

    def __str__(self) -> str:
        if not isinstance(self._spark_type, pa.DataType):
            return f'ScalarCodec({type(self._spark_type).__name__}())'
        return f'ScalarCodec({self._arrow_type})'


#: Codec classes by their persisted name.
