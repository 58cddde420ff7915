"""Spark DataFrames with ArrayType, StructType, MapType and nulls: the converter's loaders, and materialize_dataset.

Spark local[2] writes the files; what the loaders deliver equals pyarrow's rows of those files.
"""

from __future__ import annotations

import functools
import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('pyspark')

from petastorm import make_reader  # noqa: E402
from petastorm.codecs import ScalarCodec  # noqa: E402
from petastorm.etl.dataset_metadata import materialize_dataset  # noqa: E402
from petastorm.pytorch import BatchedDataLoader, DataLoader  # noqa: E402
from petastorm.spark import SparkDatasetConverter, make_spark_converter  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row  # noqa: E402
from support.nested_tables import assert_rows_equal, expected_rows  # noqa: E402
from support.torch_rows import torch_batch_rows  # noqa: E402

pytestmark = pytest.mark.spark

ROWS = 40
NESTED_SQL = [
    'id',
    'IF(id % 5 = 0, NULL, CAST(id AS INT)) AS n',
    'slice(sequence(CAST(0 AS BIGINT), id % 4), 1, CAST(id % 4 AS INT)) AS ids',
    'array(array(id), array(id, id + 1)) AS nested',
    "named_struct('a', id, 'b', CAST(id AS DOUBLE) / 2, 'c', IF(id % 3 = 0, NULL, array(id))) AS st",
    'IF(id % 6 = 0, NULL, map(id % 3, id, id % 3 + 10, id + 1)) AS m',
]


@pytest.fixture
def converter(spark, tmp_path):
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f'file://{tmp_path}/cache')
    frame = spark.range(0, ROWS, 1, 2).selectExpr(*NESTED_SQL)
    converter = make_spark_converter(frame)
    yield converter
    converter.delete()
    spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


def _written(converter):
    files = sorted(glob.glob(os.path.join(converter.cache_dir_url[len('file://'):], '*.parquet')))
    return pa.concat_tables([pq.read_table(f) for f in files])


def test_the_converters_loaders_deliver_nested_columns(converter):
    expected = expected_rows(_written(converter))
    loader_fn = functools.partial(BatchedDataLoader, variable_length='jagged', nulls='mask')
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1, data_loader_fn=loader_fn) as loader:
        batches = list(loader)
    assert isinstance(batches[0]['st'], dict)
    rows = [row for batch in batches for row in torch_batch_rows(batch)]
    assert_rows_equal(rows, expected)
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1,
                                         data_loader_fn=functools.partial(DataLoader, nulls='mask')) as loader:
        rows = [row for batch in loader for row in torch_batch_rows(batch)]
    assert_rows_equal(rows, expected)


def test_the_default_loader_names_the_nulls_option(converter):
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1) as loader, \
            pytest.raises(TypeError, match="Pytorch does not support nullable fields. Found None in .*nulls='mask'"):
        list(loader)


@pytest.mark.tf
def test_the_tf_dataset_gets_ragged_tensors_and_dicts(spark, tmp_path):
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f'file://{tmp_path}/cache')
    frame = spark.range(0, ROWS, 1, 2).selectExpr('id', 'array(array(id), array(id, id + 1)) AS nested',
                                                  "named_struct('a', id, 'b', CAST(id AS DOUBLE)) AS st")
    converter = make_spark_converter(frame)
    try:
        with converter.make_tf_dataset(batch_size=10, num_epochs=1) as dataset:
            elements = list(dataset)
    finally:
        converter.delete()
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    ids = [i for element in elements for i in element.id.numpy().tolist()]
    nested = [v for element in elements for v in element.nested.to_list()]
    st_a = [v for element in elements for v in element.st['a'].numpy().tolist()]
    assert sorted(ids) == list(range(ROWS))
    assert all(n == [[i], [i, i + 1]] for i, n in zip(ids, nested, strict=True))
    assert st_a == ids


def test_materialize_dataset_writes_nested_and_nullable_fields(spark, tmp_path):
    from pyspark.sql import types as T

    schema = Unischema('Nested', [
        UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
        UnischemaField('ids', np.int32, (None,), ScalarCodec(T.ArrayType(T.IntegerType())), True),
        UnischemaField('st', dict, (), ScalarCodec(T.StructType([T.StructField('x', T.DoubleType()),
                                                                 T.StructField('tags', T.ArrayType(T.StringType()))])),
                       True),
        UnischemaField('m', dict, (), ScalarCodec(T.MapType(T.StringType(), T.LongType())), True),
    ])
    rows = [{'id': i, 'ids': None if i % 4 == 0 else list(range(i % 3)),
             'st': None if i % 5 == 0 else {'x': i / 2, 'tags': ['t'] * (i % 2)}, 'm': {'k': i}} for i in range(12)]
    url = f'file://{tmp_path}/nested'
    with materialize_dataset(spark, url, schema, row_group_size_mb=1):
        spark.createDataFrame([dict_to_spark_row(schema, row) for row in rows], schema.as_spark_schema()) \
            .coalesce(1).write.mode('overwrite').parquet(url)
    with make_reader(url, reader_pool_type='dummy') as reader:
        assert reader.schema.fields['st'].numpy_dtype is dict
        got = [row._asdict() for row in reader]
    expected = [{**row, 'm': list(row['m'].items())} for row in rows]
    assert_rows_equal(got, expected)
