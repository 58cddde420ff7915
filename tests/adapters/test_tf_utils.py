"""petastorm.tf_utils: tf.data datasets and TF1 graph tensors over both readers, dtypes, shapes, NGram, Keras."""

import datetime
import decimal
import importlib.util
import os
import pathlib
import sys
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's C++ start-up chatter, not test output
tf = pytest.importorskip('tensorflow')

from petastorm import TransformSpec, make_batch_reader, make_reader, write_dataset  # noqa: E402
from petastorm.codecs import NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.errors import MissingDependencyError  # noqa: E402
from petastorm.ngram import NGram  # noqa: E402
from petastorm.tf_utils import (  # noqa: E402
    RANDOM_SHUFFLING_QUEUE_SIZE,
    _sanitize_field_tf_types,
    date_to_nsec_from_epoch,
    make_namedtuple_tf_ngram,
    make_petastorm_dataset,
    tf_tensors,
)
from petastorm.tf_utils._dataset import column_batches  # noqa: E402
from petastorm.tf_utils._layout import ElementLayout  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402

pytestmark = [pytest.mark.tf,
              pytest.mark.filterwarnings('ignore:Tensorflow will convert all unicode strings:UnicodeWarning'),
              pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')]

ROWS = 24
EPOCH_NS = np.datetime64('2024-01-02T03:04:05', 'ns').astype(np.int64)

# One field per numpy type a Unischema field may have, with the TensorFlow dtype it must arrive as.
TYPED_FIELDS = [
    (UnischemaField('i8', np.int8, (), ScalarCodec(pa.int8()), False), tf.int8),
    (UnischemaField('u8', np.uint8, (), ScalarCodec(pa.uint8()), False), tf.uint8),
    (UnischemaField('i16', np.int16, (), ScalarCodec(pa.int16()), False), tf.int16),
    (UnischemaField('u16', np.uint16, (), ScalarCodec(pa.uint16()), False), tf.int32),
    (UnischemaField('i32', np.int32, (), ScalarCodec(pa.int32()), False), tf.int32),
    (UnischemaField('u32', np.uint32, (), ScalarCodec(pa.uint32()), False), tf.int64),
    (UnischemaField('i64', np.int64, (), ScalarCodec(pa.int64()), False), tf.int64),
    (UnischemaField('u64', np.uint64, (), ScalarCodec(pa.uint64()), False), tf.uint64),
    (UnischemaField('f16', np.float16, (), ScalarCodec(pa.float16()), False), tf.float16),
    (UnischemaField('f32', np.float32, (), ScalarCodec(pa.float32()), False), tf.float32),
    (UnischemaField('f64', np.float64, (), ScalarCodec(pa.float64()), False), tf.float64),
    (UnischemaField('flag', np.bool_, (), ScalarCodec(pa.bool_()), False), tf.bool),
    (UnischemaField('text', np.str_, (), ScalarCodec(pa.string()), False), tf.string),
    (UnischemaField('blob', np.bytes_, (), ScalarCodec(pa.binary()), False), tf.string),
    (UnischemaField('price', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 3)), False), tf.string),
    (UnischemaField('when', np.datetime64, (), ScalarCodec(pa.timestamp('ns')), False), tf.int64),
    (UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False), tf.float32),
    (UnischemaField('seq', np.int16, (None,), NdarrayCodec(), False), tf.int16),
    (UnischemaField('wide', np.uint16, (3,), NdarrayCodec(), False), tf.int32),
]
TypedSchema = Unischema('TypedSchema', [field for field, _ in TYPED_FIELDS])


def _typed_row(i):
    return {'i8': -i, 'u8': 200 + i % 50, 'i16': -300 * i, 'u16': 60000 + i, 'i32': -70000 * i,
            'u32': 4_000_000_000 + i, 'i64': -(2 ** 40) * i, 'u64': 2 ** 63 + i, 'f16': i / 2, 'f32': i / 4,
            'f64': i / 8, 'flag': i % 2 == 0,
            'text': f'héllo {i}', 'blob': bytes([i, 0, 255]), 'price': decimal.Decimal(f'{i}.500'),
            'when': np.datetime64('2024-01-02T03:04:05', 'ns') + np.timedelta64(i, 's'),
            'matrix': np.full((2, 3), i, dtype=np.float32), 'seq': np.arange(i % 3 + 1, dtype=np.int16),
            'wide': np.array([65535, i, 0], dtype=np.uint16)}


def _expected_typed(i):
    """What row ``i`` of TypedSchema looks like after TensorFlow (``.numpy()`` of each tensor)."""
    row = _typed_row(i)
    return {**row, 'text': row['text'].encode(), 'price': f'{i}.5'.encode(), 'when': EPOCH_NS + i * 10 ** 9}


@pytest.fixture(scope='module')
def typed_url(tmp_path_factory):
    url = 'file://' + str(tmp_path_factory.mktemp('tf') / 'typed')
    write_dataset(url, TypedSchema, (_typed_row(i) for i in range(ROWS)), row_group_size_mb=0.002)
    return url


def _open(factory, url, **kwargs):
    """A reader with the natural order (dummy pool, no row-group shuffling) unless asked otherwise."""
    return factory(url, **{'reader_pool_type': 'dummy', 'shuffle_row_groups': False, **kwargs})


def _row_reader(url, **kwargs):
    return _open(make_reader, url, **kwargs)


def _batch_reader(url, **kwargs):
    return _open(make_batch_reader, url, **kwargs)


def _assert_value(name, actual, expected):
    if isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-3), name
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


# -- dtypes and shapes ------------------------------------------------------------------------------------------


def test_row_dataset_has_schema_dtypes_static_shapes_and_converted_values(typed_url):
    with _row_reader(typed_url) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        assert type(spec) is TypedSchema._get_namedtuple()
        for field, tf_dtype in TYPED_FIELDS:
            assert getattr(spec, field.name).dtype == tf_dtype, field.name
            assert getattr(spec, field.name).shape.as_list() == list(field.shape), field.name
        rows = [{k: v.numpy() for k, v in row._asdict().items()} for row in dataset]
    assert [row['i64'] for row in rows] == [-(2 ** 40) * i for i in range(ROWS)]
    for i, row in enumerate(rows):
        for name, expected in _expected_typed(i).items():
            _assert_value(name, row[name], expected)


def test_batch_dataset_has_leading_batch_dimension_and_same_values(typed_url):
    fixed = [f.name for f, _ in TYPED_FIELDS if None not in f.shape]  # rows of `seq` differ in length
    with _batch_reader(typed_url, schema_fields=fixed) as reader:
        dataset = make_petastorm_dataset(reader)
        for field, tf_dtype in TYPED_FIELDS:
            if field.name in fixed:
                spec = getattr(dataset.element_spec, field.name)
                assert (spec.dtype, spec.shape.as_list()) == (tf_dtype, [None, *field.shape]), field.name
        batches = list(dataset)
    assert len(batches) > 1  # several row groups, one element each
    assert all(b.i8.shape[0] == len(b.text) for b in batches)
    columns = {name: np.concatenate([getattr(b, name).numpy() for b in batches]) for name in fixed}
    for i in range(ROWS):
        for name in fixed:
            _assert_value(name, columns[name][i], _expected_typed(i)[name])


@pytest.mark.parametrize(('numpy_type', 'tf_name'), [
    (np.int8, 'int8'), (np.uint8, 'uint8'), (np.int16, 'int16'), (np.uint16, 'int32'), (np.int32, 'int32'),
    (np.uint32, 'int64'), (np.int64, 'int64'), (np.uint64, 'uint64'), (np.float16, 'float16'),
    (np.float32, 'float32'), (np.float64, 'float64'), (np.bool_, 'bool'), (np.str_, 'string'),
    (np.bytes_, 'string'), (decimal.Decimal, 'string'), (np.datetime64, 'int64'), (np.dtype('float32'), 'float32')])
def test_unischema_renders_tf_dtypes(numpy_type, tf_name):
    from petastorm.tf_utils import _numpy_to_tf_dtypes, _schema_to_tf_dtypes

    schema = Unischema('One', [UnischemaField('x', numpy_type, (), None, False)])
    assert schema.as_tf_dtypes() == {'x': getattr(tf, tf_name)}
    assert _schema_to_tf_dtypes(schema) == [_numpy_to_tf_dtypes(numpy_type)] == [getattr(tf, tf_name)]


def test_field_without_tensorflow_type_is_refused_up_front():
    schema = Unischema('Odd', [UnischemaField('z', np.complex64, (), None, False)])
    with pytest.raises(ValueError, match="field 'z' cannot become a TensorFlow tensor"):
        ElementLayout(schema)


# -- strings, decimals, None, times -----------------------------------------------------------------------------


NullableSchema = Unischema('NullableSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('maybe', np.float64, (), ScalarCodec(pa.float64()), True),
])


@pytest.mark.parametrize('reader_factory', [_row_reader, _batch_reader])
def test_none_value_is_an_error_naming_the_field(tmp_path, reader_factory):
    url = 'file://' + str(tmp_path / 'nullable')
    write_dataset(url, NullableSchema, [{'id': 0, 'maybe': 1.5}, {'id': 1, 'maybe': None}])
    with reader_factory(url) as reader, pytest.raises(tf.errors.OpError, match='Encountered "maybe"=None'):
        list(make_petastorm_dataset(reader))


def test_decimal_strings_and_dates_of_a_plain_parquet_store(tmp_path):
    table = pa.table({'d': pa.array([decimal.Decimal('1.10'), decimal.Decimal('100')], pa.decimal128(6, 2)),
                      'day': pa.array([datetime.date(1970, 1, 2), datetime.date(2000, 3, 1)], pa.date32()),
                      'name': ['ab', 'çd']})
    pq.write_table(table, str(tmp_path / 'p.parquet'))
    with _batch_reader('file://' + str(tmp_path)) as reader:
        (batch,) = list(make_petastorm_dataset(reader))
    assert batch.d.numpy().tolist() == [b'1.1', b'1E+2']  # Decimal.normalize(), as the original did
    assert batch.day.numpy().tolist() == [86_400 * 10 ** 9, date_to_nsec_from_epoch(datetime.date(2000, 3, 1))]
    assert [v.decode() for v in batch.name.numpy()] == ['ab', 'çd']


def test_unicode_fields_warn_that_they_come_back_as_bytes(typed_url):
    with _row_reader(typed_url, schema_fields=['i8', 'text']) as reader, \
            pytest.warns(UnicodeWarning, match=r"fields \['text'\]"):
        make_petastorm_dataset(reader)
    with _row_reader(typed_url, schema_fields=['i8']) as reader, warnings.catch_warnings():
        warnings.simplefilter('error')
        make_petastorm_dataset(reader)


def test_value_helpers():
    assert date_to_nsec_from_epoch(datetime.date(1970, 1, 1)) == 0
    assert date_to_nsec_from_epoch(datetime.datetime(1970, 1, 1, 0, 0, 2)) == 2 * 10 ** 9
    aware = datetime.datetime(1970, 1, 1, 1, 0, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    assert date_to_nsec_from_epoch(aware) == 0
    row = TypedSchema.create_schema_view([TypedSchema.u16, TypedSchema.price, TypedSchema.when]).make_namedtuple(
        u16=np.uint16(7), price=decimal.Decimal('2.50'), when=np.datetime64(1, 's'))
    clean = _sanitize_field_tf_types(row)
    assert type(clean) is type(row)
    assert (clean.u16.dtype, clean.price, clean.when) == (np.int32, '2.5', 10 ** 9)
    with pytest.raises(RuntimeError, match='"u16"=None'):
        _sanitize_field_tf_types(row._replace(u16=None))


# -- the columnar path, re-iteration, transforms ----------------------------------------------------------------


def test_row_reader_hands_tensorflow_whole_column_batches(typed_url):
    fixed = ['i8', 'text', 'matrix']
    with _row_reader(typed_url, schema_fields=fixed) as reader:
        layout = ElementLayout.of(reader)
        batches = list(column_batches(reader, layout))
        row_groups = reader.diagnostics['work_items_per_epoch']
    assert len(batches) == row_groups < ROWS
    assert sum(len(b[0]) for b in batches) == ROWS
    with _row_reader(typed_url, schema_fields=['i8', 'seq']) as reader:  # rows of `seq` differ in shape
        batches = list(column_batches(reader, ElementLayout.of(reader)))
    assert len(batches) == ROWS
    assert all(len(b[1]) == 1 for b in batches)


def test_batch_reader_with_rows_of_different_shapes_names_the_field(typed_url):
    with _batch_reader(typed_url, schema_fields=['i8', 'seq']) as reader, \
            pytest.raises(tf.errors.OpError, match="field 'seq' holds rows of different shapes"):
        list(make_petastorm_dataset(reader))


def test_second_iteration_restarts_the_reader_with_a_warning(typed_url):
    with _row_reader(typed_url, schema_fields=['i32'], reader_pool_type='thread', workers_count=2) as reader:
        dataset = make_petastorm_dataset(reader)
        first = sorted(int(r.i32) for r in dataset)
        with pytest.warns(UserWarning, match='Running multiple iterations over make_petastorm_dataset'):
            second = sorted(int(r.i32) for r in dataset)
    assert first == second == sorted(-70000 * i for i in range(ROWS))


def test_row_transform_shapes_and_dtypes_follow_the_transformed_schema(typed_url):
    def transform(row):
        return {'i32': row['i32'], 'matrix': np.asarray(row['matrix'], dtype=np.float64).T}

    spec = TransformSpec(transform, edit_fields=[('matrix', np.float64, (3, 2), False)], selected_fields=['i32',
                                                                                                          'matrix'])
    with _row_reader(typed_url, schema_fields=['i32', 'matrix'], transform_spec=spec) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec.matrix.shape.as_list() == [3, 2]
        assert dataset.element_spec.matrix.dtype == tf.float64
        rows = list(dataset)
    assert len(rows) == ROWS
    assert rows[5].matrix.numpy().tolist() == [[5.0, 5.0]] * 3


def test_missing_tensorflow_names_the_extra(typed_url, monkeypatch):
    with _row_reader(typed_url, schema_fields=['i8']) as reader:
        monkeypatch.setitem(sys.modules, 'tensorflow', None)  # makes `import tensorflow` raise ImportError
        with pytest.raises(MissingDependencyError, match=r"petastorm\[tf\]"):
            make_petastorm_dataset(reader)
        with pytest.raises(MissingDependencyError, match=r"petastorm\[tf\]"):
            tf_tensors(reader)


# -- NGram ------------------------------------------------------------------------------------------------------


SeqSchema = Unischema('SeqSchema', [
    UnischemaField('ts', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('pos', np.float32, (2,), NdarrayCodec(), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), False),
])


@pytest.fixture(scope='module')
def seq_url(tmp_path_factory):
    url = 'file://' + str(tmp_path_factory.mktemp('tf') / 'seq')
    rows = ({'ts': t, 'pos': np.array([t, -t], dtype=np.float32), 'label': f'l{t}'} for t in range(30))
    write_dataset(url, SeqSchema, rows, row_group_size_mb=0.001)
    return url


def _seq_ngram():
    return NGram({0: [SeqSchema.ts, SeqSchema.pos], 1: [SeqSchema.ts, SeqSchema.label]}, delta_threshold=1,
                 timestamp_field=SeqSchema.ts)


def test_ngram_row_reader_yields_dicts_of_offsets(seq_url):
    with _row_reader(seq_url, schema_fields=_seq_ngram()) as reader:
        dataset = make_petastorm_dataset(reader)
        assert set(dataset.element_spec) == {0, 1}
        assert dataset.element_spec[0].pos.shape.as_list() == [2]
        windows = list(dataset)
    assert len(windows) > 10
    for window in windows:
        t = int(window[0].ts)
        assert int(window[1].ts) == t + 1
        assert window[0].pos.numpy().tolist() == [t, -t]
        assert window[1].label.numpy() == f'l{t + 1}'.encode()
        assert (window[0]._fields, window[1]._fields) == (('ts', 'pos'), ('ts', 'label'))


def test_ngram_batch_reader_yields_dicts_of_column_batches(seq_url):
    with _batch_reader(seq_url, schema_fields=_seq_ngram()) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec[0].pos.shape.as_list() == [None, 2]
        windows = list(dataset)
    starts = np.concatenate([w[0].ts.numpy() for w in windows])
    assert len(starts) > 10
    for window in windows:
        np.testing.assert_array_equal(window[1].ts.numpy(), window[0].ts.numpy() + 1)


def test_make_namedtuple_tf_ngram_packs_flat_values_by_offset():
    ngram = _seq_ngram()
    ngram.resolve_regex_field_names(SeqSchema)
    packed = make_namedtuple_tf_ngram(SeqSchema, ngram, 1, 'p', 2, 'label')
    assert (packed[0].ts, packed[0].pos, packed[1].ts, packed[1].label) == (1, 'p', 2, 'label')
    packed = make_namedtuple_tf_ngram(SeqSchema, ngram, 1, 'p', **{'1': {'ts': 2, 'label': 'x'}})
    assert packed[1] == (2, 'x')
    with pytest.raises(ValueError, match="no value for field 'label' at offset 1"):
        make_namedtuple_tf_ngram(SeqSchema, ngram, 1, 'p', 2)


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
    with _row_reader(typed_url, schema_fields=['i64', 'u16', 'price', 'matrix', 'seq']) as reader, \
            tf.Graph().as_default():
        tensors = tf_tensors(reader)
        assert (tensors.matrix.shape.as_list(), tensors.seq.shape.as_list()) == ([2, 3], [None])
        assert (tensors.u16.dtype, tensors.price.dtype) == (tf.int32, tf.string)
        rows = _run_until_exhausted(tensors)
    assert [r.i64 for r in rows] == [-(2 ** 40) * i for i in range(ROWS)]
    assert (rows[3].price, rows[3].seq.tolist()) == (b'3.5', [0])


def test_tf_tensors_shuffling_queue_delivers_every_row_in_another_order(typed_url):
    with _row_reader(typed_url, schema_fields=['i32']) as reader, tf.Graph().as_default() as graph:
        tensors = tf_tensors(reader, shuffling_queue_capacity=20, min_after_dequeue=10)
        graph.get_operation_by_name(RANDOM_SHUFFLING_QUEUE_SIZE)  # diagnostics find the queue size by name
        rows = _run_until_exhausted(tensors, start_queue_runners=True)
    ids = [r.i32 for r in rows]
    assert sorted(ids) == sorted(-70000 * i for i in range(ROWS))
    assert ids != sorted(ids, reverse=True)


def test_tf_tensors_batch_reader_and_its_limits(typed_url):
    with _batch_reader(typed_url, schema_fields=['i8', 'matrix']) as reader:
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
    with _row_reader(seq_url, schema_fields=_seq_ngram()) as reader, tf.Graph().as_default():
        tensors = tf_tensors(reader)
        assert (set(tensors), tensors[0].pos.shape.as_list()) == ({0, 1}, [2])
        windows = _run_until_exhausted(tensors)
    assert len(windows) > 10
    assert all(w[1].ts == w[0].ts + 1 for w in windows)


# -- Keras trains on our datasets -------------------------------------------------------------------------------


EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / 'examples'


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
    with _row_reader(typed_url, schema_fields=fields) as reader:
        graph_rows = _graph_mode_elements(lambda: make_petastorm_dataset(reader))
    with _row_reader(typed_url, schema_fields=fields) as reader:
        dataset = make_petastorm_dataset(reader)
        assert isinstance(dataset, tf.data.Dataset)
        assert [shape.as_list() for shape in dataset.output_shapes] == [[], [], [2, 3], [None]]
        eager_rows = [{name: value.numpy() for name, value in row._asdict().items()} for row in dataset]
    assert [row.i64 for row in graph_rows] == [row['i64'] for row in eager_rows] == [-(2 ** 40) * i
                                                                                      for i in range(ROWS)]
    for i, (graph_row, eager_row) in enumerate(zip(graph_rows, eager_rows, strict=True)):
        expected = _expected_typed(i)
        for name in fields:
            _assert_value(name, getattr(graph_row, name), expected[name])
            _assert_value(name, eager_row[name], expected[name])


def test_batch_dataset_in_a_tf1_session(typed_url):
    for via_function in (False, True):
        with _batch_reader(typed_url, schema_fields=['i8', 'matrix']) as reader:
            batches = _graph_mode_elements(lambda: make_petastorm_dataset(reader), via_function)
        assert len(batches) > 1
        assert np.concatenate([b.i8 for b in batches]).tolist() == [-i for i in range(ROWS)]
        assert all(b.matrix.shape == (len(b.i8), 2, 3) for b in batches)


def test_transformed_datasets_keep_the_tf1_iterator_methods(typed_url):
    def pipeline(first, second):
        return (make_petastorm_dataset(first).prefetch(4).concatenate(make_petastorm_dataset(second))
                .map(lambda row: row.i32).batch(10).unbatch().shuffle(5, seed=1).batch(ROWS * 2))

    def two_readers():
        return _row_reader(typed_url, schema_fields=['i32']), _row_reader(typed_url, schema_fields=['i32'])

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
    with _row_reader(typed_url, schema_fields=['i32']) as reader, tf.Graph().as_default():
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
    with _row_reader(typed_url, schema_fields=['i32']) as reader:
        iterator = make_petastorm_dataset(reader).make_one_shot_iterator()
        assert [int(iterator.get_next().i32) for _ in range(3)] == [0, -70000, -140000]


def test_ngram_dataset_in_a_tf1_session(seq_url):
    with _row_reader(seq_url, schema_fields=_seq_ngram()) as reader:
        windows = _graph_mode_elements(lambda: make_petastorm_dataset(reader))
    assert len(windows) > 10
    for window in windows:
        assert window[1].ts == window[0].ts + 1
        assert window[0].pos.tolist() == [window[0].ts, -window[0].ts]
        assert window[1].label == f'l{window[1].ts}'.encode()


def _mixed(url, **kwargs):
    from petastorm.weighted_sampling_reader import WeightedSamplingReader

    readers = [_row_reader(url, schema_fields=['i32', 'i64', 'matrix'], **kwargs) for _ in range(2)]
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
