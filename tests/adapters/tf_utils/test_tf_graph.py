"""petastorm.tf_utils in TF1 graph mode (tf_tensors, sessions), Keras training, and weighted sampling of readers."""

import importlib.util
import os
import pathlib
import time
import warnings

import numpy as np
import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's C++ start-up chatter, not test output
tf = pytest.importorskip('tensorflow')

from petastorm import make_reader, write_dataset  # noqa: E402
from petastorm.tf_utils import (  # noqa: E402
    RANDOM_SHUFFLING_QUEUE_SIZE,
    make_petastorm_dataset,
    tf_tensors,
)
from support.tf_datasets import (  # noqa: E402
    ROWS,
    assert_value,
    batch_reader,
    expected_typed,
    row_reader,
    seq_ngram,
)

pytestmark = [pytest.mark.tf,
              pytest.mark.filterwarnings('ignore:Tensorflow will convert all unicode strings:UnicodeWarning'),
              pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')]


# -- tf_tensors (TF1 graph mode) --------------------------------------------------------------------------------


def _run_until_exhausted(tensors, start_queue_runners=False, limit=1000):
    got = []
    with tf.compat.v1.Session() as session:
        coordinator = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(session, coordinator) if start_queue_runners else []
        try:
            for _ in range(limit):
                got.append(session.run(tensors))
        except tf.errors.OutOfRangeError:
            pass
        finally:
            coordinator.request_stop()
            coordinator.join(threads)
    return got


def test_tf_tensors_row_reader_in_graph_mode(typed_url):
    with row_reader(typed_url, schema_fields=['i64', 'u16', 'price', 'matrix', 'seq']) as reader, \
            tf.Graph().as_default():
        tensors = tf_tensors(reader)
        assert (tensors.matrix.shape.as_list(), tensors.seq.shape.as_list()) == ([2, 3], [None])
        assert (tensors.u16.dtype, tensors.price.dtype) == (tf.int32, tf.string)
        rows = _run_until_exhausted(tensors)
    assert [r.i64 for r in rows] == [-(2 ** 40) * i for i in range(ROWS)]
    assert (rows[3].price, rows[3].seq.tolist()) == (b'3.5', [0])


def test_tf_tensors_shuffling_queue_delivers_every_row_in_another_order(typed_url):
    with row_reader(typed_url, schema_fields=['i32']) as reader, tf.Graph().as_default() as graph:
        tensors = tf_tensors(reader, shuffling_queue_capacity=20, min_after_dequeue=10)
        graph.get_operation_by_name(RANDOM_SHUFFLING_QUEUE_SIZE)  # diagnostics find the queue size by name
        rows = _run_until_exhausted(tensors, start_queue_runners=True)
    ids = [r.i32 for r in rows]
    assert sorted(ids) == sorted(-70000 * i for i in range(ROWS))
    assert ids != sorted(ids, reverse=True)


def test_tf_tensors_batch_reader_and_its_limits(typed_url):
    with batch_reader(typed_url, schema_fields=['i8', 'matrix']) as reader:
        with pytest.raises(RuntimeError, match='executing eagerly'):
            tf_tensors(reader)
        with tf.Graph().as_default():
            with pytest.raises(ValueError, match='shuffling_queue_capacity=5 can not be used'):
                tf_tensors(reader, shuffling_queue_capacity=5)
            tensors = tf_tensors(reader)
            assert tensors.matrix.shape.as_list() == [None, 2, 3]
            batches = _run_until_exhausted(tensors)
    assert np.concatenate([b.i8 for b in batches]).tolist() == [-i for i in range(ROWS)]


def test_tf_tensors_ngram(seq_url):
    with row_reader(seq_url, schema_fields=seq_ngram()) as reader, tf.Graph().as_default():
        tensors = tf_tensors(reader)
        assert (set(tensors), tensors[0].pos.shape.as_list()) == ({0, 1}, [2])
        windows = _run_until_exhausted(tensors)
    assert len(windows) > 10
    assert all(w[1].ts == w[0].ts + 1 for w in windows)


# -- Keras trains on our datasets -------------------------------------------------------------------------------


EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'examples'


def _example(relative_path):
    path = EXAMPLES / relative_path
    spec = importlib.util.spec_from_file_location(f'tf_test_{path.stem}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _weights(model):
    return [w.copy() for w in model.get_weights()]


def test_keras_trains_on_hello_world_rows(tmp_path):
    keras = pytest.importorskip('keras')
    hello = _example('hello_world/generate_hello_world_dataset.py')  # the seed's schema and rows
    url = 'file://' + str(tmp_path / 'hello')
    write_dataset(url, hello.HelloWorldSchema, (hello.row_generator(i) for i in range(12)), row_group_size_mb=0.5)
    with make_reader(url, num_epochs=None, workers_count=2, seed=3, shuffle_rows=True) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec.array_4d.shape.as_list() == [None, 128, 30, None]
        pairs = dataset.map(lambda row: (tf.cast(row.image1, tf.float32) / 255.0
                                         + tf.reduce_mean(tf.cast(row.array_4d, tf.float32)) * 0.0,
                                         tf.cast(row.id, tf.float32)))
        model = keras.Sequential([keras.Input((128, 256, 3)), keras.layers.AveragePooling2D(16),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer='sgd', loss='mse')
        before = _weights(model)
        history = model.fit(pairs.batch(4), steps_per_epoch=3, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history['loss'][0])
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_keras_learns_mnist_like_digits(tmp_path):
    keras = pytest.importorskip('keras')
    keras.utils.set_random_seed(0)
    pytest.importorskip('sklearn')
    mnist = _example('mnist/generate_petastorm_mnist.py')  # real scanned digits, 28x28 like MNIST
    root = 'file://' + str(tmp_path / 'mnist')
    mnist.generate(root, max_rows=500, row_group_size_mb=0.05)
    url = root + '/train'
    with make_reader(url, num_epochs=None, seed=1, shuffle_rows=True, workers_count=2) as reader:
        pairs = make_petastorm_dataset(reader).map(
            lambda row: (tf.cast(tf.reshape(row.image, (28 * 28,)), tf.float32) / 255.0, row.digit))
        model = keras.Sequential([keras.Input((28 * 28,)), keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(pairs.batch(32), steps_per_epoch=8, epochs=3, shuffle=False, verbose=0)
    losses = history.history['loss']
    assert losses[-1] < losses[0] / 2, losses


# -- one dataset for TF1 graph code and TF2 eager code ----------------------------------------------------------


def _graph_mode_elements(make_dataset, via_function=False, limit=1000):
    """Every element of the dataset ``make_dataset()`` builds inside a fresh graph, read as TF1 code reads it."""
    with tf.Graph().as_default():
        dataset = make_dataset()
        if via_function:
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
        else:
            iterator = dataset.make_one_shot_iterator()
        next_element = iterator.get_next()
        got = []
        with tf.compat.v1.Session() as session:
            try:
                while len(got) < limit:
                    got.append(session.run(next_element))
            except tf.errors.OutOfRangeError:
                return got
    raise AssertionError(f'the dataset did not end after {limit} elements')


def test_row_dataset_serves_tf1_graph_code_and_tf2_eager_code(typed_url):
    fields = ['i64', 'price', 'matrix', 'seq']
    with row_reader(typed_url, schema_fields=fields) as reader:
        graph_rows = _graph_mode_elements(lambda: make_petastorm_dataset(reader))
    with row_reader(typed_url, schema_fields=fields) as reader:
        dataset = make_petastorm_dataset(reader)
        assert isinstance(dataset, tf.data.Dataset)
        assert [shape.as_list() for shape in dataset.output_shapes] == [[], [], [2, 3], [None]]
        eager_rows = [{name: value.numpy() for name, value in row._asdict().items()} for row in dataset]
    assert [row.i64 for row in graph_rows] == [row['i64'] for row in eager_rows] == [-(2 ** 40) * i
                                                                                      for i in range(ROWS)]
    for i, (graph_row, eager_row) in enumerate(zip(graph_rows, eager_rows, strict=True)):
        expected = expected_typed(i)
        for name in fields:
            assert_value(name, getattr(graph_row, name), expected[name])
            assert_value(name, eager_row[name], expected[name])


def test_batch_dataset_in_a_tf1_session(typed_url):
    for via_function in (False, True):
        with batch_reader(typed_url, schema_fields=['i8', 'matrix']) as reader:
            batches = _graph_mode_elements(lambda: make_petastorm_dataset(reader), via_function)
        assert len(batches) > 1
        assert np.concatenate([b.i8 for b in batches]).tolist() == [-i for i in range(ROWS)]
        assert all(b.matrix.shape == (len(b.i8), 2, 3) for b in batches)


def test_transformed_datasets_keep_the_tf1_iterator_methods(typed_url):
    def pipeline(first, second):
        return (make_petastorm_dataset(first).prefetch(4).concatenate(make_petastorm_dataset(second))
                .map(lambda row: row.i32).batch(10).unbatch().shuffle(5, seed=1).batch(ROWS * 2))

    def two_readers():
        return row_reader(typed_url, schema_fields=['i32']), row_reader(typed_url, schema_fields=['i32'])

    first, second = two_readers()
    with first, second:
        (graph_batch,) = _graph_mode_elements(lambda: pipeline(first, second))
    first, second = two_readers()
    with first, second:
        dataset = pipeline(first, second)
        (eager_batch,) = [batch.numpy() for batch in dataset]
        assert callable(dataset.make_one_shot_iterator)
    expected = sorted(2 * [-70000 * i for i in range(ROWS)])
    assert sorted(graph_batch.tolist()) == sorted(eager_batch.tolist()) == expected


def test_graph_mode_repeat_restarts_the_reader_when_the_session_asks_for_more(typed_url):
    with row_reader(typed_url, schema_fields=['i32']) as reader, tf.Graph().as_default():
        next_row = make_petastorm_dataset(reader).repeat(2).make_one_shot_iterator().get_next()
        with tf.compat.v1.Session() as session:
            with warnings.catch_warnings(record=True) as early:
                warnings.simplefilter('always')
                first = [int(session.run(next_row).i32) for _ in range(ROWS)]
                time.sleep(0.5)  # time for anything that reads ahead to reach the end and restart the reader
            assert not [w for w in early if 'multiple iterations' in str(w.message)]  # nothing restarted it unasked
            with pytest.warns(UserWarning, match='Running multiple iterations over make_petastorm_dataset'):
                second = [int(session.run(next_row).i32)]
            second += [int(session.run(next_row).i32) for _ in range(ROWS - 1)]
            with pytest.raises(tf.errors.OutOfRangeError):
                session.run(next_row)
    assert first == second == [-70000 * i for i in range(ROWS)]


def test_one_shot_iterator_of_a_dataset_in_eager_mode(typed_url):
    with row_reader(typed_url, schema_fields=['i32']) as reader:
        iterator = make_petastorm_dataset(reader).make_one_shot_iterator()
        assert [int(iterator.get_next().i32) for _ in range(3)] == [0, -70000, -140000]


def test_ngram_dataset_in_a_tf1_session(seq_url):
    with row_reader(seq_url, schema_fields=seq_ngram()) as reader:
        windows = _graph_mode_elements(lambda: make_petastorm_dataset(reader))
    assert len(windows) > 10
    for window in windows:
        assert window[1].ts == window[0].ts + 1
        assert window[0].pos.tolist() == [window[0].ts, -window[0].ts]
        assert window[1].label == f'l{window[1].ts}'.encode()


def _mixed(url, **kwargs):
    from petastorm.weighted_sampling_reader import WeightedSamplingReader

    readers = [row_reader(url, schema_fields=['i32', 'i64', 'matrix'], **kwargs) for _ in range(2)]
    return WeightedSamplingReader(readers, [0.5, 0.5], seed=4)


def _assert_typed_rows(rows):
    """Each of ``rows`` (numpy values of i32, i64, matrix) is one row of the typed dataset, whole."""
    for i32, i64, matrix in rows:
        i = -int(i32) // 70000
        assert (int(i64), matrix.tolist()) == (-(2 ** 40) * i, np.full((2, 3), i).tolist())


def test_weighted_sampling_of_row_readers_in_graph_and_eager_mode(typed_url):
    with _mixed(typed_url) as mixed:
        graph_rows = _graph_mode_elements(lambda: make_petastorm_dataset(mixed))
    with _mixed(typed_url) as mixed:
        dataset = make_petastorm_dataset(mixed)
        assert dataset.element_spec.matrix.shape.as_list() == [2, 3]
        eager_rows = [tuple(value.numpy() for value in row) for row in dataset]
    # The mix ends when the reader it picks has no row left: after ROWS to 2 * ROWS - 1 rows.
    assert ROWS <= len(graph_rows) == len(eager_rows) < 2 * ROWS  # the same seed, the same mix
    _assert_typed_rows([tuple(row) for row in graph_rows])
    _assert_typed_rows(eager_rows)


def test_weighted_sampling_of_row_readers_through_tf_tensors(typed_url):
    with _mixed(typed_url) as mixed, tf.Graph().as_default():
        tensors = tf_tensors(mixed)
        assert tensors.matrix.shape.as_list() == [2, 3]
        with tf.compat.v1.Session() as session:
            session.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            rows = [session.run(tensors) for _ in range(ROWS)]
    _assert_typed_rows([tuple(row) for row in rows])
