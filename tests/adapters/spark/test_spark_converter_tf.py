"""SparkDatasetConverter.make_tf_dataset: every row, batch sizes, epochs, shuffling, shards, defaults, clean exit."""

import collections
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's C++ start-up chatter, not test output
tf = pytest.importorskip('tensorflow')

from petastorm.spark import SparkDatasetConverter, make_spark_converter  # noqa: E402

pytestmark = pytest.mark.tf

ROWS = 40


@pytest.fixture
def converter(tmp_path):
    """A converter over a Parquet store of ROWS rows in two files (no Spark job needed)."""
    directory = tmp_path / 'plain'
    directory.mkdir()
    half = ROWS // 2
    for k in range(2):
        ids = np.arange(k * half, (k + 1) * half, dtype=np.int64)
        table = pa.table({'id': ids, 'x': ids.astype(np.float32) / 2, 'vec': [[float(i), -1.0] for i in ids]})
        pq.write_table(table, directory / f'part-{k}.parquet', row_group_size=8)
    return make_spark_converter(f'file://{directory}')


def _batches(dataset, limit=1000):
    return [batch for batch, _ in zip(dataset, range(limit), strict=False)]


def _ids(batches):
    return [int(i) for batch in batches for i in batch.id.numpy()]


def test_one_epoch_yields_every_row_once_in_batches_of_the_size(converter):
    with converter.make_tf_dataset(batch_size=7, num_epochs=1) as dataset:
        assert dataset.element_spec.id.shape.as_list() == [None]
        assert dataset.element_spec.vec.shape.as_list() == [None, None]
        assert (dataset.element_spec.x.dtype, dataset.element_spec.vec.dtype) == (tf.float32, tf.float64)
        batches = _batches(dataset)
    assert [len(b.id) for b in batches] == [7] * 5 + [5]
    assert sorted(_ids(batches)) == list(range(ROWS))
    for batch in batches:
        np.testing.assert_allclose(batch.x.numpy(), batch.id.numpy() / 2)
        np.testing.assert_array_equal(batch.vec.numpy()[:, 0], batch.id.numpy())


def test_defaults_batch_32_forever(converter):
    with converter.make_tf_dataset() as dataset:
        batches = _batches(dataset, limit=5)  # num_epochs=None: more batches than one pass holds
    assert [len(b.id) for b in batches] == [32] * 5
    counts = collections.Counter(_ids(batches))
    assert set(counts) == set(range(ROWS))
    assert min(counts.values()) >= 3


def test_epochs_and_shuffling_keep_every_row(converter):
    with converter.make_tf_dataset(batch_size=10, num_epochs=2) as dataset:
        ids = _ids(_batches(dataset))
    assert collections.Counter(ids) == dict.fromkeys(range(ROWS), 2)
    with converter.make_tf_dataset(batch_size=10, num_epochs=1, shuffling_queue_capacity=30, prefetch=2,
                                   workers_count=1, seed=5) as dataset:
        shuffled = _ids(_batches(dataset))
    assert sorted(shuffled) == list(range(ROWS))
    assert shuffled != sorted(shuffled)


def test_reader_kwargs_reach_the_reader(converter):
    shards = []
    for shard in range(2):
        with converter.make_tf_dataset(batch_size=8, num_epochs=1, cur_shard=shard, shard_count=2) as dataset:
            shards.append(_ids(_batches(dataset)))
    assert shards[0]
    assert shards[1]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(ROWS))
    with pytest.raises(TypeError, match='no_such_option'), converter.make_tf_dataset(no_such_option=1):
        pass


def test_leaving_the_block_stops_the_reader(converter):
    with converter.make_tf_dataset(batch_size=4, num_epochs=None) as dataset:
        iterator = iter(dataset)
        next(iterator)

    def drain():
        for _ in range(100):  # batches already prefetched may still arrive; then the dataset ends quietly
            next(iterator)

    with pytest.raises(StopIteration):
        drain()


def _graph_mode_batches(converter, limit=1000, **kwargs):
    """Every batch of ``converter.make_tf_dataset(**kwargs)``, read by TF1 code in a graph-mode session."""
    with tf.Graph().as_default(), converter.make_tf_dataset(**kwargs) as dataset:
        next_batch = dataset.make_one_shot_iterator().get_next()
        got = []
        with tf.compat.v1.Session() as session:
            try:
                while len(got) < limit:
                    got.append(session.run(next_batch))
            except tf.errors.OutOfRangeError:
                return got
    raise AssertionError(f'the dataset did not end after {limit} batches')


def test_tf1_session_reads_the_same_batches_as_eager_code(converter):
    graph_batches = _graph_mode_batches(converter, batch_size=7, num_epochs=1, workers_count=1)
    with converter.make_tf_dataset(batch_size=7, num_epochs=1, workers_count=1) as dataset:
        assert callable(dataset.make_one_shot_iterator)
        eager_batches = [{name: value.numpy() for name, value in batch._asdict().items()} for batch in dataset]
    assert [len(b.id) for b in graph_batches] == [len(b['id']) for b in eager_batches] == [7] * 5 + [5]
    graph_ids = [int(i) for b in graph_batches for i in b.id]
    eager_ids = [int(i) for b in eager_batches for i in b['id']]
    assert sorted(graph_ids) == sorted(eager_ids) == list(range(ROWS))
    for batch in graph_batches:
        assert (batch.id.dtype, batch.x.dtype, batch.vec.dtype) == (np.int64, np.float32, np.float64)
        np.testing.assert_allclose(batch.x, batch.id / 2)
        np.testing.assert_array_equal(batch.vec, np.stack([batch.id, -np.ones(len(batch.id))], axis=1))


def test_tf1_session_over_an_endless_shuffled_dataset(converter):
    with tf.Graph().as_default(), converter.make_tf_dataset(batch_size=16, shuffling_queue_capacity=20) as dataset:
        next_batch = dataset.make_one_shot_iterator().get_next()
        with tf.compat.v1.Session() as session:
            batches = [session.run(next_batch) for _ in range(6)]
    assert [len(b.id) for b in batches] == [16] * 6  # num_epochs=None: it goes on past one pass
    ids = [int(i) for b in batches for i in b.id]
    assert set(ids) <= set(range(ROWS))
    assert max(collections.Counter(ids).values()) > 1  # some row came a second time: a later pass began


@pytest.mark.spark
@pytest.mark.slow  # Spark jobs write and count the DataFrame
def test_dataframe_to_keras_training(spark, tmp_path):
    keras = pytest.importorskip('keras')
    from pyspark.sql import functions as F  # noqa: N812

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f'file://{tmp_path}/cache')
    try:
        df = spark.range(0, 300, 1, 2).select(
            (F.col('id') % 10).cast('double').alias('x'), ((F.col('id') % 10) * 2 + 1).cast('double').alias('y'))
        converter = make_spark_converter(df)
        with converter.make_tf_dataset(batch_size=25, num_epochs=1) as dataset:
            assert dataset.element_spec.x.dtype == tf.float32  # the converter's default dtype
            rows = sum(len(b.x) for b in dataset)
        assert rows == len(converter) == 300
        with converter.make_tf_dataset(batch_size=30) as dataset:
            pairs = dataset.map(lambda batch: (tf.reshape(batch.x, (-1, 1)), batch.y))
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss='mse')
            history = model.fit(pairs, steps_per_epoch=10, epochs=3, shuffle=False, verbose=0)
        assert history.history['loss'][-1] < history.history['loss'][0]
        converter.delete()
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
