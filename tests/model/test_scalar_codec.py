"""ScalarCodec, the JSON descriptions of every codec, and native Arrow columns read as numpy."""

from __future__ import annotations

import datetime
import decimal
import json
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from petastorm.codecs import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    codec_from_json,
)
from petastorm.columns import ListColumn, MaskedColumn, densified, row_values
from petastorm.errors import CodecError, MissingDependencyError, SchemaError
from petastorm.typemaps.scalars import scalar_column_to_numpy
from petastorm.unischema import UnischemaField
from support.strategies import SIMPLE_ARROW_TYPES, codecs

PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _field(name, dtype, shape=(), codec=None, nullable=False):
    return UnischemaField(name, dtype, shape, codec, nullable)


# --- ScalarCodec ------------------------------------------------------------------------------------------------

_INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


@pytest.mark.parametrize('arrow_type', _INT_TYPES)
def test_scalar_codec_integer_ranges(arrow_type):
    codec = ScalarCodec(arrow_type)
    info = np.iinfo(arrow_type.to_pandas_dtype())
    field = _field('count', np.int64, (), codec)
    for ok in (info.min, info.max, np.int8(1), 3.0, True):
        encoded = codec.encode(field, ok)
        assert type(encoded) is int
        assert encoded == int(ok)
        assert pa.array([encoded], arrow_type)[0].as_py() == int(ok)
    for bad in (int(info.min) - 1, int(info.max) + 1):
        with pytest.raises(SchemaError, match=r"'count'.*out of range"):
            codec.encode(field, bad)


@pytest.mark.parametrize(('value', 'match'), [(1.5, 'integral'), ('7', 'integer'), (b'7', 'integer'),
                                              (None, 'integer'), (decimal.Decimal('1.5'), 'integer')])
def test_scalar_codec_rejects_non_integers_for_int_fields(value, match):
    codec = ScalarCodec(pa.int32())
    with pytest.raises(SchemaError, match=rf"field 'num'.*{match}"):
        codec.encode(_field('num', np.int32, (), codec), value)


@pytest.mark.parametrize(('arrow_type', 'good', 'expected', 'bad'), [
    (pa.float32(), np.float32(1.5), 1.5, 'x'),
    (pa.float64(), 2, 2.0, b'2'),
    (pa.float16(), 0.5, 0.5, [1.0]),
    (pa.bool_(), np.bool_(True), True, 'yes'),
    (pa.string(), 'héllo', 'héllo', 5),
    (pa.large_string(), np.str_('x'), 'x', b'x'),
    (pa.binary(), b'\x00\x01', b'\x00\x01', 'text'),
    (pa.large_binary(), b'ab', b'ab', 3),
])
def test_scalar_codec_per_type(arrow_type, good, expected, bad):
    codec = ScalarCodec(arrow_type)
    field = _field('value', np.float64, (), codec)
    encoded = codec.encode(field, good)
    assert encoded == expected
    assert type(encoded) is type(expected)
    assert codec.encode_column(field, [encoded])[0].as_py() == expected
    assert codec.arrow_type() == arrow_type
    with pytest.raises((SchemaError, TypeError), match='value'):
        codec.encode(field, bad)


def test_scalar_codec_decimal():
    codec = ScalarCodec(pa.decimal128(10, 3))
    field = _field('price', decimal.Decimal, (), codec)
    encoded = codec.encode(field, decimal.Decimal('12.345'))
    stored = pa.array([encoded], codec.arrow_type())
    assert stored.type == pa.decimal128(10, 3)
    decoded = codec.decode(field, stored[0].as_py())
    assert decoded == decimal.Decimal('12.345')
    assert isinstance(decoded, decimal.Decimal)
    column = scalar_column_to_numpy(field, stored)
    assert column.dtype == object
    assert column[0] == decimal.Decimal('12.345')


def test_scalar_codec_timestamp():
    codec = ScalarCodec(pa.timestamp('us'))
    field = _field('when', np.datetime64, (), codec)
    encoded = codec.encode(field, np.datetime64('2021-03-04T05:06:07.123456'))
    assert encoded == datetime.datetime(2021, 3, 4, 5, 6, 7, 123456)
    assert codec.encode(field, datetime.datetime(2020, 1, 1)) == datetime.datetime(2020, 1, 1)
    stored = pa.array([encoded], codec.arrow_type())
    decoded = codec.decode(field, stored[0].as_py())
    assert decoded == np.datetime64('2021-03-04T05:06:07.123456')
    column = scalar_column_to_numpy(field, stored)
    assert column.dtype.kind == 'M'
    assert column[0] == np.datetime64('2021-03-04T05:06:07.123456')


def test_scalar_codec_decode_casts_to_the_field_type():
    codec = ScalarCodec(pa.int16())
    decoded = codec.decode(_field('v', np.uint8, (), codec), 7)
    assert decoded == 7
    assert type(decoded) is np.uint8
    text = ScalarCodec(pa.string()).decode(_field('s', np.str_, ()), 'abc')
    assert type(text) is np.str_


def test_scalar_codec_rejects_non_scalars_and_shapes():
    codec = ScalarCodec(pa.int32())
    with pytest.raises(TypeError, match="Expected a scalar as a value for field 'v'"):
        codec.encode(_field('v', np.int32, (), codec), [1, 2])
    assert codec.encode(_field('v', np.int32, (), codec), np.array(4)) == 4  # 0-d arrays are scalars
    with pytest.raises(SchemaError, match='must be an empty tuple'):
        codec.encode(_field('v', np.int32, (1,), codec), 3)


def test_scalar_codec_argument_checks():
    with pytest.raises(SchemaError, match='ScalarCodec'):
        ScalarCodec(np.int32)
    with pytest.raises(SchemaError, match='not supported'):
        ScalarCodec(type('CalendarIntervalType', (), {})())


def test_scalar_codec_accepts_spark_like_types_without_pyspark():
    integer_type = type('IntegerType', (), {})
    decimal_type = type('DecimalType', (), {'precision': 10, 'scale': 9})
    assert ScalarCodec(integer_type()).arrow_type() == pa.int32()
    assert ScalarCodec(integer_type()) == ScalarCodec(pa.int32())
    assert str(ScalarCodec(integer_type())) == 'ScalarCodec(IntegerType())'
    assert ScalarCodec(decimal_type()).arrow_type() == pa.decimal128(10, 9)
    assert codec_from_json(ScalarCodec(decimal_type()).to_json()) == ScalarCodec(pa.decimal128(10, 9))


def test_spark_dtype_without_pyspark_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'pyspark', None)
    monkeypatch.setitem(sys.modules, 'pyspark.sql', None)
    monkeypatch.setitem(sys.modules, 'pyspark.sql.types', None)
    for codec in (NdarrayCodec(), CompressedImageCodec(), ScalarCodec(pa.int32())):
        with pytest.raises(MissingDependencyError, match=r'petastorm\[spark\]'):
            codec.spark_dtype()


# --- JSON descriptions ------------------------------------------------------------------------------------------

@PROPERTY
@given(codecs())
def test_codec_json_round_trip(codec):
    description = codec.to_json()
    text = json.dumps(description)
    rebuilt = codec_from_json(json.loads(text))
    assert type(rebuilt) is type(codec)
    assert rebuilt == codec
    assert rebuilt.to_json() == description
    assert hash(rebuilt) == hash(codec)
    assert rebuilt.arrow_type() == codec.arrow_type()


@pytest.mark.parametrize('arrow_type', SIMPLE_ARROW_TYPES)
def test_scalar_codec_json_names(arrow_type):
    description = ScalarCodec(arrow_type).to_json()
    assert description['codec'] == 'scalar'
    assert codec_from_json(description).arrow_type() == arrow_type


def test_codec_from_json_unknown_codec():
    with pytest.raises(SchemaError, match="'nope'") as info:
        codec_from_json({'codec': 'nope'}, where='field x of somewhere')
    assert 'somewhere' in str(info.value)
    assert 'ndarray' in str(info.value)  # lists the known names
    with pytest.raises(SchemaError, match='unknown codec'):
        codec_from_json('ndarray')


def test_codec_from_json_unknown_scalar_type():
    with pytest.raises(SchemaError, match='int128'):
        codec_from_json({'codec': 'scalar', 'type': 'int128'})


def test_codec_equality_and_str():
    assert NdarrayCodec() == NdarrayCodec()
    assert NdarrayCodec() != CompressedNdarrayCodec()
    assert CompressedImageCodec('png', 80) != CompressedImageCodec('jpeg', 80)
    assert ScalarCodec(pa.int32()) != ScalarCodec(pa.int64())
    assert str(NdarrayCodec()) == 'NdarrayCodec()'
    assert str(CompressedNdarrayCodec()) == 'CompressedNdarrayCodec()'


# --- scalar_column_to_numpy -------------------------------------------------------------------------------------

def test_scalar_column_strings():
    result = scalar_column_to_numpy(_field('s', np.str_, ()), pa.array(['a', 'bcd', 'ü']))
    assert result.dtype.kind == 'U'
    assert list(result) == ['a', 'bcd', 'ü']
    assert all(type(v) is np.str_ for v in result)
    chunked = pa.chunked_array([pa.array(['a']), pa.array(['bc'])])
    assert list(scalar_column_to_numpy(_field('s', np.str_, ()), chunked)) == ['a', 'bc']
    dictionary = pa.array(['x', 'y', 'x']).dictionary_encode()
    assert list(scalar_column_to_numpy(_field('s', np.str_, ()), dictionary)) == ['x', 'y', 'x']


def test_scalar_column_with_nulls_is_values_and_validity():
    result = scalar_column_to_numpy(_field('i', np.int32, (), None, True), pa.array([1, None, 3]))
    assert isinstance(result, MaskedColumn)
    assert result.values.dtype == np.int32
    assert result.values.tolist() == [1, 0, 3]
    assert result.valid.tolist() == [True, False, True]
    assert list(row_values(result)) == [1, None, 3]
    text = scalar_column_to_numpy(_field('s', np.str_, (), None, True), pa.array(['a', None]))
    assert isinstance(text, MaskedColumn)
    assert text.values.dtype.kind == 'U'
    assert list(row_values(text)) == ['a', None]
    assert type(next(row_values(text))) is np.str_


def test_scalar_column_casts_to_the_field_type():
    result = scalar_column_to_numpy(_field('u', np.uint8, ()), pa.array([1, 2], pa.int16()))
    assert result.dtype == np.uint8
    assert list(result) == [1, 2]


def test_scalar_column_lists_are_values_and_offsets():
    result = scalar_column_to_numpy(_field('l', np.int32, (None,)), pa.array([[1, 2], [3, 4], [5, 6]]))
    assert isinstance(result, ListColumn)
    assert result.values.dtype == np.int32
    assert result.offsets.tolist() == [0, 2, 4, 6]
    assert densified(result).tolist() == [[1, 2], [3, 4], [5, 6]]
    fixed = scalar_column_to_numpy(_field('f', np.int32, (2,)), pa.array([[1, 2], [3, 4]]))
    assert fixed.shape == (2, 2)
    reshaped = scalar_column_to_numpy(_field('m', np.float64, (2, 2)), pa.array([[1.0, 2.0, 3.0, 4.0]]))
    assert reshaped.shape == (1, 2, 2)


def test_scalar_column_ragged_lists_keep_their_offsets_and_null_rows():
    result = scalar_column_to_numpy(_field('l', np.int32, (None,), None, True),
                                    pa.array([[1, 2], [3], None, []]))
    assert isinstance(result, ListColumn)
    assert result.values.tolist() == [1, 2, 3]
    assert result.values.dtype == np.int32
    assert result.offsets.tolist() == [0, 2, 3, 3, 3]
    assert result.valid.tolist() == [True, True, False, True]
    rows = list(row_values(result))
    assert rows[0].tolist() == [1, 2]
    assert rows[2] is None
    assert rows[3].shape == (0,)


def test_scalar_column_refuses_lists_of_another_length_than_the_shape_fixes():
    with pytest.raises(CodecError, match='field f: stored lists hold'):
        scalar_column_to_numpy(_field('f', np.int32, (None, 3)), pa.array([[[1, 2, 3]], [[1, 2]]]))


def test_numpy_times_are_utc_and_decimals_are_range_checked():
    import datetime
    import decimal

    from petastorm.typemaps.scalars import to_arrow_scalar

    moment = to_arrow_scalar('t', pa.timestamp('us', tz='UTC'), np.datetime64('2021-01-01T00:00:01'))
    assert moment == datetime.datetime(2021, 1, 1, 0, 0, 1, tzinfo=datetime.timezone.utc)
    assert to_arrow_scalar('d', pa.decimal128(10, 9), decimal.Decimal('1.5')) == decimal.Decimal('1.5')
    with pytest.raises(SchemaError, match="field 'd'.*digits before the decimal point"):
        to_arrow_scalar('d', pa.decimal128(10, 9), decimal.Decimal('10.1'))
