"""What the converter tests share: the cache directory setting, DataFrames and stores to convert, ids read back."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm.spark import SparkDatasetConverter

#: The Spark conf key of the converter's parent cache directory.
CONF = SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF


def scalars_frame(spark, rows: int = 100, partitions: int = 2):
    """id bigint, d double, f float, arr array<double>: computed in the JVM (no Python workers)."""
    from pyspark.sql import functions as F  # noqa: N812

    return spark.range(0, rows, 1, partitions).select(
        'id', (F.col('id') / 2).alias('d'), (F.col('id') * 3).cast('float').alias('f'),
        F.array(F.col('id').cast('double'), F.lit(0.5)).alias('arr'))


def write_plain_dataset(directory: pathlib.Path, rows: int = 40, files: int = 2) -> str:
    """A Parquet store written by pyarrow: ``files`` files of ids and float32 values; returns its URL."""
    directory.mkdir()
    per_file = rows // files
    for k in range(files):
        ids = np.arange(k * per_file, (k + 1) * per_file, dtype=np.int64)
        pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), directory / f'part-{k}.parquet')
    return f'file://{directory}'


def converter_ids(converter, **kwargs) -> list[int]:
    """The sorted ids of one epoch of the converter's torch loader (``kwargs`` go to the loader)."""
    with converter.make_torch_dataloader(batch_size=7, num_epochs=1, **kwargs) as loader:
        return sorted(int(i) for batch in loader for i in batch['id'])


def cache_location(converter):
    """``(filesystem, path)`` of the converter's copy of its DataFrame."""
    from petastorm.fs import resolve_url

    return resolve_url(converter.cache_dir_url)
