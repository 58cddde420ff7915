"""Datasets written with Spark (materialize_dataset) and without it (write_dataset) are interchangeable."""

import datetime
import decimal

import numpy as np
import pyarrow.parquet as pq
import pytest

T = pytest.importorskip('pyspark.sql.types')

from petastorm import make_batch_reader, make_reader, write_dataset  # noqa: E402
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url, materialize_dataset  # noqa: E402
from petastorm.spark_utils import dataset_as_rdd  # noqa: E402
from petastorm.store import keys  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row, encode_row  # noqa: E402

pytestmark = pytest.mark.spark

AllTypes = Unischema('AllTypes', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('int8', np.int8, (), ScalarCodec(T.ByteType()), False),
    UnischemaField('int16', np.int16, (), ScalarCodec(T.ShortType()), False),
    UnischemaField('uint8', np.uint8, (), ScalarCodec(T.ShortType()), False),
    UnischemaField('int32', np.int32, (), ScalarCodec(T.IntegerType()), False),
    UnischemaField('float32', np.float32, (), ScalarCodec(T.FloatType()), False),
    UnischemaField('float64', np.float64, (), ScalarCodec(T.DoubleType()), False),
    UnischemaField('bool', np.bool_, (), ScalarCodec(T.BooleanType()), False),
    UnischemaField('string', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('decimal', decimal.Decimal, (), ScalarCodec(T.DecimalType(10, 9)), False),
    UnischemaField('timestamp', np.datetime64, (), ScalarCodec(T.TimestampType()), False),
    UnischemaField('nullable_int', np.int32, (), ScalarCodec(T.IntegerType()), True),
    UnischemaField('plain_uint16', np.uint16, (), None, False),
    UnischemaField('plain_float', np.float32, (), None, True),
    UnischemaField('plain_string', np.str_, (), None, False),
    UnischemaField('plain_local_time', np.datetime64, (), None, False),
    UnischemaField('image_png', np.uint8, (8, 6, 3), CompressedImageCodec('png'), False),
    UnischemaField('image_gray_png', np.uint8, (8, 6), CompressedImageCodec('png'), False),
    UnischemaField('image_uint16_png', np.uint16, (8, 6), CompressedImageCodec('png'), False),
    UnischemaField('image_jpeg', np.uint8, (8, 6, 3), CompressedImageCodec('jpeg', 90), False),
    UnischemaField('ndarray_float32', np.float32, (2, 3), NdarrayCodec(), False),
    UnischemaField('ndarray_var', np.uint8, (None, 4), NdarrayCodec(), False),
    UnischemaField('ndarray_string', np.str_, (None,), NdarrayCodec(), False),
    UnischemaField('compressed_ndarray', np.int32, (3, 3), CompressedNdarrayCodec(), False),
    UnischemaField('nullable_ndarray', np.float64, (4,), NdarrayCodec(), True),
])
ROWS = 20


def all_types_row(i):
    """One deterministic row; every value type a user hands to dict_to_spark_row or write_dataset."""
    rng = np.random.default_rng(i)
    return {
        'id': i, 'int8': np.int8(-i), 'int16': np.int16(300 * i), 'uint8': np.uint8(250 - i), 'int32': i * 100_000,
        'float32': np.float32(i / 3), 'float64': i / 7, 'bool': i % 2 == 0, 'string': f'zürich-{i}',
        'decimal': decimal.Decimal(f'{i % 10}.123456789'),
        'timestamp': np.datetime64('2021-01-11T10:00:00.000007') + np.timedelta64(i, 'h'),
        'nullable_int': None if i % 3 == 0 else i,
        'plain_uint16': np.uint16(60_000 + i), 'plain_float': None if i % 4 == 0 else np.float32(i),
        'plain_string': 'x' * i,
        'plain_local_time': np.datetime64('1999-12-31T23:59:59.5') + np.timedelta64(i, 's'),
        'image_png': rng.integers(0, 255, (8, 6, 3), dtype=np.uint8),
        'image_gray_png': rng.integers(0, 255, (8, 6), dtype=np.uint8),
        'image_uint16_png': rng.integers(0, 65535, (8, 6), dtype=np.uint16),
        'image_jpeg': (np.add.outer(np.arange(8) * 8, np.arange(6) * 8)[..., None] + [0, 40, 80] + i).astype(
            np.uint8),  # smooth, as photos are: JPEG keeps it close
        'ndarray_float32': rng.random((2, 3), dtype=np.float32),
        'ndarray_var': rng.integers(0, 255, (i % 4, 4), dtype=np.uint8),
        'ndarray_string': np.array([f's{j}' for j in range(i % 3)], dtype=np.str_),
        'compressed_ndarray': rng.integers(-5, 5, (3, 3), dtype=np.int32),
        'nullable_ndarray': None if i % 2 else rng.random(4),
    }


def _spark_write(spark, url, rows=ROWS):
    with materialize_dataset(spark, url, AllTypes, row_group_size_mb=1):
        rdd = spark.sparkContext.parallelize(range(rows), 2).map(all_types_row) \
            .map(lambda row: dict_to_spark_row(AllTypes, row))
        spark.createDataFrame(rdd, AllTypes.as_spark_schema()).write.mode('overwrite').parquet(url)


@pytest.fixture(scope='module')
def both_urls(spark, tmp_path_factory):
    """The same rows written once with Spark and once with write_dataset."""
    root = tmp_path_factory.mktemp('interop')
    spark_url, local_url = f'file://{root}/spark', f'file://{root}/local'
    _spark_write(spark, spark_url)
    write_dataset(local_url, AllTypes, (all_types_row(i) for i in range(ROWS)), row_group_size_mb=1)
    return spark_url, local_url


def _read_rows(url):
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        return sorted(reader, key=lambda r: int(r.id))


def _assert_same_value(name, left, right):
    if right is None:
        assert left is None, name
    elif isinstance(right, np.ndarray):
        assert isinstance(left, np.ndarray), name
        assert (left.dtype, left.shape) == (right.dtype, right.shape), name
        np.testing.assert_array_equal(left, right, err_msg=name)
    else:
        assert type(left) is type(right), (name, type(left), type(right))
        if isinstance(right, np.datetime64):
            assert left.dtype == right.dtype, name
        assert left == right, (name, left, right)


def test_spark_and_local_writes_read_back_identically(both_urls):
    spark_rows, local_rows = (_read_rows(url) for url in both_urls)
    assert len(spark_rows) == len(local_rows) == ROWS
    for spark_row, local_row in zip(spark_rows, local_rows, strict=True):
        for name in AllTypes.fields:
            _assert_same_value(name, getattr(spark_row, name), getattr(local_row, name))


def test_spark_write_reads_back_the_values_written(both_urls):
    for row in _read_rows(both_urls[0]):
        expected = all_types_row(int(row.id))
        for name, field in AllTypes.fields.items():
            value, wanted = getattr(row, name), expected[name]
            if wanted is None:
                assert value is None, name
            elif name == 'image_jpeg':
                assert np.abs(value.astype(int) - wanted.astype(int)).mean() < 8  # lossy
            elif isinstance(wanted, np.ndarray):
                np.testing.assert_array_equal(value, wanted, err_msg=name)
            else:
                assert value == wanted, name
                assert isinstance(value, field.numpy_dtype), name


def test_timestamps_are_stored_as_microseconds_not_int96(both_urls):
    spark_url, _ = both_urls
    schema = pq.read_schema(pq.ParquetDataset(spark_url[len('file://'):]).files[0])
    assert str(schema.field('timestamp').type) == 'timestamp[us, tz=UTC]'
    assert str(schema.field('plain_local_time').type) == 'timestamp[us]'


def test_both_stores_carry_the_same_schema_and_petastorm_keys(both_urls):
    for url in both_urls:
        assert get_schema_from_dataset_url(url) == AllTypes
        metadata = pq.read_metadata(url[len('file://'):] + '/_common_metadata').metadata
        assert {keys.SCHEMA_JSON_KEY, keys.ROW_GROUPS_PER_FILE_KEY} <= set(metadata)


def test_spark_and_local_cells_are_equal():
    for i in range(ROWS):
        row = all_types_row(i)
        assert dict_to_spark_row(AllTypes, row).asDict() == encode_row(AllTypes, row)


def test_batch_reader_decodes_both_stores_alike(both_urls):
    def columns(url):
        with make_batch_reader(url, reader_pool_type='dummy', shuffle_row_groups=False,
                               schema_fields=['id', 'int32', 'string', 'ndarray_float32']) as reader:
            batches = list(reader)
        ids = np.concatenate([b.id for b in batches])
        order = np.argsort(ids)
        return {name: np.concatenate([getattr(b, name) for b in batches])[order]
                for name in ('id', 'int32', 'string', 'ndarray_float32')}

    spark_columns = columns(both_urls[0])
    local_columns = columns(both_urls[1])
    for name, values in spark_columns.items():
        np.testing.assert_array_equal(values, local_columns[name], err_msg=name)


def test_spark_reads_the_local_store_like_its_own(spark, both_urls):
    spark_rows, local_rows = ({r.id: r for r in dataset_as_rdd(url, spark).collect()} for url in both_urls)
    assert sorted(spark_rows) == list(range(ROWS))
    for i in range(ROWS):
        for name in AllTypes.fields:
            _assert_same_value(name, getattr(spark_rows[i], name), getattr(local_rows[i], name))
    assert isinstance(spark_rows[0].timestamp, np.datetime64)
    assert spark_rows[0].timestamp == np.datetime64(datetime.datetime(2021, 1, 11, 10, 0, 0, 7))
