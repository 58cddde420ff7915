"""The image backends: every library decodes a fixed set of images to the reference pixels (OpenCV's decode).

The reference is what Petastorm does: ``cv2.imdecode(..., IMREAD_UNCHANGED)`` then BGR -> RGB for 3-channel
images (4-channel images stay BGRA). The set covers grey, RGB and RGBA at 8 and 16 bits, odd sizes, JPEG
subsamplings and progressive files, and the kinds that go to the reference path (palettes, grey + alpha, tRNS,
1-bit grey).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import numpy as np
import pyarrow as pa
import pytest

from petastorm.codecs import CompressedImageCodec
from petastorm.codecs._image_backends import BACKEND_ENV, image_backends
from petastorm.codecs._image_formats import plain_layout
from petastorm.errors import CodecError
from petastorm.unischema import UnischemaField

cv2 = pytest.importorskip('cv2')

SETTINGS = ['auto', 'opencv', 'libdeflate', 'imagecodecs', 'simplejpeg', 'pyspng', 'pyspng,simplejpeg']


def _photo_like(height: int, width: int, channels: int, dtype=np.uint8, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus mild noise (compresses like a photograph)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    top = 255 if dtype == np.uint8 else 65535
    planes = [top / 2 * (1 + np.sin(x / (9 + 4 * c) + y / (13 + 3 * c) + c)) for c in range(channels)]
    image = np.stack(planes, axis=-1) + rng.normal(0, top / 60, (height, width, channels))
    image = np.clip(image, 0, top).astype(dtype)
    return image[..., 0] if channels == 1 else image


def _cv_encode(extension: str, image: np.ndarray, params: tuple[int, ...] = ()) -> bytes:
    """Encode an image given in our channel order (RGB / RGBA) with OpenCV."""
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR if image.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    ok, encoded = cv2.imencode(extension, image, list(params))
    assert ok
    return encoded.tobytes()


def _png_file(pixels: np.ndarray, colour_type: int, bit_depth: int, extra_chunks: tuple[tuple[bytes, bytes], ...] = ()
              ) -> bytes:
    """A PNG written by hand (filter 0 rows), for the kinds OpenCV does not write: palettes, grey + alpha, tRNS."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))

    height, width = pixels.shape[:2]
    rows = pixels.reshape(height, -1)
    if bit_depth < 8:
        rows = np.packbits(rows.astype(np.uint8), axis=1) if bit_depth == 1 else rows
    raw = b''.join(b'\x00' + row.astype('>u2' if bit_depth == 16 else np.uint8).tobytes() for row in rows)
    header = struct.pack('>IIBBBBB', width, height, bit_depth, colour_type, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + b''.join(chunk(k, v) for k, v in extra_chunks)
            + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))


def _image_set() -> dict[str, bytes]:
    images = {}
    for height, width in ((1, 1), (7, 13), (61, 97), (128, 256)):
        for channels in (1, 3, 4):
            for dtype in (np.uint8, np.uint16):
                pixels = _photo_like(height, width, channels, dtype, seed=height)
                images[f'png {np.dtype(dtype).name} c{channels} {height}x{width}'] = _cv_encode('.png', pixels)
        for channels in (1, 3):
            pixels = _photo_like(height, width, channels, seed=width)
            images[f'jpeg q90 c{channels} {height}x{width}'] = _cv_encode('.jpeg', pixels,
                                                                         (cv2.IMWRITE_JPEG_QUALITY, 90))
    photo = _photo_like(61, 97, 3, seed=5)
    for name, factor in (('444', cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444),
                         ('422', cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422)):
        images[f'jpeg {name}'] = _cv_encode('.jpeg', photo, (cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor))
    images['jpeg progressive'] = _cv_encode('.jpeg', photo, (cv2.IMWRITE_JPEG_PROGRESSIVE, 1))
    images['jpeg q0'] = _cv_encode('.jpeg', photo, (cv2.IMWRITE_JPEG_QUALITY, 0))
    images['png noise (stored blocks)'] = _cv_encode(
        '.png', np.random.default_rng(1).integers(0, 256, (32, 48, 3), dtype=np.uint8))
    images['png max compression'] = _cv_encode('.png', photo, (cv2.IMWRITE_PNG_COMPRESSION, 9))
    grey = _photo_like(9, 11, 1)
    palette = np.arange(4 * 3, dtype=np.uint8).reshape(4, 3) * 20
    images['png palette'] = _png_file(grey % 4, 3, 8, ((b'PLTE', palette.tobytes()),))
    images['png palette tRNS'] = _png_file(grey % 4, 3, 8, ((b'PLTE', palette.tobytes()), (b'tRNS', b'\x00\x80')))
    images['png grey alpha'] = _png_file(np.stack([grey, 255 - grey], axis=-1), 4, 8)
    images['png grey tRNS'] = _png_file(grey, 0, 8, ((b'tRNS', b'\x00\x07'),))
    images['png rgb tRNS'] = _png_file(_photo_like(9, 11, 3), 2, 8, ((b'tRNS', b'\x00\x01\x00\x02\x00\x03'),))
    images['png 1-bit grey'] = _png_file(grey > 128, 0, 1)
    images['png hand-written rgb16'] = _png_file(_photo_like(5, 6, 3, np.uint16), 2, 16)
    return images


IMAGES = _image_set()


def _reference(payload: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if image.ndim == 3 and image.shape[2] == 3 else image


def _assert_identical(actual: np.ndarray, expected: np.ndarray, name: str) -> None:
    assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    differing = int(np.count_nonzero(actual != expected))
    assert differing == 0, f'{name}: {differing} samples differ from the reference'


@pytest.fixture(params=SETTINGS)
def backend_setting(request, monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, request.param)
    return request.param


def test_every_backend_decodes_the_reference_pixels(backend_setting):
    backends = image_backends()
    chosen = backends.describe()
    forced = backend_setting.split(',')
    if backend_setting != 'auto':  # the forced library decodes what it can
        png_decoders = ('libdeflate', 'imagecodecs', 'pyspng')
        assert chosen['png decode'] == next((n for n in forced if n in png_decoders), 'opencv')
        assert chosen['jpeg decode'] == next((n for n in forced if n in ('imagecodecs', 'simplejpeg')), 'opencv')
    codec = CompressedImageCodec('png')
    field = UnischemaField('picture', np.uint8, (None, None, None), codec)
    for name, payload in IMAGES.items():
        _assert_identical(codec.decode(field, payload), _reference(payload), name)
    # decode_column writes equal-shaped images into one array: every kind twice, next to a null.
    for name, payload in IMAGES.items():
        column = codec.decode_column(field, pa.array([payload, None, payload], pa.binary()))
        _assert_identical(column[0], _reference(payload), name)
        _assert_identical(column[2], _reference(payload), name)
        assert column[1] is None


def test_decode_column_stacks_into_one_array(backend_setting):
    codec = CompressedImageCodec('jpeg')
    field = UnischemaField('picture', np.uint8, (61, 97, 3), codec)
    payloads = [IMAGES['jpeg q90 c3 61x97'], IMAGES['jpeg 444'], IMAGES['jpeg progressive']]
    column = codec.decode_column(field, pa.array(payloads, pa.binary()))
    assert column.shape == (3, 61, 97, 3)
    assert column.dtype == np.uint8
    for row, payload in enumerate(payloads):
        _assert_identical(column[row], _reference(payload), f'row {row}')


@pytest.mark.parametrize('kind', ['jpeg q90 c3 61x97', 'png uint8 c3 61x97'])
def test_decode_column_takes_the_fast_decoder_of_plain_files(monkeypatch, kind):
    # The general decoders (OpenCV) are only for what the fast ones cannot read: a column of plain files read
    # from Arrow's buffers must never reach them.
    import dataclasses

    import petastorm.codecs._image as image_module

    def refuse(payload):
        raise AssertionError('a plain file went to the general decoders')

    fast_only = dataclasses.replace(image_backends(), any_decoders=(('refuse', refuse),))
    monkeypatch.setattr(image_module, '_backends', lambda: fast_only)
    codec = CompressedImageCodec(kind.split()[0])
    field = UnischemaField('picture', np.uint8, (61, 97, 3), codec)
    column = codec.decode_column(field, pa.array([IMAGES[kind]] * 2, pa.binary()))
    _assert_identical(column[1], _reference(IMAGES[kind]), kind)


def test_plain_layout_reads_a_signed_byte_view():
    # memoryview(pyarrow.Buffer) has the format 'b': its bytes index as negative numbers.
    view = memoryview(pa.py_buffer(IMAGES['jpeg 444']))
    assert view.format == 'b'
    assert plain_layout(view).shape == (61, 97, 3)


def test_plain_layout_reads_the_header():
    assert plain_layout(IMAGES['png uint16 c3 7x13']).shape == (7, 13, 3)
    assert plain_layout(IMAGES['png uint16 c3 7x13']).dtype == np.uint16
    assert plain_layout(IMAGES['png uint8 c1 61x97']).shape == (61, 97)
    assert plain_layout(IMAGES['png uint8 c4 1x1']).shape == (1, 1, 4)
    assert plain_layout(IMAGES['jpeg q90 c1 7x13']).shape == (7, 13)
    assert plain_layout(IMAGES['jpeg progressive']).shape == (61, 97, 3)
    for kind in ('png palette', 'png grey alpha', 'png grey tRNS', 'png rgb tRNS', 'png 1-bit grey'):
        assert plain_layout(IMAGES[kind]) is None, kind
    for cut in (IMAGES['png uint8 c3 61x97'][:-3], IMAGES['jpeg 444'][:-1], b'', b'GIF89a'):
        assert plain_layout(cut) is None


@pytest.mark.parametrize('image_codec', ['png', 'jpeg'])
def test_a_corrupt_image_names_field_and_row(backend_setting, image_codec):
    codec = CompressedImageCodec(image_codec)
    field = UnischemaField('broken_field', np.uint8, (61, 97, 3), codec)
    good = IMAGES['png uint8 c3 61x97' if image_codec == 'png' else 'jpeg q90 c3 61x97']
    cut = (good[:-3], good[:len(good) // 2], good[:1], b'')
    # A run of zeros in PNG data breaks its checksum; libjpeg reads damaged JPEG data as other pixels.
    damaged = (good[:200] + bytes(64) + good[264:],) if image_codec == 'png' else ()
    for bad in (*cut, *damaged):
        with pytest.raises(CodecError, match=r'broken_field \(row 1 of the column\)'):
            codec.decode_column(field, pa.array([good, bad], pa.binary()))


@pytest.mark.parametrize('quality', [0, 50, 90])
def test_jpeg_encoders_lose_no_more_than_opencv(monkeypatch, quality):
    photo = _photo_like(61, 97, 3, seed=3)
    for image in (photo, photo[..., 1].copy()):
        opencv_file = _cv_encode('.jpeg', image, (cv2.IMWRITE_JPEG_QUALITY, quality))
        opencv_error = np.abs(_reference(opencv_file).astype(int) - image).mean()
        for setting in ('auto', 'imagecodecs', 'simplejpeg', 'opencv'):
            monkeypatch.setenv(BACKEND_ENV, setting)
            codec = CompressedImageCodec('jpeg', quality)
            encoded = codec.encode(UnischemaField('p', np.uint8, image.shape, codec), image)
            decoded = _reference(encoded)
            assert decoded.shape == image.shape
            error = np.abs(decoded.astype(int) - image).mean()
            assert error <= opencv_error * 1.1 + 0.2, (setting, error, opencv_error)
            if setting in ('auto', 'imagecodecs', 'opencv'):
                assert encoded == opencv_file, setting  # libjpeg-turbo with OpenCV's settings: the same file


def test_png_encoders_are_lossless(monkeypatch):
    for setting in ('auto', 'imagecodecs', 'opencv'):
        monkeypatch.setenv(BACKEND_ENV, setting)
        for image in (_photo_like(7, 13, 3), _photo_like(7, 13, 1, np.uint16), _photo_like(1, 1, 3, np.uint16)):
            codec = CompressedImageCodec('png')
            encoded = codec.encode(UnischemaField('p', image.dtype.type, image.shape, codec), image)
            _assert_identical(_reference(encoded), image, setting)


def test_an_unknown_or_missing_backend_is_refused(monkeypatch):
    codec = CompressedImageCodec('png')
    field = UnischemaField('p', np.uint8, (1, 1, 3), codec)
    monkeypatch.setenv(BACKEND_ENV, 'turbo')
    with pytest.raises(CodecError, match=f'{BACKEND_ENV}=.turbo.*unknown: turbo'):
        codec.decode(field, IMAGES['png uint8 c3 1x1'])
    monkeypatch.setitem(sys.modules, 'pyspng', None)
    monkeypatch.setenv(BACKEND_ENV, 'simplejpeg,pyspng')  # a setting no other test chose in this process
    with pytest.raises(CodecError, match='asks for pyspng, which cannot be imported'):
        codec.decode(field, IMAGES['png uint8 c3 1x1'])


def _holds_the_gil_while_decoding(setting: str, payload: bytes) -> bool:
    """Whether another thread stays blocked while one thread decodes ``payload`` in a loop of at most 3 s.

    With a switch interval longer than the loop, the decoding thread keeps the GIL between calls; the main thread
    runs before the loop ends only if a decode call lets the GIL go. The loop stops as soon as the main thread
    ran, so a loaded machine that schedules the main thread late only makes the loop longer.
    """
    os.environ[BACKEND_ENV] = setting
    codec = CompressedImageCodec('png')
    field = UnischemaField('p', np.uint8, (None, None, None), codec)
    codec.decode(field, payload)  # imports and chooses outside the measured part
    started, main_ran, timed_out = threading.Event(), threading.Event(), threading.Event()

    def decode_until_the_main_thread_runs() -> None:
        started.set()
        deadline = time.monotonic() + 3.0
        while not main_ran.is_set():
            if time.monotonic() > deadline:
                timed_out.set()
                return
            codec.decode(field, payload)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        worker = threading.Thread(target=decode_until_the_main_thread_runs)
        worker.start()
        started.wait()
        main_ran.set()
        held = timed_out.is_set()
        worker.join()
    finally:
        sys.setswitchinterval(interval)
        del os.environ[BACKEND_ENV]
    return held


def test_chosen_decoders_release_the_gil():
    png, jpeg = IMAGES['png uint8 c3 128x256'], IMAGES['jpeg q90 c3 128x256']
    assert image_backends().describe()['png decode'] == 'libdeflate'
    for setting in ('auto', 'libdeflate', 'imagecodecs', 'simplejpeg', 'opencv'):
        for payload in (png, jpeg):
            assert not _holds_the_gil_while_decoding(setting, payload), setting
    # The control: pyspng keeps the GIL, which is why it comes after OpenCV in the automatic order.
    assert _holds_the_gil_while_decoding('pyspng', png)


_ROUND_TRIP = textwrap.dedent('''
    import json
    import sys
    import numpy as np
    import pyarrow as pa
    for name in sys.argv[1].split(','):
        sys.modules[name] = None  # makes the library unimportable
    from petastorm.codecs import CompressedImageCodec
    from petastorm.codecs._image_backends import image_backends
    from petastorm.unischema import UnischemaField
    print(json.dumps(image_backends().describe()))
    ramp = np.add.outer(np.arange(13) * 6, np.arange(7) * 9)
    for image_codec in ('png', 'jpeg'):
        codec = CompressedImageCodec(image_codec, 95)
        for image in (np.stack([ramp, ramp[::-1], 200 - ramp], axis=-1).astype(np.uint8), ramp.astype(np.uint8)):
            field = UnischemaField('p', np.uint8, image.shape, codec)
            payload = codec.encode(field, image)
            column = codec.decode_column(field, pa.array([payload] * 2, pa.binary()))
            error = np.abs(column[1].astype(int) - image.astype(int)).mean()
            assert column.shape == (2, *image.shape) and error < (0.5 if image_codec == 'png' else 3), error
    print('ok')
''')


@pytest.mark.parametrize(('blocked', 'chosen'), [
    ('imagecodecs,simplejpeg,pyspng', {'png decode': 'opencv', 'jpeg decode': 'opencv', 'png encode': 'opencv',
                                       'jpeg encode': 'opencv', 'other images': 'opencv'}),
    ('cv2', {'png decode': 'libdeflate', 'jpeg decode': 'simplejpeg', 'png encode': 'imagecodecs',
             'jpeg encode': 'imagecodecs', 'other images': 'imagecodecs, simplejpeg, pyspng'}),
    # Without the compiled row filters (no C compiler at install) our PNG reader is not offered.
    ('petastorm.codecs._png_rows', {'png decode': 'imagecodecs', 'jpeg decode': 'simplejpeg', 'png encode': 'opencv',
                                    'jpeg encode': 'imagecodecs', 'other images': 'opencv'}),
])
def test_works_with_opencv_alone_and_with_the_new_libraries_alone(blocked, chosen):
    done = subprocess.run([sys.executable, '-c', _ROUND_TRIP, blocked], capture_output=True, text=True,
                          timeout=120, env={**os.environ, BACKEND_ENV: 'auto'})
    assert done.returncode == 0, done.stderr
    described, result = done.stdout.splitlines()
    assert json.loads(described) == chosen
    assert result == 'ok'


def test_without_any_image_library_the_error_names_the_extra():
    script = _ROUND_TRIP.replace("print('ok')", '')
    done = subprocess.run([sys.executable, '-c', script, 'cv2,imagecodecs,simplejpeg,pyspng'],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "pip install 'neo-petastorm[image]'" in done.stderr
