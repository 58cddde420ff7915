"""The conversion options, checked, and the DataFrame made ready to be written for the readers.

Two column rewrites happen before the write: Spark ML vectors (``pyspark.ml.linalg`` and the older
``pyspark.mllib.linalg`` ``VectorUDT``) become arrays, since Parquet stores them as structs the readers cannot turn
into tensors; and floating point columns (also inside arrays) are cast to the requested ``dtype``, because training
code nearly always wants float32 while Spark computes in double.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm._checks import check_positive_int
from petastorm._optional import import_optional
from petastorm.errors import PetastormError

__all__ = [
    'DEFAULT_ROW_GROUP_SIZE_BYTES',
    'FLOAT_DTYPES',
    'PARQUET_CODECS',
    'ConversionOptions',
    'ConverterOptionError',
    'prepare_dataframe',
]

DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024

#: Parquet codecs that Spark writes and pyarrow reads (``none`` is Spark's other name for uncompressed).
PARQUET_CODECS = ('uncompressed', 'snappy', 'gzip', 'lz4', 'lz4_raw', 'zstd', 'brotli')
_CODEC_ALIASES = {'none': 'uncompressed'}
FLOAT_DTYPES = ('float32', 'float64')


class ConverterOptionError(PetastormError, ValueError, RuntimeError):
    """An argument of ``make_spark_converter`` is not valid (a ``RuntimeError`` too, as Petastorm raised)."""


@dataclass(frozen=True)
class ConversionOptions:
    """What a materialized copy depends on besides the DataFrame's plan; also the cache's reuse key."""

    parent_dir_url: str
    row_group_size_bytes: int
    compression_codec: str
    dtype: str | None

    @classmethod
    def validated(cls, parent_dir_url: str, parquet_row_group_size_bytes: Any, compression_codec: Any,
                  dtype: Any) -> ConversionOptions:
        """Check ``make_spark_converter``'s arguments and normalize them (codec lower-case, dtype a name).

        Raises:
            ConverterOptionError: a value is not supported; the message lists what is.
        """
        row_group_bytes = check_positive_int('parquet_row_group_size_bytes', parquet_row_group_size_bytes,
                                             unit='bytes', error=ConverterOptionError)
        return cls(parent_dir_url, row_group_bytes, _check_codec(compression_codec),
                   _check_dtype(dtype))


def _check_codec(compression_codec: Any) -> str:
    if compression_codec is None:
        return 'uncompressed'
    name = str(compression_codec).lower()
    name = _CODEC_ALIASES.get(name, name)
    if name not in PARQUET_CODECS:
        raise ConverterOptionError(f'compression_codec {compression_codec!r} is not supported: use one of '
                                   f'{", ".join(PARQUET_CODECS)} (or None for uncompressed)')
    return name


def _check_dtype(dtype: Any) -> str | None:
    if dtype is None:
        return None
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in FLOAT_DTYPES:
        # Petastorm's words verbatim, run of spaces included (code and tests match them), then ours.
        raise ConverterOptionError(f"dtype {dtype} is not supported.             Use 'float32' or float64 "
                                   f"(dtype='float32', 'float64', or None to keep the DataFrame's float types)")
    return name


def _is_vector(data_type: Any) -> bool:
    # Both VectorUDT classes (ml and the older mllib) are user-defined types named VectorUDT.
    return type(data_type).__name__ == 'VectorUDT' and hasattr(data_type, 'sqlType')


def _cast_target(data_type: Any, dtype: str, types: Any) -> Any:
    """The type a column of ``data_type`` is cast to, or None when it stays as it is."""
    source, target = (types.DoubleType, types.FloatType()) if dtype == 'float32' else \
        (types.FloatType, types.DoubleType())
    if isinstance(data_type, source):
        return target
    if isinstance(data_type, types.ArrayType):
        element = _cast_target(data_type.elementType, dtype, types)
        return None if element is None else types.ArrayType(element, data_type.containsNull)
    if isinstance(data_type, types.StructType):
        fields = [_cast_target(f.dataType, dtype, types) for f in data_type.fields]
        if all(f is None for f in fields):
            return None
        return types.StructType([types.StructField(f.name, f.dataType if t is None else t, f.nullable)
                                 for f, t in zip(data_type.fields, fields, strict=True)])
    if isinstance(data_type, types.MapType):
        value = _cast_target(data_type.valueType, dtype, types)
        return None if value is None else types.MapType(data_type.keyType, value, data_type.valueContainsNull)
    return None


def prepare_dataframe(df: Any, dtype: str | None) -> Any:
    """``df`` with vectors as arrays and floats of the requested precision; column names and order are kept.

    Args:
        df: a ``pyspark.sql.DataFrame``.
        dtype: ``'float32'``, ``'float64'`` or None (floats are left as they are; vectors become float64 arrays).
    """
    types = import_optional('pyspark.sql.types', 'make_spark_converter')
    functions = import_optional('pyspark.sql.functions', 'make_spark_converter')
    columns = []
    changed = False
    for field in df.schema.fields:
        column = functions.col('`' + field.name.replace('`', '``') + '`')  # names with dots or backticks
        if _is_vector(field.dataType):
            ml_functions = import_optional('pyspark.ml.functions', 'converting Spark ML vector columns')
            column = ml_functions.vector_to_array(column, dtype or 'float64').alias(field.name)
            changed = True
        elif dtype is not None:
            target = _cast_target(field.dataType, dtype, types)
            if target is not None:
                column = column.cast(target).alias(field.name)
                changed = True
        columns.append(column)
    return df.select(*columns) if changed else df
