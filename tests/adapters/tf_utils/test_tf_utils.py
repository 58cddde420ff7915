"""petastorm.tf_utils: tf.data datasets and TF1 graph tensors over both readers, dtypes, shapes, NGram, Keras."""

import datetime
import decimal
import os
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # TensorFlow's C++ start-up chatter, not test output
tf = pytest.importorskip('tensorflow')

from petastorm import TransformSpec, write_dataset  # noqa: E402
from petastorm.codecs import ScalarCodec  # noqa: E402
from petastorm.errors import MissingDependencyError  # noqa: E402
from petastorm.tf_utils import (  # noqa: E402
    _sanitize_field_tf_types,
    date_to_nsec_from_epoch,
    make_namedtuple_tf_ngram,
    make_petastorm_dataset,
    tf_tensors,
)
from petastorm.tf_utils._dataset import column_batches  # noqa: E402
from petastorm.tf_utils._layout import ElementLayout  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402
from support.tf_datasets import (  # noqa: E402
    ROWS,
    TYPED_FIELDS,
    SeqSchema,
    TypedSchema,
    assert_value,
    batch_reader,
    expected_typed,
    row_reader,
    seq_ngram,
)

pytestmark = [pytest.mark.tf,
              pytest.mark.filterwarnings('ignore:Tensorflow will convert all unicode strings:UnicodeWarning'),
              pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')]

# -- dtypes and shapes ------------------------------------------------------------------------------------------


def test_row_dataset_has_schema_dtypes_static_shapes_and_converted_values(typed_url):
    with row_reader(typed_url) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        assert type(spec) is TypedSchema._get_namedtuple()
        for field, tf_dtype in TYPED_FIELDS:
            assert getattr(spec, field.name).dtype == tf_dtype, field.name
            assert getattr(spec, field.name).shape.as_list() == list(field.shape), field.name
        rows = [{k: v.numpy() for k, v in row._asdict().items()} for row in dataset]
    assert [row['i64'] for row in rows] == [-(2 ** 40) * i for i in range(ROWS)]
    for i, row in enumerate(rows):
        for name, expected in expected_typed(i).items():
            assert_value(name, row[name], expected)


def test_batch_dataset_has_leading_batch_dimension_and_same_values(typed_url):
    fixed = [f.name for f, _ in TYPED_FIELDS if None not in f.shape]  # rows of `seq` differ in length
    with batch_reader(typed_url, schema_fields=fixed) as reader:
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
            assert_value(name, columns[name][i], expected_typed(i)[name])


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


@pytest.mark.parametrize('reader_factory', [row_reader, batch_reader])
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
    with batch_reader('file://' + str(tmp_path)) as reader:
        (batch,) = list(make_petastorm_dataset(reader))
    assert batch.d.numpy().tolist() == [b'1.1', b'1E+2']  # Decimal.normalize(), as the original did
    assert batch.day.numpy().tolist() == [86_400 * 10 ** 9, date_to_nsec_from_epoch(datetime.date(2000, 3, 1))]
    assert [v.decode() for v in batch.name.numpy()] == ['ab', 'çd']


def test_unicode_fields_warn_that_they_come_back_as_bytes(typed_url):
    with row_reader(typed_url, schema_fields=['i8', 'text']) as reader, \
            pytest.warns(UnicodeWarning, match=r"fields \['text'\]"):
        make_petastorm_dataset(reader)
    with row_reader(typed_url, schema_fields=['i8']) as reader, warnings.catch_warnings():
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
    with row_reader(typed_url, schema_fields=fixed) as reader:
        layout = ElementLayout.of(reader)
        batches = list(column_batches(reader, layout))
        row_groups = reader.diagnostics['work_items_per_epoch']
    assert len(batches) == row_groups < ROWS
    assert sum(len(b[0]) for b in batches) == ROWS
    with row_reader(typed_url, schema_fields=['i8', 'seq']) as reader:  # rows of `seq` differ in shape
        batches = list(column_batches(reader, ElementLayout.of(reader)))
    assert len(batches) == ROWS
    assert all(len(b[1]) == 1 for b in batches)


def test_batch_reader_with_rows_of_different_shapes_names_the_field(typed_url):
    with batch_reader(typed_url, schema_fields=['i8', 'seq']) as reader, \
            pytest.raises(tf.errors.OpError, match="field 'seq' holds rows of different shapes"):
        list(make_petastorm_dataset(reader))


def test_second_iteration_restarts_the_reader_with_a_warning(typed_url):
    with row_reader(typed_url, schema_fields=['i32'], reader_pool_type='thread', workers_count=2) as reader:
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
    with row_reader(typed_url, schema_fields=['i32', 'matrix'], transform_spec=spec) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec.matrix.shape.as_list() == [3, 2]
        assert dataset.element_spec.matrix.dtype == tf.float64
        rows = list(dataset)
    assert len(rows) == ROWS
    assert rows[5].matrix.numpy().tolist() == [[5.0, 5.0]] * 3


def test_missing_tensorflow_names_the_extra(typed_url, monkeypatch):
    with row_reader(typed_url, schema_fields=['i8']) as reader:
        monkeypatch.setitem(sys.modules, 'tensorflow', None)  # makes `import tensorflow` raise ImportError
        with pytest.raises(MissingDependencyError, match=r"petastorm\[tf\]"):
            make_petastorm_dataset(reader)
        with pytest.raises(MissingDependencyError, match=r"petastorm\[tf\]"):
            tf_tensors(reader)


# -- NGram ------------------------------------------------------------------------------------------------------


def test_ngram_row_reader_yields_dicts_of_offsets(seq_url):
    with row_reader(seq_url, schema_fields=seq_ngram()) as reader:
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
    with batch_reader(seq_url, schema_fields=seq_ngram()) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec[0].pos.shape.as_list() == [None, 2]
        windows = list(dataset)
    starts = np.concatenate([w[0].ts.numpy() for w in windows])
    assert len(starts) > 10
    for window in windows:
        np.testing.assert_array_equal(window[1].ts.numpy(), window[0].ts.numpy() + 1)


def test_make_namedtuple_tf_ngram_packs_flat_values_by_offset():
    ngram = seq_ngram()
    ngram.resolve_regex_field_names(SeqSchema)
    packed = make_namedtuple_tf_ngram(SeqSchema, ngram, 1, 'p', 2, 'label')
    assert (packed[0].ts, packed[0].pos, packed[1].ts, packed[1].label) == (1, 'p', 2, 'label')
    packed = make_namedtuple_tf_ngram(SeqSchema, ngram, 1, 'p', **{'1': {'ts': 2, 'label': 'x'}})
    assert packed[1] == (2, 'x')
    with pytest.raises(ValueError, match="no value for field 'label' at offset 1"):
        make_namedtuple_tf_ngram(SeqSchema, ngram, 1, 'p', 2)
