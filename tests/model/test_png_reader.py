"""Our PNG reader (libdeflate + compiled row filters) against OpenCV on files that exercise every filter.

OpenCV writes every row with the "sub" filter, so these tests write their own files: each of the five filter
types on every row, a different one per row, and Pillow's adaptive choice, in every plain kind (grey, RGB, RGBA;
8 and 16 bits), odd sizes, image data split over many chunks. Damaged files must be refused by the reader (the
codec then hands them to OpenCV, which has the last word).
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest

from petastorm.codecs import CompressedImageCodec
from petastorm.codecs._image_formats import plain_layout
from petastorm.errors import CodecError
from petastorm.unischema import UnischemaField

cv2 = pytest.importorskip('cv2')
png_reader = pytest.importorskip('petastorm.codecs._png_reader')
from petastorm.codecs import _png_rows  # noqa: E402  (built with the reader above)

_COLOUR_TYPES = {1: 0, 3: 2, 4: 6}


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))


def _predictors(row: np.ndarray, above: np.ndarray, bpp: int) -> dict[int, np.ndarray]:
    """What each filter type predicts for every byte of ``row`` (ints), from the unfiltered bytes around it."""
    left = np.concatenate([np.zeros(bpp, int), row[:-bpp]])
    upper_left = np.concatenate([np.zeros(bpp, int), above[:-bpp]])
    estimate = left + above - upper_left
    far_left, far_above, far_corner = (np.abs(estimate - v) for v in (left, above, upper_left))
    paeth = np.where((far_left <= far_above) & (far_left <= far_corner), left,
                     np.where(far_above <= far_corner, above, upper_left))
    return {0: np.zeros_like(row), 1: left, 2: above, 3: (left + above) // 2, 4: paeth}


def _png_with_filters(pixels: np.ndarray, filters: list[int], chunk_size: int = 1 << 20,
                      interlaced: bool = False) -> bytes:
    """A PNG of ``pixels`` (RGB / RGBA / grey, uint8 or uint16) whose row r uses ``filters[r % len(filters)]``."""
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    sample_bytes = pixels.dtype.itemsize
    rows = np.frombuffer(pixels.astype(pixels.dtype.newbyteorder('>')).tobytes(), np.uint8).reshape(height, -1)
    bpp = channels * sample_bytes
    lines, above = [], np.zeros(rows.shape[1], int)
    for number, row in enumerate(rows.astype(int)):
        kind = filters[number % len(filters)]
        lines.append(bytes([kind]) + ((row - _predictors(row, above, bpp)[kind]) % 256).astype(np.uint8).tobytes())
        above = row
    stream = zlib.compress(b''.join(lines), 6)
    header = struct.pack('>IIBBBBB', width, height, 8 * sample_bytes, _COLOUR_TYPES[channels], 0, 0,
                         int(interlaced))
    data = b''.join(_chunk(b'IDAT', stream[i:i + chunk_size]) for i in range(0, len(stream), chunk_size))
    return b'\x89PNG\r\n\x1a\n' + _chunk(b'IHDR', header) + data + _chunk(b'IEND', b'')


def _image(height: int, width: int, channels: int, dtype, seed: int) -> np.ndarray:
    """Smooth ramps plus noise: neighbouring bytes differ by small and by large amounts."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    ramps = np.add.outer(np.arange(height) * 7, np.arange(width) * 3)[..., None] * (np.arange(channels) + 1)
    image = (ramps * (top // 255) + rng.integers(0, top // 8, (height, width, channels))) % (top + 1)
    image = image.astype(dtype)
    return image[..., 0] if channels == 1 else image


def _opencv(payload: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if image.ndim == 3 and image.shape[2] == 3 else image


def _ours(payload: bytes, out: np.ndarray | None = None) -> np.ndarray:
    return png_reader.PngReader().decode(memoryview(payload), plain_layout(payload), out)


def _assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert np.array_equal(actual, expected), f'{np.count_nonzero(actual != expected)} samples differ'


@pytest.mark.parametrize('dtype', [np.uint8, np.uint16])
@pytest.mark.parametrize('channels', [1, 3, 4])
@pytest.mark.parametrize('filters', [[0], [1], [2], [3], [4], [4, 2, 0, 3, 1, 1, 4]], ids=str)
def test_every_filter_gives_opencvs_pixels(channels, dtype, filters):
    for height, width in ((1, 1), (5, 3), (23, 41)):
        payload = _png_with_filters(_image(height, width, channels, dtype, seed=height), filters, chunk_size=97)
        _assert_same(_ours(payload), _opencv(payload))


@pytest.mark.parametrize('mode', ['L', 'RGB', 'RGBA', 'I;16'])
def test_files_written_by_pillow_with_adaptive_filters(mode):
    image_module = pytest.importorskip('PIL.Image')
    pixels = _image(37, 53, {'L': 1, 'RGB': 3, 'RGBA': 4, 'I;16': 1}[mode],
                    np.uint16 if mode == 'I;16' else np.uint8, seed=3)
    buffer = io.BytesIO()
    image = image_module.fromarray(pixels)  # uint8 grey, RGB, RGBA or 16-bit grey
    assert image.mode == mode
    image.save(buffer, format='PNG', optimize=True)
    payload = buffer.getvalue()
    reference = _opencv(payload)
    _assert_same(_ours(payload), reference)
    # Through the codec's column path: written into one preallocated array.
    codec = CompressedImageCodec('png')
    field = UnischemaField('picture', reference.dtype, reference.shape, codec)
    column = codec.decode_column(field, pa.array([payload, payload], pa.binary()))
    _assert_same(column[1], reference)


def test_writes_into_the_given_buffer_and_copes_with_a_strided_one():
    payload = _png_with_filters(_image(9, 11, 3, np.uint8, seed=1), [4, 1])
    out = np.zeros((9, 11, 3), np.uint8)
    assert _ours(payload, out) is out
    _assert_same(out, _opencv(payload))
    strided = np.zeros((9, 22, 3), np.uint8)[:, ::2]
    _assert_same(_ours(payload, strided), _opencv(payload))


def _damaged(payload: bytes) -> dict[str, bytes]:
    idat = payload.index(b'IDAT')
    body_start = idat + 4
    length, = struct.unpack_from('>I', payload, idat - 4)
    crc_at = body_start + length
    return {
        'bad IDAT CRC': payload[:crc_at] + bytes([payload[crc_at] ^ 1]) + payload[crc_at + 1:],
        'bad IHDR CRC': payload[:29] + bytes([payload[29] ^ 1]) + payload[30:],
        'bytes of the stream zeroed (CRC fixed)': _rechunked(payload, lambda stream: stream[:10] + bytes(8)
                                                             + stream[18:]),
        'stream cut short (CRC fixed)': _rechunked(payload, lambda stream: stream[:-30]),
    }


def _rechunked(payload: bytes, change) -> bytes:
    """The same file with its zlib stream changed and the chunk rewritten with a valid CRC."""
    idat = payload.index(b'IDAT')
    length, = struct.unpack_from('>I', payload, idat - 4)
    stream = payload[idat + 4:idat + 4 + length]
    return payload[:idat - 4] + _chunk(b'IDAT', change(stream)) + payload[idat + 8 + length:]


def test_damaged_files_are_refused_and_the_codec_names_field_and_row():
    good = _png_with_filters(_image(31, 29, 3, np.uint8, seed=2), [1, 4])
    codec = CompressedImageCodec('png')
    field = UnischemaField('broken_field', np.uint8, (31, 29, 3), codec)
    for name, bad in _damaged(good).items():
        with pytest.raises(ValueError, match='PNG reader'):
            _ours(bad)
        assert cv2.imdecode(np.frombuffer(bad, np.uint8), cv2.IMREAD_UNCHANGED) is None, name
        with pytest.raises(CodecError, match=r'broken_field \(row 1 of the column\)'):
            codec.decode_column(field, pa.array([good, bad], pa.binary()))


def test_unknown_filter_types_and_wrong_sizes_are_refused():
    lines = b'\x01' + bytes(6) + b'\x05' + bytes(6)
    with pytest.raises(ValueError, match='row 1 has the unknown filter type 5'):
        _png_rows.unfilter(lines, bytearray(12), 2, 6, 3, 1, False)
    with pytest.raises(ValueError, match='expected 14 bytes of image data and 12 of output, got 13 and 12'):
        _png_rows.unfilter(lines[:-1], bytearray(12), 2, 6, 3, 1, False)
    with pytest.raises(ValueError, match='bad image geometry'):
        _png_rows.unfilter(lines, bytearray(12), 2, 6, 9, 1, False)
    # An image whose stream holds more rows than its header says.
    pixels = _image(4, 5, 3, np.uint8, seed=0)
    longer = _png_with_filters(np.concatenate([pixels, pixels]), [0])
    header = struct.pack('>IIBBBBB', 5, 4, 8, 2, 0, 0, 0)
    too_much = longer[:8] + _chunk(b'IHDR', header) + longer[33:]
    with pytest.raises(ValueError, match='PNG reader'):
        _ours(too_much)


def test_interlaced_files_go_to_the_other_decoders():
    # A 1x1 image has the same bytes interlaced or not: OpenCV reads both, our reader leaves the interlaced one.
    payload = _png_with_filters(_image(1, 1, 3, np.uint8, seed=0), [0], interlaced=True)
    with pytest.raises(ValueError, match='non-interlaced'):
        _ours(payload)
    codec = CompressedImageCodec('png')
    field = UnischemaField('picture', np.uint8, (1, 1, 3), codec)
    _assert_same(codec.decode(field, payload), _opencv(payload))


def test_the_chunk_crc_agrees_with_zlib_on_every_length_and_alignment():
    data = np.random.default_rng(7).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    for length in [*range(300), 4099, 4999]:
        for offset in (0, 1):
            piece = data[offset:offset + length]
            assert _png_rows.crc32(piece) == zlib.crc32(piece), (length, offset)


@pytest.mark.parametrize('dtype', [np.uint8, np.uint16])
@pytest.mark.parametrize('channels', [1, 3, 4])
def test_sub_rows_of_every_width(channels, dtype):
    # "sub" runs sixteen bytes at a time with the rest of the row byte by byte: every split of a row.
    for width in range(1, 40):
        payload = _png_with_filters(_image(2, width, channels, dtype, seed=width), [1])
        _assert_same(_ours(payload), _opencv(payload))
