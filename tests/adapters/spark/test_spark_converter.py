"""make_spark_converter and SparkDatasetConverter: the seed's workflow, reuse, dtypes, vectors, errors, loaders,
pickling and the clean-up of cache directories at exit."""

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip('torch')
F = pytest.importorskip('pyspark.sql.functions')

from petastorm.spark import (  # noqa: E402
    cache_dir,
    in_use,
    make_spark_converter,
)
from petastorm.spark.converter_cache import ConverterCache  # noqa: E402
from petastorm.spark.dataframe_prep import ConverterOptionError  # noqa: E402
from support.spark_converters import CONF, cache_location, scalars_frame  # noqa: E402


def _subdirs(parent):
    return sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.exists() else []


def _entries_under(spark, parent):
    """The session cache's entries for copies under ``parent`` (each test has its own parent)."""
    return [entry for entry in ConverterCache.of_session(spark).entries
            if entry.dir_url.startswith(f'file://{parent}/')]


# ----------------------------------------------------------------------------------------------- the seed workflow

# The converter workflow of the project's seed description, verbatim (trailing spaces stripped); only the cache
# URL and the "df_train, df_test = ..." placeholder are replaced.
SEED_BLOCK = '''
from petastorm.spark import SparkDatasetConverter, make_spark_converter

# 1. Specify a cache directory
spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, 'hdfs:/...')

df_train, df_test = ...
model = Net()

# 2. Create converters
converter_train = make_spark_converter(df_train)
converter_test = make_spark_converter(df_test)

# 3. Use context managers for PyTorch DataLoaders
with converter_train.make_torch_dataloader() as dataloader_train:
    # dataloader_train is a torch.utils.data.DataLoader
    train(model, dataloader_train, ...)

with converter_test.make_torch_dataloader() as dataloader_test:
    test(model, dataloader_test, ...)

# 4. Clean up
converter_train.delete()
converter_test.delete()
'''


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.linear(x).squeeze(1)


@pytest.mark.spark
def test_seed_converter_workflow_runs_verbatim(spark, cache_parent):
    # label = x0 > x1: a linear model learns it. 300 train rows, 100 test rows.
    points = spark.range(0, 400, 1, 2).select(
        'id', F.rand(seed=1).alias('x0'), F.rand(seed=2).alias('x1'))
    rows = points.select('id', F.array('x0', 'x1').alias('features'),
                         (F.col('x0') > F.col('x1')).cast('double').alias('label'))
    df_train, df_test = rows.where(F.col('id') < 300), rows.where(F.col('id') >= 300)
    seen = {}

    def train(model, loader, *_):
        seen['train_loader'] = loader
        seen['train_dir'] = _subdirs(cache_parent)
        torch.manual_seed(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        for step, batch in enumerate(loader):  # the loader repeats forever (num_epochs=None)
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch['features']), batch['label'])
            loss.backward()
            optimizer.step()
            if step == 200:
                break

    def test(model, loader, *_):
        seen['test_loader'] = loader
        correct = total = 0
        with torch.no_grad():
            for step, batch in enumerate(loader):
                correct += int(((model(batch['features']) > 0) == (batch['label'] > 0.5)).sum())
                total += len(batch['label'])
                if step == 3:
                    break
        seen['accuracy'] = correct / total

    block = SEED_BLOCK.replace("'hdfs:/...'", repr(f'file://{cache_parent}')).replace(
        'df_train, df_test = ...', 'df_train, df_test = dataframes')
    namespace = {'spark': spark, 'dataframes': (df_train, df_test), 'Net': _Net, 'train': train, 'test': test}
    exec(block, namespace)  # noqa: S102

    assert isinstance(seen['train_loader'], torch.utils.data.DataLoader)
    assert isinstance(seen['test_loader'], torch.utils.data.DataLoader)
    assert len(seen['train_dir']) == 2  # one cached copy per DataFrame
    assert len(namespace['converter_train']) == 300
    assert len(namespace['converter_test']) == 100
    assert seen['accuracy'] > 0.8
    assert _subdirs(cache_parent) == []  # delete() removed both copies


# ------------------------------------------------------------------------------------------ materialization, reuse

@pytest.mark.spark
def test_converter_files_and_len_match_the_dataframe(spark, cache_parent):
    converter = make_spark_converter(scalars_frame(spark, rows=100, partitions=2))
    try:
        assert len(converter) == converter.dataset_size == 100
        assert converter.cache_dir_url.startswith(f'file://{cache_parent}/')
        assert converter.file_urls == sorted(converter.file_urls)
        assert len(converter.file_urls) == 2
        paths = [url[len('file://'):] for url in converter.file_urls]
        assert all(os.path.exists(path) and path.endswith('.parquet') for path in paths)
        table = pa.concat_tables(pq.read_table(path) for path in paths)
        assert sorted(table.column('id').to_pylist()) == list(range(100))
        # default dtype float32: doubles (also inside arrays) are cast, floats stay
        assert table.schema.field('d').type == pa.float32()
        assert table.schema.field('f').type == pa.float32()
        assert table.schema.field('arr').type.value_type == pa.float32()
        with converter.make_torch_dataloader(batch_size=7, num_epochs=1) as loader:
            # while open, the loader marks the copy as read by this process
            assert [m.pid for m in in_use.markers(*cache_location(converter))] == [os.getpid()]
            assert sorted(int(i) for batch in loader for i in batch['id']) == list(range(100))
        assert in_use.markers(*cache_location(converter)) == []
    finally:
        converter.delete()
    assert not os.path.exists(converter.cache_dir_url[len('file://'):])


@pytest.mark.spark
def test_equal_dataframes_reuse_one_copy_until_deleted(spark, cache_parent):
    first = make_spark_converter(scalars_frame(spark))
    again = make_spark_converter(scalars_frame(spark))  # built again: same analyzed plan
    assert again.cache_dir_url == first.cache_dir_url
    assert again.file_urls == first.file_urls
    other_rows = make_spark_converter(scalars_frame(spark, rows=50))
    other_dtype = make_spark_converter(scalars_frame(spark), dtype='float64')
    other_size = make_spark_converter(scalars_frame(spark), parquet_row_group_size_bytes=1024 * 1024)
    other_codec = make_spark_converter(scalars_frame(spark), compression_codec='SNAPPY')
    urls = {c.cache_dir_url for c in (first, other_rows, other_dtype, other_size, other_codec)}
    assert len(urls) == 5
    assert len(_subdirs(cache_parent)) == 5
    assert pq.ParquetFile(other_codec.file_urls[0][len('file://'):]).metadata.row_group(0).column(0).compression \
        == 'SNAPPY'

    first.delete()
    rewritten = make_spark_converter(scalars_frame(spark))
    assert rewritten.cache_dir_url != first.cache_dir_url
    for converter in (rewritten, other_rows, other_dtype, other_size, other_codec):
        converter.delete()
    assert _subdirs(cache_parent) == []
    assert _entries_under(spark, cache_parent) == []


@pytest.mark.spark
def test_copy_deleted_behind_our_back_is_written_again(spark, cache_parent, caplog):
    import shutil

    first = make_spark_converter(scalars_frame(spark, rows=30))
    shutil.rmtree(first.cache_dir_url[len('file://'):])
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        second = make_spark_converter(scalars_frame(spark, rows=30))
    assert second.cache_dir_url != first.cache_dir_url
    assert len(second) == 30
    assert 'deleted outside petastorm' in caplog.text
    second.delete()


@pytest.mark.spark
def test_dtype_float64_and_none(spark, cache_parent):
    df = scalars_frame(spark, rows=10, partitions=1)
    up = make_spark_converter(df, dtype='float64')
    kept = make_spark_converter(df, dtype=None)
    try:
        up_schema = pq.read_schema(up.file_urls[0][len('file://'):])
        assert up_schema.field('f').type == pa.float64()
        assert up_schema.field('d').type == pa.float64()
        kept_schema = pq.read_schema(kept.file_urls[0][len('file://'):])
        assert kept_schema.field('f').type == pa.float32()
        assert kept_schema.field('d').type == pa.float64()
        assert kept_schema.field('arr').type.value_type == pa.float64()
        with up.make_torch_dataloader(batch_size=10, num_epochs=1) as loader:
            batch = next(iter(loader))
        assert batch['f'].dtype == torch.float64
        assert batch['arr'].shape == (10, 2)
    finally:
        up.delete()
        kept.delete()


@pytest.mark.spark
def test_vectors_become_arrays_of_the_dtype(spark, cache_parent):
    ml_functions = pytest.importorskip('pyspark.ml.functions')
    df = spark.range(0, 12, 1, 1).select(
        'id', ml_functions.array_to_vector(F.array(F.col('id').cast('double'), F.lit(1.5))).alias('vec'))
    assert type(df.schema['vec'].dataType).__name__ == 'VectorUDT'
    as_float = make_spark_converter(df)
    as_double = make_spark_converter(df, dtype=None)
    try:
        with as_float.make_torch_dataloader(batch_size=12, num_epochs=1) as loader:
            batch = next(iter(loader))
        assert batch['vec'].dtype == torch.float32
        assert batch['vec'].shape == (12, 2)
        order = torch.argsort(batch['id'])
        np.testing.assert_array_equal(batch['vec'][order].numpy(),
                                      np.stack([np.arange(12), np.full(12, 1.5)], axis=1).astype(np.float32))
        schema = pq.read_schema(as_double.file_urls[0][len('file://'):])
        assert schema.field('vec').type.value_type == pa.float64()
    finally:
        as_float.delete()
        as_double.delete()


@pytest.mark.spark
def test_string_columns_use_the_row_collating_loader(spark, cache_parent):
    df = spark.range(0, 8, 1, 1).select('id', F.concat(F.lit('n'), F.col('id').cast('string')).alias('name'))
    converter = make_spark_converter(df)
    try:
        with converter.make_torch_dataloader(batch_size=8, num_epochs=1) as loader:
            batch = next(iter(loader))
        assert sorted(batch['name']) == [f'n{i}' for i in range(8)]
        with converter.make_torch_dataloader(batch_size=8, num_epochs=1, schema_fields=['id']) as loader:
            assert type(loader).__name__ == 'BatchedDataLoader'
    finally:
        converter.delete()


@pytest.mark.spark
def test_empty_dataframe_with_a_dotted_column_name(spark, cache_parent):
    converter = make_spark_converter(spark.range(0).select(F.col('id').cast('double').alias('a.b')))
    try:
        assert len(converter) == 0
        assert converter.file_urls
        assert pq.read_schema(converter.file_urls[0][len('file://'):]).field('a.b').type == pa.float32()
    finally:
        converter.delete()


# -------------------------------------------------------------------------------------------------------- errors

@pytest.mark.spark
def test_unset_parent_cache_dir_is_a_clear_error(spark):
    spark.conf.unset(CONF)
    with pytest.raises(ValueError, match='Please set the spark config petastorm.spark.converter.parentCacheDirUrl'):
        make_spark_converter(spark.range(3))


@pytest.mark.parametrize(('value', 'message'), [
    ('/tmp/cache', r"scheme-less.*'file:///tmp/cache'"),
    ('tmp/cache', r"scheme-less.*'file:///tmp/cache'"),
    ('file://otherhost/tmp/cache', 'names the host'),
    ('file:///', 'absolute directory'),
    ('   ', 'Please set the spark config'),
])
def test_invalid_parent_cache_dir_urls(value, message):
    with pytest.raises(ValueError, match=message):
        cache_dir.check_parent_cache_dir_url(value)


@pytest.mark.parametrize(('value', 'normalized'), [
    ('file:///tmp/cache/', 'file:///tmp/cache'),
    ('dbfs:/ml/cache', 'file:///dbfs/ml/cache'),
    ('dbfs:///ml/cache', 'file:///dbfs/ml/cache'),
    ('file:/dbfs/ml/cache', 'file:///dbfs/ml/cache'),
    ('file:///dbfs/ml/cache', 'file:///dbfs/ml/cache'),
    ('s3://bucket/cache', 's3://bucket/cache'),
    ('hdfs://namenode:8020/cache', 'hdfs://namenode:8020/cache'),
])
def test_valid_parent_cache_dir_urls(value, normalized):
    assert cache_dir.check_parent_cache_dir_url(value) == normalized


def test_local_cache_dir_on_a_cluster_warns(caplog):
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        cache_dir.warn_if_local_dir_on_cluster('file:///tmp/cache', 'yarn')
        cache_dir.warn_if_local_dir_on_cluster('file:///dbfs/cache', 'yarn')
        cache_dir.warn_if_local_dir_on_cluster('file:///tmp/cache', 'local[2]')
    assert len(caplog.records) == 1
    assert 'file:///tmp/cache' in caplog.text
    assert "'yarn'" in caplog.text


@pytest.mark.spark
@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'dtype': 'float16'}, r"^dtype float16 is not supported\. +Use 'float32' or float64"),
    ({'dtype': 'int32'}, 'is not supported'),
    ({'compression_codec': 'bzip2'}, "compression_codec 'bzip2' is not supported"),
    ({'parquet_row_group_size_bytes': 0}, 'positive integer'),
    ({'parquet_row_group_size_bytes': '32MB'}, 'positive integer'),
])
def test_invalid_arguments_are_refused_before_writing(spark, cache_parent, kwargs, message):
    with pytest.raises(ConverterOptionError, match=message) as raised:
        make_spark_converter(spark.range(3), **kwargs)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, RuntimeError)
    assert _subdirs(cache_parent) == []


@pytest.mark.spark
def test_failed_write_leaves_nothing_behind(spark, cache_parent):
    # assert_true's own type is void, which Spark 3.5 refuses to write before running: a long column of it fails
    # while the rows are written on every Spark.
    failing = spark.range(0, 10, 1, 1).select(
        F.coalesce(F.assert_true(F.col('id') < 5).cast('long'), F.col('id')).alias('checked'))
    with pytest.raises(Exception, match='id < 5'):
        make_spark_converter(failing)
    assert _subdirs(cache_parent) == []
    assert _entries_under(spark, cache_parent) == []
