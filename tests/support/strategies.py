"""Hypothesis strategies shared by the property tests: dtypes, shapes, arrays, images and whole schemas."""

from __future__ import annotations

import decimal
import keyword

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from petastorm.codecs import (
    AudioCodec,
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    VideoCodec,
)
from petastorm.unischema import Unischema, UnischemaField

#: numeric and boolean scalar types that the ndarray codecs store.
NUMERIC_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                  np.float16, np.float32, np.float64, np.complex64, np.complex128, np.bool_]
#: every scalar type an ndarray field may have (fixed-width text and bytes included).
ARRAY_DTYPES = NUMERIC_DTYPES + [np.str_, np.bytes_]
#: every numpy_dtype the schema metadata can name.
SCHEMA_DTYPES = ARRAY_DTYPES + [np.datetime64, np.timedelta64, decimal.Decimal]

#: Arrow types a ScalarCodec may carry (besides decimals and timestamps, which take parameters).
SIMPLE_ARROW_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
                      pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.string(),
                      pa.large_string(), pa.binary(), pa.large_binary(), pa.date32(), pa.date64()]


def array_dtypes() -> st.SearchStrategy:
    return st.sampled_from(ARRAY_DTYPES)


def field_shapes(max_dims: int = 3, max_side: int = 4, allow_none: bool = True) -> st.SearchStrategy:
    """Declared field shapes: ``()`` up to ``max_dims`` dimensions, some of them ``None`` (variable)."""
    side = st.integers(0, max_side)
    if allow_none:
        side = st.one_of(side, st.none())
    return st.lists(side, max_size=max_dims).map(tuple)


def concrete_shape(declared: tuple) -> st.SearchStrategy:
    """An actual array shape that fits ``declared`` (each ``None`` becomes some size, possibly 0)."""
    return st.tuples(*[st.integers(0, 4) if d is None else st.just(d) for d in declared])


def _elements(dtype: type) -> st.SearchStrategy | None:
    kind = np.dtype(dtype).kind
    if kind == 'U':
        return st.text(alphabet=st.characters(blacklist_categories=('Cs',), blacklist_characters='\x00'),
                       max_size=5)
    if kind == 'S':
        return st.binary(max_size=5).map(lambda b: b.rstrip(b'\x00'))
    return None  # hypothesis' defaults: every value of the type, NaN and infinities included


def arrays(dtype: type, shape: tuple) -> st.SearchStrategy:
    """Arrays of exactly ``dtype`` (native byte order) and ``shape``."""
    if np.dtype(dtype).kind in 'US':
        size = int(np.prod(shape))
        return st.lists(_elements(dtype), min_size=size, max_size=size).map(
            lambda items: np.array(items, dtype=dtype).reshape(shape))
    return hnp.arrays(np.dtype(dtype), shape, elements=_elements(dtype))


@st.composite
def field_and_array(draw, dtypes=None, max_dims: int = 3) -> tuple[UnischemaField, np.ndarray]:
    """A field with a declared shape (maybe with ``None`` dims) and an array that fits it."""
    dtype = draw(st.sampled_from(dtypes or ARRAY_DTYPES))
    declared = draw(field_shapes(max_dims=max_dims))
    value = draw(arrays(dtype, draw(concrete_shape(declared))))
    return UnischemaField('value', dtype, declared, None, False), value


@st.composite
def images(draw, dtype=None, channels=None, max_side: int = 12) -> np.ndarray:
    """uint8/uint16 images, grey ``(H, W)`` or RGB ``(H, W, 3)``."""
    dtype = dtype or draw(st.sampled_from([np.uint8, np.uint16]))
    channels = channels if channels is not None else draw(st.sampled_from([1, 3]))
    height, width = draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    shape = (height, width) if channels == 1 else (height, width, 3)
    return draw(hnp.arrays(dtype, shape))


def arrow_scalar_types() -> st.SearchStrategy:
    decimals = st.integers(1, 38).flatmap(
        lambda precision: st.integers(0, precision).map(lambda scale: pa.decimal128(precision, scale)))
    timestamps = st.builds(pa.timestamp, st.sampled_from(['s', 'ms', 'us', 'ns']),
                           tz=st.sampled_from([None, 'UTC', 'Europe/Paris']))
    return st.one_of(st.sampled_from(SIMPLE_ARROW_TYPES), decimals, timestamps)


def codecs() -> st.SearchStrategy:
    """Every codec kind with random parameters."""
    return st.one_of(
        st.just(NdarrayCodec()),
        st.just(CompressedNdarrayCodec()),
        st.builds(CompressedImageCodec, st.sampled_from(['png', 'jpeg', 'jpg', '.png', 'PNG']),
                  st.integers(0, 100)),
        arrow_scalar_types().map(ScalarCodec),
        media_codecs(),
    )


def media_codecs() -> st.SearchStrategy:
    """Audio and video codecs with random parameters (every way of sampling frames)."""
    layouts = st.sampled_from(['bytes', 'hf'])
    audio = st.builds(AudioCodec, st.none() | st.integers(1, 192000), st.none() | st.integers(1, 8), st.booleans(),
                      layouts, st.sampled_from(['flac', 'wav']))
    clips = st.builds(lambda n, stride, start, layout: VideoCodec(n, stride, start, layout=layout),
                      st.none() | st.integers(1, 64), st.integers(1, 8),
                      st.sampled_from(['first', 'middle', 'random']) | st.integers(0, 1000), layouts)
    picks = st.builds(lambda indices, rate: VideoCodec(indices=indices, frame_rate=rate),
                      st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=5), st.sampled_from([24, 29.97, 30]))
    times = st.builds(lambda times, crf: VideoCodec(timestamps=times, crf=crf),
                      st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=5), st.integers(0, 51))
    return st.one_of(audio, clips, picks, times)


field_names = st.from_regex(r'[A-Za-z][A-Za-z0-9_]{0,11}', fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name) and not hasattr(Unischema, name))


@st.composite
def unischema_fields(draw, name=None) -> UnischemaField:
    """A field with any storable dtype, a shape, any codec (or none) and a nullability flag."""
    return UnischemaField(
        name if name is not None else draw(field_names),
        draw(st.sampled_from(SCHEMA_DTYPES)),
        draw(field_shapes()),
        draw(st.one_of(st.none(), codecs())),
        draw(st.booleans()),
    )


@st.composite
def unischemas(draw, max_fields: int = 8) -> Unischema:
    """A schema with distinct field names and random fields (codecs need not fit the dtype: metadata only)."""
    names = draw(st.lists(field_names, min_size=0, max_size=max_fields, unique=True))
    return Unischema(draw(field_names), [draw(unischema_fields(name=n)) for n in names])
