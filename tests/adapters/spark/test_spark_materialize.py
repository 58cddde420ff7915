"""materialize_dataset around real Spark writes: Hadoop settings, metadata, row-group sizes, failures."""

import pathlib
import warnings

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

T = pytest.importorskip('pyspark.sql.types')

from petastorm import make_reader  # noqa: E402
from petastorm.codecs import NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.errors import PetastormMetadataGenerationError  # noqa: E402
from petastorm.etl.dataset_metadata import load_row_groups, materialize_dataset  # noqa: E402
from petastorm.store import keys  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row  # noqa: E402

Blobs = Unischema('Blobs', [
    UnischemaField('id', np.int32, (), ScalarCodec(T.IntegerType()), False),
    UnischemaField('blob', np.uint8, (None,), NdarrayCodec(), False),
])

SETTINGS = ('parquet.summary.metadata.level', 'parquet.summary.metadata.propagate-errors',
            'parquet.page.size.row.check.min', 'parquet.block.size.row.check.min',
            'parquet.row-group.size.row.check.min', 'parquet.block.size')


def blob_row(i, size=1024):
    # Random bytes do not compress, so row-group sizes on disk follow the requested size.
    return {'id': i, 'blob': np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8)}


def _write(spark, url, rows, size=1024, partitions=1):
    rdd = spark.sparkContext.parallelize(range(rows), partitions).map(lambda i: dict_to_spark_row(Blobs, blob_row(
        i, size)))
    spark.createDataFrame(rdd, Blobs.as_spark_schema()).write.mode('overwrite').parquet(url)


def _path(url):
    return pathlib.Path(url[len('file://'):])


@pytest.fixture
def url(tmp_path):
    return f'file://{tmp_path}/dataset'


@pytest.mark.spark
def test_written_dataset_has_metadata_and_reads_back(spark, url):
    with materialize_dataset(spark, url, Blobs):
        _write(spark, url, 10, partitions=2)
    root = _path(url)
    metadata = pq.read_metadata(root / '_common_metadata').metadata
    assert {keys.SCHEMA_JSON_KEY, keys.ROW_GROUPS_PER_FILE_KEY} <= set(metadata)
    assert not (root / '._common_metadata.crc').exists()
    assert not (root / '_metadata').exists()
    with make_reader(url, reader_pool_type='dummy') as reader:
        rows = {int(r.id): r for r in reader}
    assert sorted(rows) == list(range(10))
    for i, row in rows.items():
        np.testing.assert_array_equal(row.blob, blob_row(i)['blob'])


@pytest.mark.spark
def test_hadoop_and_session_settings_are_set_then_restored(spark, url):
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.set('parquet.block.size', '12345')
    before = {key: conf.get(key) for key in SETTINGS}
    timestamp_before = spark.conf.get('spark.sql.parquet.outputTimestampType', None)
    try:
        with materialize_dataset(spark, url, Blobs, row_group_size_mb=2):
            assert conf.get('parquet.block.size') == str(2 * 1024 * 1024)
            assert conf.get('parquet.summary.metadata.level') == 'NONE'
            assert conf.get('parquet.block.size.row.check.min') == '3'
            assert spark.conf.get('spark.sql.parquet.outputTimestampType') == 'TIMESTAMP_MICROS'
            _write(spark, url, 2)
        assert {key: conf.get(key) for key in SETTINGS} == before
        assert spark.conf.get('spark.sql.parquet.outputTimestampType', None) == timestamp_before
    finally:
        conf.unset('parquet.block.size')


@pytest.mark.spark
def test_failing_body_restores_settings_and_writes_no_metadata(spark, url):
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    before = {key: conf.get(key) for key in SETTINGS}

    def write_then_fail():
        with materialize_dataset(spark, url, Blobs, row_group_size_mb=1):
            _write(spark, url, 2)
            raise RuntimeError('boom')

    with pytest.raises(RuntimeError, match='boom'):
        write_then_fail()
    assert {key: conf.get(key) for key in SETTINGS} == before
    assert not (_path(url) / '_common_metadata').exists()


@pytest.mark.spark
def test_row_group_size_mb_controls_row_groups(spark, url):
    # 40 rows of 100 KB in one file with 1 MB row groups: several row groups, all listed in the metadata.
    with materialize_dataset(spark, url, Blobs, row_group_size_mb=1):
        _write(spark, url, 40, size=100 * 1024)
    files = sorted(_path(url).glob('*.parquet'))
    assert len(files) == 1
    footer = pq.read_metadata(files[0])
    assert footer.num_row_groups >= 3
    assert all(footer.row_group(i).total_byte_size < 2 * 1024 * 1024 for i in range(footer.num_row_groups))
    pieces = load_row_groups(url)
    assert [p.num_rows for p in pieces] == [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]


@pytest.mark.spark
def test_summary_metadata_is_written_and_used(spark, url):
    with materialize_dataset(spark, url, Blobs, use_summary_metadata=True):
        _write(spark, url, 6, partitions=2)
    root = _path(url)
    assert (root / '_metadata').exists()
    assert not (root / '._common_metadata.crc').exists()
    with make_reader(url, reader_pool_type='dummy') as reader:
        assert sorted(int(r.id) for r in reader) == list(range(6))


@pytest.mark.spark
def test_body_that_writes_nothing_is_a_generation_error(spark, url, tmp_path):
    with pytest.raises(PetastormMetadataGenerationError, match='does not exist'), \
            materialize_dataset(spark, url, Blobs):
        pass
    (tmp_path / 'dataset').mkdir()
    with pytest.raises(PetastormMetadataGenerationError, match='no Parquet data files'), \
            materialize_dataset(spark, url, Blobs):
        pass


@pytest.mark.spark
def test_filesystem_factory_provides_the_filesystem(spark, url):
    calls = []

    def factory():
        calls.append(1)
        return pafs.LocalFileSystem()

    with materialize_dataset(spark, url, Blobs, filesystem_factory=factory):
        _write(spark, url, 3)
    assert calls == [1]
    assert sum(p.num_rows for p in load_row_groups(url)) == 3


def test_not_a_spark_session_is_a_type_error(url):
    with pytest.raises(TypeError, match='SparkSession'), materialize_dataset(object(), url, Blobs):
        pass


def test_bad_arguments_fail_before_any_work(url):
    with pytest.raises(ValueError, match='row_group_size_mb'), materialize_dataset(object(), url, Blobs, -1):
        pass
    with pytest.raises(ValueError, match='scheme-less'), materialize_dataset(object(), 'no/scheme', Blobs):
        pass
    with pytest.raises(TypeError, match='Unischema'), materialize_dataset(object(), url, {'id': 1}):
        pass


def test_workers_python_without_petastorm_is_said_before_any_job(spark, url, tmp_path, monkeypatch):
    import os
    import sys

    # A Python like a system one outside the virtual environment: no site-packages, so no petastorm.
    bare = tmp_path / 'python3'
    bare.write_text(f'#!/bin/sh\nexec {sys.base_prefix}/bin/python3 -I -S "$@"\n')
    bare.chmod(0o755)
    monkeypatch.setattr(spark.sparkContext, 'pythonExec', str(bare))
    with pytest.warns(UserWarning, match=rf"Spark's workers run '{bare}' .*cannot import petastorm.*"
                                         rf'PYSPARK_PYTHON={sys.executable}'), \
            pytest.raises(RuntimeError, match='stop here'), materialize_dataset(spark, url, Blobs):
        raise RuntimeError('stop here')
    monkeypatch.setattr(spark.sparkContext, 'pythonExec', os.path.realpath(sys.executable))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with pytest.raises(RuntimeError, match='stop here'), materialize_dataset(spark, url, Blobs):
            raise RuntimeError('stop here')
