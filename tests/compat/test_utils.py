"""petastorm.utils.decode_row and petastorm.generator.generate_datapoint."""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pytest

from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import DecodeFieldError
from petastorm.generator import LIST_SIZE, generate_datapoint
from petastorm.unischema import Unischema, UnischemaField, encode_row
from petastorm.utils import decode_row

_KINDS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.float16, np.float32,
          np.float64, np.bool_, np.str_, np.bytes_, np.datetime64]


def _every_kind_schema() -> Unischema:
    fields = []
    for kind in _KINDS:
        name = np.dtype(kind).name
        fields.append(UnischemaField(f'scalar_{name}', kind, (), None, False))
        fields.append(UnischemaField(f'list_{name}', kind, (None,), None, False))
        if kind is not np.datetime64:
            fields.append(UnischemaField(f'ndarray_{name}', kind, (2, None), NdarrayCodec(), False))
            fields.append(UnischemaField(f'compressed_{name}', kind, (3,), CompressedNdarrayCodec(), True))
    fields += [
        UnischemaField('png_rgb', np.uint8, (4, 5, 3), CompressedImageCodec('png'), False),
        UnischemaField('png_grey16', np.uint16, (4, 5), CompressedImageCodec('png'), False),
        UnischemaField('jpeg', np.uint8, (8, 8, 3), CompressedImageCodec('jpeg', 90), False),
        UnischemaField('decimal_codec', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 3)), False),
        UnischemaField('decimal_native', decimal.Decimal, (), None, False),
        UnischemaField('sc_int', np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField('sc_uint8', np.uint8, (), ScalarCodec(pa.int16()), False),
        UnischemaField('sc_float', np.float32, (), ScalarCodec(pa.float32()), False),
        UnischemaField('sc_bool', np.bool_, (), ScalarCodec(pa.bool_()), False),
        UnischemaField('sc_str', np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField('sc_bytes', np.bytes_, (), ScalarCodec(pa.binary()), False),
        UnischemaField('sc_time', np.datetime64, (), ScalarCodec(pa.timestamp('us')), False),
    ]
    return Unischema('EveryKind', fields)


# --- generate_datapoint -------------------------------------------------------------------------------------------

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_generated_rows_are_accepted_by_encode_row(seed):
    schema = _every_kind_schema()
    row = generate_datapoint(schema, np.random.default_rng(seed))
    assert list(row) == list(schema.fields)
    encoded = encode_row(schema, row)
    # and the encoded row is storable as the schema's Arrow columns
    table = pa.Table.from_pylist([encoded], schema=schema.as_pyarrow_schema())
    assert table.num_rows == 1
    assert table.column('scalar_int32').null_count == 0


def test_generated_values_follow_type_and_shape():
    schema = _every_kind_schema()
    row = generate_datapoint(schema, np.random.default_rng(7))
    for name, field in schema.fields.items():
        value = row[name]
        if field.numpy_dtype is decimal.Decimal:
            assert isinstance(value, decimal.Decimal)
            continue
        if field.shape == ():
            assert np.asarray(value).shape == ()
        else:
            expected = tuple(LIST_SIZE if d is None else d for d in field.shape)
            assert value.shape == expected, name
            assert value.dtype.type is field.numpy_dtype, name


def test_generated_rows_are_seeded():
    schema = _every_kind_schema()
    a = generate_datapoint(schema, np.random.default_rng(3))
    b = generate_datapoint(schema, np.random.default_rng(3))
    c = generate_datapoint(schema, np.random.default_rng(4))
    assert all(np.array_equal(np.asarray(a[n]), np.asarray(b[n])) for n in schema.fields)
    assert not all(np.array_equal(np.asarray(a[n]), np.asarray(c[n])) for n in schema.fields)


def test_generate_unsupported_type():
    schema = Unischema('S', [UnischemaField('c', np.complex64, (), None, False)])
    with pytest.raises(ValueError, match='complex64'):
        generate_datapoint(schema)


# --- decode_row -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('seed', [0, 1])
def test_decode_row_inverts_encode_row(seed):
    schema = _every_kind_schema()
    row = generate_datapoint(schema, np.random.default_rng(seed))
    decoded = decode_row(encode_row(schema, row), schema)
    assert list(decoded) == list(schema.fields)
    for name, field in schema.fields.items():
        original, value = row[name], decoded[name]
        if name == 'jpeg':
            assert value.shape == original.shape
            continue
        if field.numpy_dtype is decimal.Decimal:
            assert value == original
            assert isinstance(value, decimal.Decimal)
            continue
        assert np.array_equal(np.asarray(value), np.asarray(original)), name
        if field.shape == ():
            assert type(value) is field.numpy_dtype, name
        else:
            assert isinstance(value, np.ndarray), name
            assert value.dtype.type is field.numpy_dtype, name


def test_decode_row_casts_drops_unknown_keys_and_keeps_none():
    schema = Unischema('S', [
        UnischemaField('small', np.uint8, (), None, False),
        UnischemaField('text', np.str_, (), None, True),
        UnischemaField('money', decimal.Decimal, (), None, False),
        UnischemaField('anything', None, (), None, False),
        UnischemaField('names', np.str_, (None,), None, False),
        UnischemaField('arr', np.int16, (2,), NdarrayCodec(), True),
    ])
    decoded = decode_row({'small': 7, 'text': None, 'money': '1.25', 'anything': {'k': 1},
                          'names': ['a', 'bc'], 'arr': None, 'not_in_schema': 5}, schema)
    assert set(decoded) == {'small', 'text', 'money', 'anything', 'names', 'arr'}
    assert type(decoded['small']) is np.uint8
    assert decoded['small'] == 7
    assert decoded['text'] is None
    assert decoded['arr'] is None
    assert decoded['money'] == decimal.Decimal('1.25')
    assert decoded['anything'] == {'k': 1}
    assert decoded['names'].tolist() == ['a', 'bc']
    assert decoded['names'].dtype.kind == 'U'


def test_decode_row_failure_names_the_field():
    schema = Unischema('S', [
        UnischemaField('ok', np.int32, (), None, False),
        UnischemaField('picture', np.uint8, (2, 2, 3), CompressedImageCodec('png'), False),
        UnischemaField('number', np.int32, (), None, False),
    ])
    with pytest.raises(DecodeFieldError, match='Decoding field "picture" failed') as info:
        decode_row({'ok': 1, 'picture': b'not a png'}, schema)
    assert info.value.__cause__ is not None
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(DecodeFieldError, match='"number"'):
        decode_row({'number': 'not a number'}, schema)
