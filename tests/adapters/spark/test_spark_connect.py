"""The Spark surface through a real Spark Connect session: the converter and its loaders, materialize_dataset,
Unischema's Spark schema and rows, the metadata and copy tools, progress, the errors of what needs a classic
session, and TorchDistributor training from a converter.

One Connect server (tests/support/spark_connect_server.py) serves the whole module; a server that cannot start
fails the tests with its log, and a missing client package (the connect extra, in the test extra) fails them too:
neither is skipped.
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

T = pytest.importorskip('pyspark.sql.types')

from petastorm import make_reader  # noqa: E402
from petastorm._progress import SparkJobProgress  # noqa: E402
from petastorm.codecs import NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url, materialize_dataset  # noqa: E402
from petastorm.etl.petastorm_generate_metadata import generate_petastorm_metadata  # noqa: E402
from petastorm.spark import SparkDatasetConverter, cache_dir, make_spark_converter, session  # noqa: E402
from petastorm.spark_utils import dataset_as_rdd  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row  # noqa: E402
from support.spark_connect_server import running_connect_server  # noqa: E402

pytestmark = pytest.mark.spark

BIN = pathlib.Path(sys.executable).parent

Readings = Unischema('Readings', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('values', np.float32, (64,), NdarrayCodec(), False),
])


def reading(i):
    return {'id': i, 'name': f'r{i}', 'values': np.full(64, i, np.float32)}


@pytest.fixture(scope='module')
def connect_url(tmp_path_factory, spark_jvm_options):
    with running_connect_server(tmp_path_factory.mktemp('connect-server'), spark_jvm_options) as server:
        yield server.url
        server_process = server.process
    assert server_process.poll() is not None, 'the Connect server outlived its fixture'


@pytest.fixture(scope='module')
def connect(connect_url):
    """A Spark Connect client session; the process's Connect mode switches are put back afterwards."""
    # Train functions and row builders of the test modules travel by value: the server cannot import them.
    import test_torch_distributor
    from pyspark import cloudpickle
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    for module in (sys.modules[__name__], test_torch_distributor):
        cloudpickle.register_pickle_by_value(module)
    saved = {key: os.environ.get(key) for key in ('SPARK_CONNECT_MODE_ENABLED', 'SPARK_REMOTE')}
    # The Connect builder itself: pyspark's generic builder refuses a remote session while the classic session of
    # the other Spark tests runs in this process. The switch makes pyspark.sql.functions build Connect columns.
    os.environ['SPARK_CONNECT_MODE_ENABLED'] = '1'
    client = ConnectSession.builder.remote(connect_url).getOrCreate()
    try:
        yield client
    finally:
        client.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def cache_url(connect, tmp_path):
    url = f'file://{tmp_path}/cache'
    connect.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, url)
    yield url
    connect.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


def _write_readings(connect, url, rows, materialize=None):
    """Rows built here with dict_to_spark_row, sent to the server by createDataFrame, written as one file."""
    frame = connect.createDataFrame([dict_to_spark_row(Readings, reading(i)) for i in range(rows)],
                                    Readings.as_spark_schema())
    if materialize is None:
        frame.coalesce(1).write.mode('overwrite').parquet(url)
        return
    with materialize_dataset(connect, url, Readings, **materialize):
        frame.coalesce(1).write.mode('overwrite').parquet(url)


def _footers(path):
    return [pq.ParquetFile(f).metadata for f in sorted(pathlib.Path(path).glob('*.parquet'))]


def test_the_session_is_read_through_its_conf(connect):
    assert session.is_connect_session(connect)
    assert session.spark_master(connect) == 'local[2]'
    assert session.application_id(connect).startswith('local-')
    assert session.connect_server_host(connect) == '127.0.0.1'
    assert session.remote_connect_host(connect) is None  # loopback: the server writes where we read


def test_local_cache_dir_warns_when_the_connect_server_is_elsewhere(caplog):
    with caplog.at_level(logging.WARNING, logger='petastorm.spark.cache_dir'):
        cache_dir.warn_if_local_dir_on_cluster('file:///Volumes/main/default/cache', 'local[*]', 'spark.example')
        cache_dir.warn_if_local_dir_on_cluster('file:///dbfs/cache', 'local[*]', 'spark.example')
        cache_dir.warn_if_local_dir_on_cluster('file:///tmp/cache', 'local[*]', None)
        assert caplog.records == []
        cache_dir.warn_if_local_dir_on_cluster('file:///tmp/cache', 'local[*]', 'spark.example')
    assert "server 'spark.example'" in caplog.text
    assert cache_dir.normalize_dbfs_url('dbfs:/Volumes/main/default/v') == 'file:///Volumes/main/default/v'
    assert cache_dir.normalize_dbfs_url('dbfs:/tmp/x') == 'file:///dbfs/tmp/x'


@pytest.mark.torch
@pytest.mark.tf
def test_converter_and_its_loaders(connect, cache_url, caplog):
    frame = connect.range(0, 300, 1, 3).selectExpr('id', 'CAST(id AS DOUBLE) / 2 AS x', 'array(id, id + 1) AS pair')
    with caplog.at_level(logging.WARNING, logger='petastorm.spark.cache_dir'):
        converter = make_spark_converter(frame)
    assert not [r for r in caplog.records if 'local directory' in r.getMessage()]
    assert f'appid-{session.application_id(connect)}-' in converter.cache_dir_url
    assert converter.cache_dir_url.startswith(cache_url)
    assert len(converter) == 300
    # The cache key: an equal plan built again reuses the copy, another plan does not.
    again = connect.range(0, 300, 1, 3).selectExpr('id', 'CAST(id AS DOUBLE) / 2 AS x', 'array(id, id + 1) AS pair')
    assert make_spark_converter(again).cache_dir_url == converter.cache_dir_url
    other = make_spark_converter(connect.range(0, 10).selectExpr('id', 'CAST(id AS DOUBLE) AS x'))
    assert other.cache_dir_url != converter.cache_dir_url

    with converter.make_torch_dataloader(batch_size=64, num_epochs=1) as loader:
        batches = list(loader)
    ids = np.concatenate([b['id'].numpy() for b in batches])
    assert sorted(ids) == list(range(300))
    assert str(batches[0]['x'].dtype) == 'torch.float32'  # doubles became float32
    np.testing.assert_array_equal(batches[0]['pair'][:, 1].numpy(), batches[0]['id'].numpy() + 1)

    with converter.make_tf_dataset(batch_size=100, num_epochs=1) as dataset:
        tf_ids = np.concatenate([batch.id.numpy() for batch in dataset])
    assert sorted(tf_ids) == list(range(300))

    converter.delete()
    other.delete()
    assert not pathlib.Path(converter.cache_dir_url[len('file://'):]).exists()
    assert list(pathlib.Path(cache_url[len('file://'):]).iterdir()) == []
    with pytest.raises(RuntimeError, match='was deleted'):
        converter.make_torch_dataloader()
    rewritten = make_spark_converter(again)
    assert rewritten.cache_dir_url != converter.cache_dir_url
    rewritten.delete()


@pytest.mark.torch
def test_a_nested_dataframe_reaches_the_torch_loaders(connect, cache_url):
    import functools

    from petastorm.pytorch import BatchedDataLoader

    frame = connect.range(0, 50, 1, 2).selectExpr(
        'id', 'IF(id % 5 = 0, NULL, CAST(id AS INT)) AS n', 'slice(sequence(CAST(0 AS BIGINT), id % 4), 1, '
        'CAST(id % 4 AS INT)) AS ids', "named_struct('a', id, 'b', array(id, id)) AS st",
        'IF(id % 6 = 0, NULL, map(id % 3, id)) AS m')
    converter = make_spark_converter(frame)
    loader_fn = functools.partial(BatchedDataLoader, variable_length='jagged', nulls='mask')
    try:
        with converter.make_torch_dataloader(batch_size=16, num_epochs=1, data_loader_fn=loader_fn) as loader:
            batches = list(loader)
    finally:
        converter.delete()
    seen = {}
    for batch in batches:
        ids = batch['ids']
        for k, key in enumerate(batch['id'].tolist()):
            seen[key] = (batch['n_valid'][k].item() and batch['n'][k].item(),
                         ids.values[ids.offsets[k]:ids.offsets[k + 1]].tolist(), batch['st']['a'][k].item(),
                         batch['m_valid'][k].item())
    assert sorted(seen) == list(range(50))
    for key, (n, ids, a, has_map) in seen.items():
        assert n == (False if key % 5 == 0 else key)
        assert ids == list(range(key % 4))
        assert a == key
        assert has_map == (key % 6 != 0)


def test_materialize_dataset_honours_the_row_group_size(connect, tmp_path):
    url = f'file://{tmp_path}/readings'
    _write_readings(connect, url, 4000, {'row_group_size_mb': 0.25, 'use_summary_metadata': True})
    (footer,) = _footers(tmp_path / 'readings')
    sizes = [footer.row_group(i).total_byte_size for i in range(footer.num_row_groups)]
    assert footer.num_rows == 4000
    assert footer.num_row_groups >= 5  # ~1.5 MB of rows in 0.25 MB row groups
    assert max(sizes[:-1]) < 2 * 0.25 * 2 ** 20
    assert (tmp_path / 'readings' / '_metadata').exists()  # summary files were asked for
    # The settings were session confs for the write only.
    assert connect.conf.get('parquet.block.size', None) is None
    assert connect.conf.get('parquet.summary.metadata.level', None) is None

    assert get_schema_from_dataset_url(url).fields.keys() == Readings.fields.keys()
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert [r.id for r in rows] == list(range(4000))
    np.testing.assert_array_equal(rows[7].values, np.full(64, 7, np.float32))
    assert rows[7].name == 'r7'

    plain = tmp_path / 'plain'
    _write_readings(connect, f'file://{plain}', 4000)
    assert _footers(plain)[0].num_row_groups == 1  # the same write without materialize_dataset


def test_generate_metadata_and_copy_dataset_through_connect(connect, connect_url, tmp_path):
    url = f'file://{tmp_path}/source'
    _write_readings(connect, url, 200)  # plain Parquet: no Petastorm metadata yet
    generate_petastorm_metadata(connect, url, unischema_class=f'{__name__}.Readings')
    assert get_schema_from_dataset_url(url).fields.keys() == Readings.fields.keys()

    target = f'file://{tmp_path}/target'
    environment = {key: value for key, value in os.environ.items()
                   if key not in ('SPARK_CONNECT_MODE_ENABLED', 'SPARK_REMOTE')}
    result = subprocess.run([str(BIN / 'petastorm-copy-dataset.py'), url, target, '--remote', connect_url,
                             '--field-regex', 'id', 'values', '--row-group-size-mb', '0.01'],
                            capture_output=True, text=True, timeout=240, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(get_schema_from_dataset_url(target).fields) == ['id', 'values']
    assert sum(f.num_row_groups for f in _footers(tmp_path / 'target')) > 1
    with make_reader(target, reader_pool_type='dummy') as reader:
        assert sorted(r.id for r in reader) == list(range(200))


def test_what_needs_a_classic_session_says_so(connect, tmp_path):
    url = f'file://{tmp_path}/readings'
    _write_readings(connect, url, 10, {})
    with pytest.raises(TypeError, match=r'dataset_as_rdd needs a classic SparkSession.*make_reader'):
        dataset_as_rdd(url, connect)


def test_spark_job_progress_follows_connect_operations(connect):
    with SparkJobProgress(connect, 'summing', True) as progress:
        assert connect.range(0, 40_000_000, 1, 4).selectExpr('sum(hash(id))').collect()
        meter = progress._meter
        assert meter is not None
        assert meter.total  # the tasks of the job, reported by the server
        assert meter.done == meter.total
    assert progress._connect_session is None  # the handler was removed


@pytest.mark.torch
def test_torch_distributor_trains_from_a_converter_in_equal_shares(connect, cache_url):
    from test_torch_distributor import (
        TOTAL_ROWS,
        check_equal_shares,
        run_distributed,
        train_on_converter,
        uneven_dataframe,
    )

    converter = make_spark_converter(uneven_dataframe(connect))
    assert len(converter.file_urls) == 3  # uneven files: 640, 260 and 100 rows
    gathered = run_distributed(train_on_converter, converter)
    steps = check_equal_shares(gathered, TOTAL_ROWS)
    assert steps == {0: 8, 1: 8}  # ceil(500 / 64) per rank in both epochs
    converter.delete()
    assert list(pathlib.Path(cache_url[len('file://'):]).iterdir()) == []
