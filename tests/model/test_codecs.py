"""Codecs: byte formats, round trips, columnar decoding, scalar conversion, JSON descriptions, corrupt data."""

from __future__ import annotations

import io
import zipfile

import cv2
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from petastorm.codecs import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    stack_or_objects,
)
from petastorm.errors import CodecError, SchemaError
from petastorm.unischema import UnischemaField
from support.strategies import ARRAY_DTYPES, NUMERIC_DTYPES, arrays, field_and_array, images

PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _field(name, dtype, shape=(), codec=None, nullable=False):
    return UnischemaField(name, dtype, shape, codec, nullable)


def _assert_identical(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same dtype, shape and bytes (NaNs and signed zeros included)."""
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


def _npy_bytes(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value)
    return buffer.getvalue()


# --- NdarrayCodec / CompressedNdarrayCodec ---------------------------------------------------------------------

@PROPERTY
@given(field_and_array())
def test_ndarray_codec_round_trip_is_plain_npy(field_value):
    field, value = field_value
    codec = NdarrayCodec()
    encoded = codec.encode(field, value)
    assert bytes(encoded) == _npy_bytes(value)
    _assert_identical(np.load(io.BytesIO(encoded)), value)
    _assert_identical(codec.decode(field, encoded), value)


@PROPERTY
@given(field_and_array())
def test_compressed_ndarray_codec_round_trip_is_plain_npz(field_value):
    field, value = field_value
    codec = CompressedNdarrayCodec()
    encoded = codec.encode(field, value)
    with zipfile.ZipFile(io.BytesIO(encoded)) as archive:
        assert archive.namelist() == ['arr.npy']
        assert archive.getinfo('arr.npy').compress_type == zipfile.ZIP_DEFLATED
        assert archive.read('arr.npy') == _npy_bytes(value)
    with np.load(io.BytesIO(encoded)) as plain:
        _assert_identical(plain['arr'], value)
    _assert_identical(codec.decode(field, encoded), value)


@pytest.mark.parametrize('codec', [NdarrayCodec(), CompressedNdarrayCodec()])
@pytest.mark.parametrize(('dtype', 'shape', 'value'), [
    (np.float64, (), np.array(2.5)),
    (np.int32, (0,), np.zeros(0, np.int32)),
    (np.int16, (None, 3), np.zeros((0, 3), np.int16)),
    (np.uint8, (2, 0, 4), np.zeros((2, 0, 4), np.uint8)),
    (np.str_, (None,), np.array(['a', 'ßü', ''])),
    (np.bytes_, (2,), np.array([b'x', b'yz'])),
    (np.bool_, (2, 2), np.array([[True, False], [False, True]])),
    (np.float32, (3, 2), np.arange(6, dtype=np.float32).reshape(2, 3).T),  # Fortran-ordered
])
def test_ndarray_codecs_edge_shapes(codec, dtype, shape, value):
    field = _field('edge', dtype, shape, codec)
    decoded = codec.decode(field, codec.encode(field, value))
    assert decoded.dtype == value.dtype
    assert decoded.shape == value.shape
    assert np.array_equal(decoded, value)


@pytest.mark.parametrize('codec', [NdarrayCodec(), CompressedNdarrayCodec()])
def test_ndarray_codecs_check_type_and_shape(codec):
    field = _field('grid', np.float32, (None, 2), codec)
    with pytest.raises(SchemaError, match=r'grid.*float32.*float64'):
        codec.encode(field, np.zeros((3, 2), np.float64))
    with pytest.raises(SchemaError, match=r'Unexpected dimensions of grid'):
        codec.encode(field, np.zeros((3, 3), np.float32))
    with pytest.raises(SchemaError, match=r'Unexpected dimensions of grid'):
        codec.encode(field, np.zeros((2,), np.float32))
    with pytest.raises(SchemaError, match=r'grid.*numpy.ndarray'):
        codec.encode(field, [[1.0, 2.0]])


def test_ndarray_codec_refuses_object_arrays():
    field = _field('objs', np.object_, (2,), NdarrayCodec())
    with pytest.raises(SchemaError, match='objs'):
        NdarrayCodec().encode(field, np.array([1, 'a'], dtype=object))


# --- decode_column ------------------------------------------------------------------------------------------------

def _column(codec, field, values):
    return pa.array([None if v is None else codec.encode(field, v) for v in values], type=pa.binary())


@PROPERTY
@given(st.sampled_from(ARRAY_DTYPES).flatmap(
    lambda dtype: st.tuples(st.just(dtype), st.lists(st.integers(0, 3), max_size=3).map(tuple))).flatmap(
    lambda dt_shape: st.tuples(st.just(dt_shape[0]), st.just(dt_shape[1]),
                               st.lists(arrays(*dt_shape), min_size=1, max_size=6))),
    st.sampled_from([NdarrayCodec(), CompressedNdarrayCodec()]))
def test_decode_column_of_uniform_values_equals_per_value_decode(dtype_shape_values, codec):
    dtype, shape, values = dtype_shape_values
    field = _field('col', dtype, shape, codec)
    column = _column(codec, field, values)
    expected = [codec.decode(field, codec.encode(field, v)) for v in values]
    decoded = codec.decode_column(field, column)
    if all(e.dtype == expected[0].dtype for e in expected):
        _assert_identical(decoded, np.stack(expected))
    else:  # text arrays of different widths cannot be stacked into one dtype
        assert decoded.dtype == object
        assert len(decoded) == len(values)
        for got, want in zip(decoded, expected, strict=True):
            _assert_identical(got, want)


@pytest.mark.parametrize('dtype', NUMERIC_DTYPES)
def test_ndarray_decode_column_fast_path_does_not_decode_per_value(dtype, monkeypatch):
    codec = NdarrayCodec()
    field = _field('col', dtype, (2, 3), codec)
    values = [np.full((2, 3), i).astype(dtype) for i in range(5)]
    column = _column(codec, field, values)

    def refuse(*_args):
        raise AssertionError('per-value decode was used for a uniform column')

    monkeypatch.setattr(NdarrayCodec, 'decode', refuse)
    decoded = codec.decode_column(field, column)
    _assert_identical(decoded, np.stack(values))
    # Slices and chunked columns (offsets into a shared buffer) take the same path.
    _assert_identical(codec.decode_column(field, column.slice(1, 3)), np.stack(values[1:4]))
    chunked = pa.chunked_array([column.slice(0, 2), column.slice(2)])
    _assert_identical(codec.decode_column(field, chunked), np.stack(values))
    _assert_identical(codec.decode_column(field, column.cast(pa.large_binary())), np.stack(values))


@pytest.mark.parametrize('codec', [NdarrayCodec(), CompressedNdarrayCodec()])
def test_decode_column_mixed_shapes_and_nulls_gives_object_array(codec):
    field = _field('col', np.float32, (None, 2), codec, nullable=True)
    values = [np.ones((1, 2), np.float32), None, np.zeros((3, 2), np.float32),
              np.arange(4, dtype=np.float32).reshape(2, 2).T]
    decoded = codec.decode_column(field, _column(codec, field, values))
    assert decoded.dtype == object
    assert decoded.shape == (4,)
    assert decoded[1] is None
    for got, want in zip(decoded[[0, 2, 3]], [values[0], values[2], values[3]], strict=True):
        assert np.array_equal(got, want)
        assert got.dtype == want.dtype


@pytest.mark.parametrize('codec', [NdarrayCodec(), CompressedNdarrayCodec()])
def test_decode_column_all_same_shape_with_a_null(codec):
    field = _field('col', np.int64, (2,), codec, nullable=True)
    decoded = codec.decode_column(field, _column(codec, field, [np.array([1, 2]), None]))
    assert decoded.dtype == object
    assert np.array_equal(decoded[0], [1, 2])
    assert decoded[1] is None


def test_decode_column_of_empty_column():
    codec = NdarrayCodec()
    field = _field('col', np.int64, (2,), codec)
    decoded = codec.decode_column(field, pa.array([], pa.binary()))
    assert len(decoded) == 0



def test_stack_or_objects_takes_a_list_or_a_counted_iterable():
    values = [np.arange(3), np.arange(3) + 3]
    np.testing.assert_array_equal(stack_or_objects(values), np.stack(values))
    np.testing.assert_array_equal(stack_or_objects(iter(values), 2), np.stack(values))
    ragged = stack_or_objects(value for value in [np.arange(2), None, np.arange(3)])
    assert ragged.dtype == object
    assert ragged[1] is None
    assert ragged[2].tolist() == [0, 1, 2]


@pytest.mark.parametrize('codec', [NdarrayCodec(), CompressedNdarrayCodec()])
@pytest.mark.parametrize('values', [[np.ones(2, np.int64)] * 2, [np.ones(2, np.int64), np.ones(3, np.int64)]],
                         ids=['stacked', 'ragged'])
def test_decode_column_refuses_arrays_not_of_the_field(codec, values):
    written = _field('col', np.int64, (None,), codec)
    column = _column(codec, written, values)
    with pytest.raises(CodecError, match='field col: the stored array has dtype int64; the schema expects float32'):
        codec.decode_column(_field('col', np.float32, (None,), codec), column)
    with pytest.raises(CodecError, match=r'field col: the stored array has shape \(2,\); the schema expects \(2, 1\)'):
        codec.decode_column(_field('col', np.int64, (2, 1), codec), column)


def test_decode_column_rejects_non_binary_columns():
    codec = NdarrayCodec()
    with pytest.raises(CodecError, match='binary'):
        codec.decode_column(_field('col', np.int64, (2,), codec), pa.array([1, 2]))


# --- CompressedImageCodec -----------------------------------------------------------------------------------------

@PROPERTY
@given(st.one_of(images(dtype=np.uint8, channels=3), images(dtype=np.uint8, channels=1),
                 images(dtype=np.uint16, channels=1), images(dtype=np.uint16, channels=3)))
def test_png_round_trip_is_exact(image):
    codec = CompressedImageCodec('png')
    field = _field('image', image.dtype.type, image.shape, codec)
    encoded = codec.encode(field, image)
    assert bytes(encoded[:8]) == b'\x89PNG\r\n\x1a\n'
    _assert_identical(codec.decode(field, encoded), image)
    # The file is a standard RGB PNG: a plain decoder (BGR in OpenCV's convention) sees the same pixels.
    plain = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_UNCHANGED)
    if image.ndim == 3:
        plain = cv2.cvtColor(plain, cv2.COLOR_BGR2RGB)
    _assert_identical(plain, image)


def test_png_red_pixel_stays_red():
    codec = CompressedImageCodec('png')
    image = np.zeros((2, 2, 3), np.uint8)
    image[..., 0] = 255  # pure red in RGB
    field = _field('image', np.uint8, (2, 2, 3), codec)
    encoded = codec.encode(field, image)
    bgr = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR)
    assert (bgr[..., 2] == 255).all()
    assert (bgr[..., :2] == 0).all()
    # and an RGB PNG written by a third party (OpenCV from BGR) decodes to red
    _, foreign = cv2.imencode('.png', bgr)
    assert np.array_equal(codec.decode(field, foreign.tobytes()), image)


def _smooth_image(height, width, channels, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    planes = [(127 + 100 * np.sin(x / (7 + c) + y / (11 + 3 * c))) for c in range(channels)]
    image = np.stack(planes, axis=-1) + rng.normal(0, 2, (height, width, channels))
    image = np.clip(image, 0, 255).astype(np.uint8)
    return image[..., 0] if channels == 1 else image


@pytest.mark.parametrize('channels', [1, 3])
def test_jpeg_round_trip_within_tolerance(channels):
    codec = CompressedImageCodec('jpeg', 95)
    image = _smooth_image(48, 64, channels)
    field = _field('image', np.uint8, image.shape, codec)
    encoded = codec.encode(field, image)
    assert bytes(encoded[:2]) == b'\xff\xd8'
    decoded = codec.decode(field, encoded)
    assert decoded.shape == image.shape
    assert decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - image.astype(int)).mean() < 2.0
    if channels == 3:  # channel order survives: a plain decoder agrees after BGR->RGB
        plain = cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR),
                             cv2.COLOR_BGR2RGB)
        assert np.array_equal(plain, decoded)


def test_jpeg_quality_changes_the_size():
    image = _smooth_image(64, 64, 3)
    low, high = CompressedImageCodec('jpeg', 10), CompressedImageCodec('jpeg', 95)
    field = _field('image', np.uint8, image.shape, None)
    assert len(low.encode(field, image)) < len(high.encode(field, image))


def test_image_decode_column_with_nulls_and_uniform():
    codec = CompressedImageCodec('png')
    field = _field('image', np.uint8, (4, 5, 3), codec, nullable=True)
    images_ = [np.full((4, 5, 3), i, np.uint8) for i in range(3)]
    stacked = codec.decode_column(field, _column(codec, field, images_))
    _assert_identical(stacked, np.stack(images_))
    with_null = codec.decode_column(field, _column(codec, field, [images_[0], None]))
    assert with_null.dtype == object
    assert with_null[1] is None
    assert np.array_equal(with_null[0], images_[0])


@pytest.mark.parametrize(('args', 'match'), [
    (('gif',), 'png'), (('png', 101), 'quality'), (('png', -1), 'quality'), (('jpeg', 5.5), 'quality'),
    (('jpeg', '80'), 'quality'),
])
def test_compressed_image_codec_bad_args(args, match):
    with pytest.raises(ValueError, match=match):
        CompressedImageCodec(*args)


def test_compressed_image_codec_accepts_spellings():
    assert CompressedImageCodec('.png').image_codec == 'png'
    assert CompressedImageCodec('JPG').image_codec == 'jpeg'
    assert CompressedImageCodec('jpeg', 90).quality == 90
    assert str(CompressedImageCodec('jpeg', 90)) == "CompressedImageCodec('jpeg', 90)"


@pytest.mark.parametrize(('codec', 'dtype', 'shape', 'match'), [
    (CompressedImageCodec('png'), np.uint8, (4, 4, 4), 'Unexpected image dimensions of pic'),
    (CompressedImageCodec('png'), np.uint8, (2, 4, 4, 3), 'Unexpected image dimensions of pic'),
    (CompressedImageCodec('png'), np.float32, (4, 4, 3), 'pic'),
    (CompressedImageCodec('jpeg'), np.uint16, (4, 4), 'pic'),
])
def test_compressed_image_codec_bad_images(codec, dtype, shape, match):
    field = _field('pic', dtype, shape, codec)
    with pytest.raises(SchemaError, match=match):
        codec.encode(field, np.zeros(shape, dtype))


def test_compressed_image_codec_checks_the_field():
    codec = CompressedImageCodec('png')
    field = _field('pic', np.uint8, (4, 4, 3), codec)
    with pytest.raises(SchemaError, match='pic'):
        codec.encode(field, np.zeros((4, 5, 3), np.uint8))
    with pytest.raises(SchemaError, match='pic'):
        codec.encode(field, np.zeros((4, 4, 3), np.uint16))


# --- corrupt payloads ---------------------------------------------------------------------------------------------

_BINARY_CODECS = [NdarrayCodec(), CompressedNdarrayCodec(), CompressedImageCodec('png'),
                  CompressedImageCodec('jpeg')]


@PROPERTY
@given(st.sampled_from(_BINARY_CODECS), st.binary(max_size=64))
def test_corrupt_payload_raises_codec_error_naming_the_field(codec, payload):
    field = _field('broken_field', np.uint8, (None, None), codec)
    with pytest.raises(CodecError, match='broken_field'):
        codec.decode(field, payload)


@pytest.mark.parametrize('codec', _BINARY_CODECS)
def test_truncated_and_foreign_payloads(codec):
    field = _field('broken_field', np.uint8, (8, 8), codec)
    good = codec.encode(field, np.arange(64, dtype=np.uint8).reshape(8, 8))
    other = NdarrayCodec() if isinstance(codec, CompressedNdarrayCodec) else CompressedNdarrayCodec()
    foreign = other.encode(field, np.zeros((8, 8), np.uint8))
    for payload in (good[:len(good) // 2], good[:-3], b'', foreign):
        if payload == foreign and isinstance(codec, CompressedImageCodec):
            continue
        with pytest.raises(CodecError, match='broken_field'):
            codec.decode(field, payload)
    column = pa.array([good, good[:-3]], pa.binary())
    with pytest.raises(CodecError, match='broken_field'):
        codec.decode_column(field, column)
