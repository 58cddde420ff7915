"""Fuzzing: codec decoding and metadata parsing fed random and mutated bytes raise only documented exceptions.

Documented means a :class:`~petastorm.errors.PetastormError` subclass (``CodecError``, ``PetastormMetadataError``,
``SchemaError``...). Inputs are random bytes and valid payloads with bytes replaced, inserted or cut off. Runs are
derandomized and bounded so that the suite is reproducible and quick.
"""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, codec_from_json
from petastorm.errors import PetastormError
from petastorm.metadata.legacy import restricted_loads, unischema_from_legacy_pickle
from petastorm.metadata.legacy_write import unischema_to_legacy_pickle
from petastorm.metadata.schema_json import unischema_from_json, unischema_to_json
from petastorm.unischema import UnischemaField
from reliability.helpers import SmallSchema

_BOUNDED = {'deadline': None, 'derandomize': True, 'database': None,
            'suppress_health_check': [HealthCheck.too_slow, HealthCheck.data_too_large]}
#: decoding examples are slower (image and archive decoders), parsing examples are cheap.
FUZZ = settings(max_examples=60, **_BOUNDED)
FUZZ_PARSING = settings(max_examples=150, **_BOUNDED)

MATRIX = UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False)
PACKED = UnischemaField('packed', np.int16, (None,), CompressedNdarrayCodec(), False)
PNG = UnischemaField('image', np.uint8, (4, 4, 3), CompressedImageCodec('png'), False)
JPEG = UnischemaField('photo', np.uint8, (8, 8), CompressedImageCodec('jpeg'), False)
FIELDS = [MATRIX, PACKED, PNG, JPEG]


def _valid_payload(field: UnischemaField) -> bytes:
    rng = np.random.default_rng(0)
    if field is MATRIX:
        return field.codec.encode(field, rng.random((2, 3), dtype=np.float32))
    if field is PACKED:
        return field.codec.encode(field, np.arange(5, dtype=np.int16))
    if field is PNG:
        return field.codec.encode(field, rng.integers(0, 255, (4, 4, 3), dtype=np.uint8))
    return field.codec.encode(field, rng.integers(0, 255, (8, 8), dtype=np.uint8))


@st.composite
def mutated(draw, original: bytes) -> bytes:
    """``original`` with a few bytes replaced, a chunk inserted, and possibly cut short."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        position = draw(st.integers(0, len(data)))
        data[position:position] = draw(st.binary(max_size=16))
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    return bytes(data)


def _payloads(field: UnischemaField):
    return st.one_of(st.binary(max_size=300), mutated(_valid_payload(field)))


def _only_documented(call, *args):
    try:
        call(*args)
    except PetastormError:
        pass


@pytest.mark.parametrize('field', FIELDS, ids=[f.name for f in FIELDS])
def test_decoding_random_or_mutated_values(field, figures):
    examples = []

    @FUZZ
    @given(payload=_payloads(field))
    def run(payload):
        examples.append(1)
        _only_documented(field.codec.decode, field, payload)

    run()
    figures.tally('fuzzing (examples, only documented exceptions)', 'codec decode', examples=len(examples))


@pytest.mark.parametrize('field', FIELDS, ids=[f.name for f in FIELDS])
def test_decoding_whole_columns_of_random_or_mutated_values(field, figures):
    examples = []

    @FUZZ
    @given(payloads=st.lists(_payloads(field), min_size=1, max_size=4), repeat=st.booleans())
    def run(payloads, repeat):
        examples.append(1)
        # Equal payloads take the columnar fast path of the .npy decoder: fuzz that path too.
        values = [payloads[0]] * len(payloads) if repeat else payloads
        _only_documented(field.codec.decode_column, field, pa.array(values, type=pa.binary()))

    run()
    figures.tally('fuzzing (examples, only documented exceptions)', 'codec decode_column', examples=len(examples))


def test_npy_with_object_dtype_never_unpickles():
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ('an object array inside a .npy payload was unpickled',))

    buffer = io.BytesIO()
    np.save(buffer, np.array([Boom()], dtype=object), allow_pickle=True)
    with pytest.raises(PetastormError):
        MATRIX.codec.decode(MATRIX, buffer.getvalue())


_JSON = unischema_to_json(SmallSchema).encode()
_LEGACY = unischema_to_legacy_pickle(SmallSchema)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@st.composite
def schema_documents(draw) -> bytes:
    """A valid schema document with one part replaced by an arbitrary JSON value."""
    document = json.loads(_JSON)
    field = draw(st.sampled_from(document['fields']))
    key = draw(st.sampled_from(sorted(field) + ['codec.type', 'top']))
    value = draw(json_values)
    if key == 'top':
        document[draw(st.sampled_from(['format_version', 'fields', 'name']))] = value
    elif key == 'codec.type' and isinstance(field.get('codec'), dict):
        field['codec']['type'] = value
    else:
        field[key] = value
    return json.dumps(document).encode()


def test_parsing_schema_json(figures):
    examples = []

    @FUZZ_PARSING
    @given(text=st.one_of(st.binary(max_size=200), mutated(_JSON), schema_documents()))
    def run(text):
        examples.append(1)
        _only_documented(unischema_from_json, text, 'fuzzed metadata')

    run()
    figures.tally('fuzzing (examples, only documented exceptions)', 'schema JSON', examples=len(examples))


def test_parsing_codec_descriptions(figures):
    examples = []

    @FUZZ_PARSING
    @given(description=st.dictionaries(st.sampled_from(['codec', 'type', 'format', 'quality', 'unit', 'precision']),
                                       json_values, max_size=4))
    def run(description):
        examples.append(1)
        _only_documented(codec_from_json, description, 'fuzzed codec')

    run()
    figures.tally('fuzzing (examples, only documented exceptions)', 'codec JSON', examples=len(examples))


def test_parsing_legacy_pickles(figures):
    examples = []
    protocols = [pickle.dumps({'a': [1, 2.0, 'x']}, protocol=p) for p in range(0, 6)]

    @FUZZ_PARSING
    @given(data=st.one_of(st.binary(max_size=200), mutated(_LEGACY), st.sampled_from(protocols).flatmap(mutated)))
    def run(data):
        examples.append(1)
        _only_documented(restricted_loads, data, 'fuzzed pickle')
        _only_documented(unischema_from_legacy_pickle, data, 'fuzzed pickle')

    run()
    figures.tally('fuzzing (examples, only documented exceptions)', 'legacy pickle', examples=len(examples))
