"""dict_to_spark_row and Unischema.as_spark_schema against real pyspark types and a real Spark session."""

import decimal

import numpy as np
import pyarrow as pa
import pytest

T = pytest.importorskip('pyspark.sql.types')

from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row, encode_row  # noqa: E402

Schema = Unischema('SparkRowSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('label', np.str_, (), ScalarCodec(T.StringType()), True),
    UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False),
    UnischemaField('image', np.uint8, (4, 5, 3), CompressedImageCodec('png'), False),
    UnischemaField('small', np.uint8, (), None, False),
])


def _row(i=1, **overrides):
    row = {'id': i, 'label': f'l{i}', 'matrix': np.full((2, 3), i, np.float32),
           'image': np.full((4, 5, 3), i, np.uint8), 'small': np.uint8(i)}
    row.update(overrides)
    return row


def test_row_fields_follow_schema_order_not_dict_order():
    row = dict_to_spark_row(Schema, dict(reversed(list(_row().items()))))
    assert list(row.__fields__) == list(Schema.fields)
    assert row.id == 1
    assert row.small == 1
    assert type(row.small) is int


def test_nullable_field_may_be_missing_or_none():
    row = {k: v for k, v in _row().items() if k != 'label'}
    assert dict_to_spark_row(Schema, row).label is None
    assert dict_to_spark_row(Schema, _row(label=None)).label is None


@pytest.mark.parametrize(('overrides', 'field'), [
    ({'matrix': np.zeros((3, 3), np.float32)}, 'matrix'),  # wrong shape
    ({'matrix': np.zeros((2, 3), np.float64)}, 'matrix'),  # wrong dtype
    ({'image': np.zeros((4, 5, 3), np.int32)}, 'image'),
    ({'id': None}, 'id'),  # None in a non-nullable field
    ({'label': 7}, 'label'),  # not a str for StringType
])
def test_validation_errors_name_the_field(overrides, field):
    with pytest.raises((ValueError, TypeError), match=field):
        dict_to_spark_row(Schema, _row(**overrides))


def test_missing_and_unexpected_fields_are_rejected():
    without_id = {k: v for k, v in _row().items() if k != 'id'}
    with pytest.raises(ValueError, match='id'):
        dict_to_spark_row(Schema, without_id)
    with pytest.raises(ValueError, match='bogus'):
        dict_to_spark_row(Schema, _row(bogus=1))


def test_non_unischema_argument_is_an_assertion_error():
    with pytest.raises(AssertionError):
        dict_to_spark_row({'id': 1}, _row())


def test_spark_row_cells_equal_the_writer_cells():
    row = _row(3)
    spark_row = dict_to_spark_row(Schema, row)
    assert spark_row.asDict() == encode_row(Schema, row)


@pytest.mark.parametrize(('numpy_dtype', 'spark_type'), [
    (np.int8, T.ByteType()), (np.uint8, T.ShortType()), (np.int16, T.ShortType()), (np.uint16, T.IntegerType()),
    (np.int32, T.IntegerType()), (np.int64, T.LongType()), (np.float32, T.FloatType()),
    (np.float64, T.DoubleType()), (np.bool_, T.BooleanType()), (np.str_, T.StringType()),
])
def test_codec_less_scalars_map_to_spark_types(numpy_dtype, spark_type):
    schema = Unischema('S', [UnischemaField('f', numpy_dtype, (), None, True)])
    field = schema.as_spark_schema().fields[0]
    assert field.dataType == spark_type
    assert field.nullable is True


def test_codec_fields_use_the_codec_spark_type():
    schema = Unischema('S', [
        UnischemaField('scalar', decimal.Decimal, (), ScalarCodec(T.DecimalType(10, 9)), False),
        UnischemaField('arrow_scalar', np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField('nd', np.float32, (2,), NdarrayCodec(), False),
        UnischemaField('cnd', np.float32, (2,), CompressedNdarrayCodec(), False),
        UnischemaField('img', np.uint8, (2, 2), CompressedImageCodec('jpeg'), False),
    ])
    struct = schema.as_spark_schema()
    assert [f.name for f in struct.fields] == list(schema.fields)
    assert [f.dataType for f in struct.fields] == [T.DecimalType(10, 9), T.IntegerType(), T.BinaryType(),
                                                   T.BinaryType(), T.BinaryType()]
    assert not any(f.nullable for f in struct.fields)


def test_implicit_scalar_types_follow_petastorm():
    schema = Unischema('S', [UnischemaField('text', np.str_, ()), UnischemaField('legacy_text', np.bytes_, ()),
                             UnischemaField('n', np.int64, ()), UnischemaField('f', np.float32, ())])
    # np.bytes_ is what numpy 1 called np.string_, Petastorm's spelling of a text field: a string column.
    assert [f.dataType for f in schema.as_spark_schema().fields] == [T.StringType(), T.StringType(), T.LongType(),
                                                                     T.FloatType()]


def test_non_scalar_without_codec_has_no_spark_type():
    schema = Unischema('S', [UnischemaField('v', np.float32, (3,), None, False)])
    with pytest.raises(ValueError, match="non-scalar UnischemaField 'v'"):
        schema.as_spark_schema()


@pytest.mark.spark
def test_rows_round_trip_through_a_dataframe(spark):
    rows = [dict_to_spark_row(Schema, _row(i)) for i in range(3)]
    collected = spark.createDataFrame(rows, Schema.as_spark_schema()).orderBy('id').collect()
    for i, row in enumerate(collected):
        decoded = {name: (f.codec.decode(f, row[name]) if f.codec else row[name]) for name, f in Schema.fields.items()}
        expected = _row(i)
        assert decoded['id'] == i
        assert decoded['label'] == f'l{i}'
        assert decoded['small'] == i
        np.testing.assert_array_equal(decoded['matrix'], expected['matrix'])
        np.testing.assert_array_equal(decoded['image'], expected['image'])


AWKWARD_NAMES = ['cls', 'self', 'a.b', 'with space', 'args']
AwkwardSchema = Unischema('AwkwardSchema', [UnischemaField(name, np.int32, (), ScalarCodec(T.IntegerType()), False)
                                            for name in AWKWARD_NAMES])


def test_any_field_name_makes_a_row_even_row_constructor_argument_names():
    row = dict_to_spark_row(AwkwardSchema, {name: i for i, name in enumerate(AWKWARD_NAMES)})
    assert list(row.__fields__) == AWKWARD_NAMES
    assert row.asDict() == {name: i for i, name in enumerate(AWKWARD_NAMES)}
    assert row['cls'] == 0
    assert row['with space'] == 3


def _awkward_row(i):
    return dict_to_spark_row(AwkwardSchema, {name: i + k for k, name in enumerate(AWKWARD_NAMES)})


@pytest.mark.spark
def test_awkward_names_survive_a_spark_task_and_a_dataframe(spark):
    rows = spark.sparkContext.parallelize(range(4), 2).map(_awkward_row)
    collected = spark.createDataFrame(rows, AwkwardSchema.as_spark_schema()).orderBy('cls').collect()
    assert [list(r.asDict().values()) for r in collected] == [[i + k for k in range(len(AWKWARD_NAMES))]
                                                              for i in range(4)]
    assert list(collected[0].asDict()) == AWKWARD_NAMES


def test_a_missing_field_is_told_on_one_line():
    without = {k: v for k, v in _row().items() if k not in ('id', 'matrix')}
    with pytest.raises(ValueError, match='Field id is not found in the row_dict, but is not nullable') as caught:
        dict_to_spark_row(Schema, without)
    assert '\n' not in str(caught.value)
    assert "missing non-nullable fields: ['id', 'matrix']" in str(caught.value)
    with pytest.raises(ValueError, match=r"Dictionary fields .* do not match schema fields .*unexpected \['bogus'\]") \
            as caught:
        dict_to_spark_row(Schema, _row(bogus=1))
    assert '\n' not in str(caught.value)


def test_a_scalar_codec_field_with_a_shape_is_refused_before_writing():
    with pytest.warns(UserWarning, match=r"The shape field of a scalar field 'v' must be an empty tuple.*NdarrayCodec"):
        schema = Unischema('S', [UnischemaField('v', np.int32, (3,), ScalarCodec(T.IntegerType()), False)])
    with pytest.raises(ValueError, match=r"The shape field of a scalar field 'v' must be an empty tuple"):
        schema.as_spark_schema()
    with pytest.raises(ValueError, match=r"The shape field of a scalar field 'v' must be an empty tuple"):
        schema.as_pyarrow_schema()
    # A list type holds 1-d values: that shape is fine.
    listed = Unischema('S', [UnischemaField('v', np.int32, (None,), ScalarCodec(pa.list_(pa.int32())), False)])
    assert listed.as_pyarrow_schema().field('v').type == pa.list_(pa.int32())
