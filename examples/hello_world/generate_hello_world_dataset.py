"""Generates the hello-world dataset with Spark: the example from the Petastorm documentation.

Run it with ``python examples/hello_world/generate_hello_world_dataset.py [OUTPUT_URL]``; the dataset goes to
``file:///tmp/hello_world_dataset`` unless another URL is given. ``python_hello_world.py`` and
``pytorch_hello_world.py`` read it back. ``write_hello_world_dataset.py`` writes the same dataset without Spark.

The code is the documented one; the only addition is ``PYSPARK_PYTHON`` below, so that Spark's Python workers
run this interpreter (the one petastorm is installed in) even when its environment is not activated.
"""

import argparse
import os
import sys

import numpy as np
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType

from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row

# Spark starts its Python workers with $PYSPARK_PYTHON, else with the first `python3` on PATH, which may not have
# petastorm (a virtual environment that is not activated): they would fail with "No module named 'petastorm'".
os.environ.setdefault('PYSPARK_PYTHON', sys.executable)

# The schema defines how the dataset schema looks like
HelloWorldSchema = Unischema('HelloWorldSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(IntegerType()), False),
    UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png'), False),
    UnischemaField('array_4d', np.uint8, (None, 128, 30, None), NdarrayCodec(), False),
])


def row_generator(x):
    """Returns a single entry in the generated dataset. Return a bunch of random values as an example."""
    return {'id': x,
            'image1': np.random.randint(0, 255, dtype=np.uint8, size=(128, 256, 3)),
            'array_4d': np.random.randint(0, 255, dtype=np.uint8, size=(4, 128, 30, 3))}


def generate_petastorm_dataset(output_url='file:///tmp/hello_world_dataset'):
    rowgroup_size_mb = 256

    spark = SparkSession.builder.config('spark.driver.memory', '2g').master('local[2]').getOrCreate()
    sc = spark.sparkContext

    # Wrap dataset materialization portion. Will take care of setting up spark environment variables as
    # well as save petastorm specific metadata
    rows_count = 10
    with materialize_dataset(spark, output_url, HelloWorldSchema, rowgroup_size_mb):

        rows_rdd = sc.parallelize(range(rows_count))\
            .map(row_generator)\
            .map(lambda x: dict_to_spark_row(HelloWorldSchema, x))

        spark.createDataFrame(rows_rdd, HelloWorldSchema.as_spark_schema()) \
            .coalesce(10) \
            .write \
            .mode('overwrite') \
            .parquet(output_url)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Write the hello-world Petastorm dataset with Spark.')
    parser.add_argument('output_url', nargs='?', default='file:///tmp/hello_world_dataset',
                        help='dataset URL (default: %(default)s)')
    generate_petastorm_dataset(parser.parse_args().output_url)
