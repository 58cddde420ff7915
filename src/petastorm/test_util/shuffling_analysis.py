"""How well does a reader shuffle? A measure you can run on a test dataset or on your own data.

:func:`compute_correlation_distribution` reads a dataset several times with the shuffling options under test and,
for each read, computes the Pearson correlation between the position at which a row was *delivered* and its
position in *storage order* (the order of an unshuffled read). The result is the mean and standard deviation of
that correlation over the reads:

* about 1.0: rows come out in storage order (no shuffling);
* high (e.g. > 0.5): only local shuffling, e.g. ``shuffle_rows`` inside row groups or a few large row groups;
* about 0.0: delivery order carries no trace of storage order (good shuffling); the standard deviation of a truly
  random order of ``n`` rows is about ``1 / sqrt(n)``.

Example:
    >>> mean, std = compute_correlation_distribution('file:///data/train', 'id',
    ...     {'shuffle_row_groups': True, 'shuffle_rows': True}, num_corr_samples=10)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from petastorm.codecs import ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

__all__ = [
    'CorrelationDistribution',
    'ShuffleAnalysisSchema',
    'compute_correlation_distribution',
    'generate_shuffle_analysis_dataset',
]

_INT64_BYTES = 8
_MB = 1 << 20


def _long_codec() -> ScalarCodec:
    import pyarrow as pa

    return ScalarCodec(pa.int64())


#: One ``id`` column numbering the rows in storage order.
ShuffleAnalysisSchema = Unischema('ShuffleAnalysisSchema',
                                  [UnischemaField('id', np.int64, (), _long_codec(), False)])


class CorrelationDistribution(NamedTuple):
    """Mean and standard deviation of the order correlation over the reads (see the module docstring)."""

    mean: float
    std: float


def generate_shuffle_analysis_dataset(spark: Any, output_dataset_url: str, num_rows: int = 1000,
                                      row_group_size: int = 100) -> None:
    """Write ``num_rows`` rows of :data:`ShuffleAnalysisSchema` (``id`` = 0, 1, ...).

    Row groups hold ``row_group_size`` rows each.

    Args:
        spark: a SparkSession, or None to write without Spark through :func:`petastorm.write_dataset`.
        output_dataset_url: where to write (replaced if it exists).
        num_rows: number of rows.
        row_group_size: rows per row group (with Spark, rows per file, each file one row group).
    """
    if num_rows < 1 or row_group_size < 1:
        raise ValueError(f'num_rows={num_rows} and row_group_size={row_group_size} must be at least 1')
    if spark is None:
        from petastorm.writer import write_dataset

        # An int64 column without nulls takes 8 bytes a row, so this size gives row groups of exactly
        # ``row_group_size`` rows.
        write_dataset(output_dataset_url, ShuffleAnalysisSchema, ({'id': i} for i in range(num_rows)),
                      row_group_size_mb=row_group_size * _INT64_BYTES / _MB, mode='overwrite')
        return
    from petastorm.etl.materialize import materialize_dataset
    from petastorm.unischema import dict_to_spark_row

    schema = ShuffleAnalysisSchema
    partitions = max(1, -(-num_rows // row_group_size))
    with materialize_dataset(spark, output_dataset_url, schema):
        rows = spark.sparkContext.parallelize(range(num_rows), numSlices=partitions) \
            .map(lambda i: dict_to_spark_row(schema, {'id': i}))
        spark.createDataFrame(rows, schema.as_spark_schema()).write.mode('overwrite').parquet(output_dataset_url)


def _read_ids(dataset_url: str, id_column: str, reader_args: dict[str, Any]) -> np.ndarray:
    from petastorm.reader import make_batch_reader

    reader = make_batch_reader(dataset_url, schema_fields=[id_column], num_epochs=1, **reader_args)
    with reader:
        return np.concatenate([np.asarray(getattr(batch, id_column)) for batch in reader])


def compute_correlation_distribution(dataset_url: str, id_column: str, shuffle_options: dict[str, Any],
                                     num_corr_samples: int = 100, seed: int | None = 0,
                                     **reader_args: Any) -> CorrelationDistribution:
    """Mean and std of the correlation between delivery order and storage order over ``num_corr_samples`` reads.

    Works on any Parquet store ``make_batch_reader`` reads. The storage order is taken from one unshuffled read,
    so ``id_column`` only needs unique values; it does not have to be sorted.

    Args:
        dataset_url: the dataset.
        id_column: a column with a unique value per row.
        shuffle_options: reader arguments under test, e.g. ``{'shuffle_row_groups': True,
            'shuffle_row_drop_partitions': 2, 'shuffle_rows': True}``.
        num_corr_samples: number of reads.
        seed: read ``i`` uses reader seed ``seed + i`` (reproducible); None for unseeded reads.
        **reader_args: more reader arguments (``workers_count``, ``reader_pool_type``, ``filters``...).

    Returns:
        A :class:`CorrelationDistribution` ``(mean, std)``; see the module docstring for how to read it.

    Raises:
        ValueError: ``num_corr_samples`` < 1, fewer than 2 rows, or ``id_column`` has repeated values.
    """
    if num_corr_samples < 1:
        raise ValueError(f'num_corr_samples={num_corr_samples} must be at least 1')
    stored = _read_ids(dataset_url, id_column, {**reader_args, 'reader_pool_type': 'dummy',
                                                'shuffle_row_groups': False, 'shuffle_rows': False,
                                                'shuffle_row_drop_partitions': 1})
    if len(stored) < 2:
        raise ValueError(f'{dataset_url} has {len(stored)} rows; the correlation needs at least 2')
    order = np.argsort(stored, kind='stable')
    sorted_ids = stored[order]
    if np.any(sorted_ids[1:] == sorted_ids[:-1]):
        raise ValueError(f'column {id_column!r} of {dataset_url} has repeated values; pass a unique row id')
    correlations = []
    for i in range(num_corr_samples):
        options = {**reader_args, **shuffle_options}
        if seed is not None:
            options.setdefault('seed', seed + i)
        delivered = _read_ids(dataset_url, id_column, options)
        if len(delivered) != len(stored):
            raise ValueError(f'a shuffled read returned {len(delivered)} rows, the unshuffled read {len(stored)}; '
                             f'shuffle_options must not filter rows')
        storage_position = order[np.searchsorted(sorted_ids, delivered)]
        correlations.append(float(np.corrcoef(np.arange(len(delivered)), storage_position)[0, 1]))
    return CorrelationDistribution(float(np.mean(correlations)), float(np.std(correlations)))
