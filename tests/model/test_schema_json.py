"""The versioned JSON form of a Unischema stored in dataset metadata."""

from __future__ import annotations

import decimal
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import PetastormMetadataError, SchemaError
from petastorm.metadata.schema_json import (
    FORMAT_VERSION,
    dtype_from_name,
    dtype_to_name,
    unischema_from_json,
    unischema_to_json,
)
from petastorm.unischema import Unischema, UnischemaField
from support.strategies import SCHEMA_DTYPES, unischemas

WHERE = '/data/set/_common_metadata (key petastorm.unischema.json)'


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unischemas())
def test_round_trip(schema):
    text = unischema_to_json(schema)
    restored = unischema_from_json(text, WHERE)
    assert restored == schema
    assert restored._name == schema._name
    assert list(restored.fields) == list(schema.fields)
    for name, field in schema.fields.items():
        other = restored.fields[name]
        assert other.numpy_dtype is field.numpy_dtype
        assert other.shape == tuple(field.shape)
        assert other.codec == field.codec
        assert type(other.codec) is type(field.codec)
        assert other.nullable == field.nullable
    assert unischema_from_json(text.encode('utf-8')) == schema  # bytes, as read from the metadata
    assert unischema_to_json(restored) == text  # stable text


def test_document_layout():
    schema = Unischema('Hello', [
        UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField('image', np.uint8, (None, 4, 3), CompressedImageCodec('jpeg', 70), True),
        UnischemaField('price', decimal.Decimal, (), None, False),
    ])
    document = json.loads(unischema_to_json(schema))
    assert document['format_version'] == FORMAT_VERSION == 1
    assert document['name'] == 'Hello'
    assert document['fields'] == [
        {'name': 'id', 'numpy_dtype': 'int32', 'shape': [], 'nullable': False,
         'codec': {'codec': 'scalar', 'type': 'int32'}},
        {'name': 'image', 'numpy_dtype': 'uint8', 'shape': [None, 4, 3], 'nullable': True,
         'codec': {'codec': 'compressed_image', 'format': 'jpeg', 'quality': 70}},
        {'name': 'price', 'numpy_dtype': 'Decimal', 'shape': [], 'nullable': False, 'codec': None},
    ]


@pytest.mark.parametrize('dtype', SCHEMA_DTYPES)
def test_dtype_names_round_trip(dtype):
    assert dtype_from_name(dtype_to_name(dtype)) is dtype


def test_dtype_to_name_accepts_dtype_instances_and_rejects_unknown():
    assert dtype_to_name(np.dtype('float32')) == 'float32'
    with pytest.raises(SchemaError, match="field 'f'"):
        dtype_to_name('no such type', 'f')


def test_unstorable_dtype_cannot_be_written():
    schema = Unischema('S', [UnischemaField('weird', 'no such type', (), None, False)])
    with pytest.raises(SchemaError, match='weird'):
        unischema_to_json(schema)


def _document(**overrides):
    document = {'format_version': 1, 'name': 'S',
                'fields': [{'name': 'a', 'numpy_dtype': 'int32', 'shape': [2], 'nullable': False,
                            'codec': {'codec': 'ndarray'}}]}
    document.update(overrides)
    return json.dumps(document)


def _field_document(**overrides):
    field = {'name': 'a', 'numpy_dtype': 'int32', 'shape': [2], 'nullable': False, 'codec': {'codec': 'ndarray'}}
    field.update(overrides)
    return _document(fields=[field])


def test_valid_document_parses():
    schema = unischema_from_json(_document(), WHERE)
    assert schema.fields['a'] == UnischemaField('a', np.int32, (2,), None, False)
    assert schema.fields['a'].codec == NdarrayCodec()


@pytest.mark.parametrize(('text', 'problem'), [
    ('{not json', 'not valid JSON'),
    (b'\xff\xfe\x00garbage', 'not valid JSON'),
    ('[1, 2]', 'must be a JSON object'),
    (_document(format_version=None), 'format_version'),
    (_document(format_version='1'), 'format_version'),
    (_document(format_version=0), 'format_version'),
    (_document(fields=None), '"fields"'),
    (_document(fields={'a': 1}), '"fields"'),
    (_document(fields=['a']), 'malformed field'),
    (_document(fields=[{'numpy_dtype': 'int32'}]), 'malformed field'),
    (_field_document(numpy_dtype='int33'), "unknown numpy_dtype 'int33'"),
    (_field_document(numpy_dtype=None), 'unknown numpy_dtype'),
    (_field_document(shape=[-1]), 'shape'),
    (_field_document(shape='2'), 'shape'),
    (_field_document(shape=[2.5]), 'shape'),
    (_field_document(codec={'codec': 'mystery_codec'}), "'mystery_codec'"),
    (_field_document(codec={'no_codec_key': 1}), 'unknown codec'),
    (_field_document(codec={'codec': 'compressed_image', 'format': 'gif'}), 'gif'),
])
def test_malformed_documents(text, problem):
    with pytest.raises(PetastormMetadataError) as info:
        unischema_from_json(text, WHERE)
    message = str(info.value)
    assert problem in message
    if 'gif' not in problem:  # the codec's own argument check does not know where it was called from
        assert WHERE in message


def test_future_format_version_asks_for_an_upgrade():
    with pytest.raises(PetastormMetadataError) as info:
        unischema_from_json(_document(format_version=FORMAT_VERSION + 1), WHERE)
    message = str(info.value)
    assert f'format_version {FORMAT_VERSION + 1}' in message
    assert 'Upgrade petastorm' in message
    assert WHERE in message


def test_unknown_codec_names_field_and_where():
    with pytest.raises(PetastormMetadataError) as info:
        unischema_from_json(_field_document(name='pixels', codec={'codec': 'webp'}), WHERE)
    assert "'pixels'" in str(info.value)
    assert "'webp'" in str(info.value)
    assert WHERE in str(info.value)


def test_missing_optional_keys_take_defaults():
    text = json.dumps({'format_version': 1, 'fields': [{'name': 'x', 'numpy_dtype': 'float64'}]})
    schema = unischema_from_json(text)
    assert schema._name == 'schema'
    assert schema.fields['x'] == UnischemaField('x', np.float64, (), None, False)
    assert schema.fields['x'].codec is None
