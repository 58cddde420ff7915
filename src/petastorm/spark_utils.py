"""Reading a Petastorm dataset as a Spark RDD of decoded rows (Petastorm's ``petastorm.spark_utils``).

pyspark is not imported here; the caller's session does the work.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from petastorm.metadata.schemas import stored_schema_at
from petastorm.spark.session import require_classic_session
from petastorm.unischema import Unischema, UnischemaField, _namedtuple_class
from petastorm.utils import decode_row

__all__ = ['dataset_as_rdd']


@functools.cache
def _picklable_row_class(type_name: str, field_names: tuple[str, ...]) -> type:
    """A subclass of the schema's namedtuple whose instances pickle by value.

    Spark ships RDD elements with the standard pickle, which stores a class by its import path; the
    namedtuple classes made per schema view are not importable by name, so rows reduce to this module's
    rebuild function instead.
    """
    base = _namedtuple_class(type_name, field_names)

    def __reduce__(self: tuple) -> tuple:
        return _rebuild_row, (type_name, field_names, tuple(self))

    return type(type_name, (base,), {'__slots__': (), '__reduce__': __reduce__})


def _rebuild_row(type_name: str, field_names: tuple[str, ...], values: tuple) -> tuple:
    return _picklable_row_class(type_name, field_names)(*values)


def _decoded_row(schema: Unischema, row: Any) -> tuple:
    decoded = decode_row(row.asDict(), schema)
    row_class = _picklable_row_class(f'{schema._name}_view', tuple(schema.fields))
    return row_class(**{name: decoded.get(name) for name in schema.fields})


def dataset_as_rdd(dataset_url: str, spark_session: Any,
                   schema_fields: Iterable[UnischemaField | str] | None = None,
                   hdfs_driver: str = 'libhdfs3') -> Any:
    """An RDD of the dataset's rows, each a namedtuple of decoded values (numpy arrays, images, scalars).

    Args:
        dataset_url: the dataset directory (``file:///...``, ``hdfs://...``, ...), read by Spark.
        spark_session: a classic ``pyspark.sql.SparkSession`` (Spark Connect sessions have no RDDs).
        schema_fields: fields to keep: ``UnischemaField`` s and/or regular expressions matching whole names;
            all fields when None.
        hdfs_driver: accepted for compatibility; the filesystem is chosen from the URL.

    Returns:
        A ``pyspark.RDD`` of namedtuples named ``'<schema name>_view'`` with the fields in schema order.

    Raises:
        ClassicSessionRequiredError: ``spark_session`` is a Spark Connect session (also a ``TypeError``).
        PetastormMetadataError: the dataset has no stored schema.
        ValueError: a field in ``schema_fields`` does not belong to the schema.
    """
    require_classic_session(spark_session, 'dataset_as_rdd', 'Read decoded rows with petastorm.make_reader(url) '
                            '(or make_batch_reader), or the raw columns as a DataFrame with spark.read.parquet(url).')
    schema = stored_schema_at(dataset_url)
    if schema_fields is not None:
        schema = schema.create_schema_view(list(schema_fields))
    names = list(schema.fields)
    dataframe = spark_session.read.parquet(dataset_url).select(*names)
    return dataframe.rdd.map(functools.partial(_decoded_row, schema))
