"""The image libraries behind :class:`~petastorm.codecs.CompressedImageCodec`, and which one does what.

OpenCV's ``imdecode(..., IMREAD_UNCHANGED)`` followed by BGR->RGB is the reference decode (it is what Petastorm
does). Faster libraries decode the plain images (see :class:`ImageLayout`) to exactly the same pixels:
``libdeflate`` (our own PNG reader, :mod:`petastorm.codecs._png_reader`, over the libdeflate that imagecodecs
ships), ``imagecodecs`` (libspng and libpng, libjpeg-turbo), ``simplejpeg`` (libjpeg-turbo with its default,
accurate DCT and upsampling) and ``pyspng`` (libspng). Anything else goes to OpenCV when it is installed.

The choice is made once per process (per value of the switch) from what is importable, or forced with the
environment variable ``PETASTORM_IMAGE_BACKEND``: ``auto`` (the default), or a comma-separated list of
``libdeflate``, ``imagecodecs``, ``simplejpeg``, ``pyspng``, ``opencv`` tried in that order (OpenCV, when
installed, still takes the images the listed libraries cannot handle). ``PETASTORM_IMAGE_BACKEND=opencv`` is
today's path exactly. Worker processes inherit the variable.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from petastorm.codecs._image_formats import JPEG_SIGNATURE, PNG_SIGNATURE, ImageLayout, plain_layout

BACKEND_ENV = 'PETASTORM_IMAGE_BACKEND'
LIBRARIES = ('libdeflate', 'imagecodecs', 'simplejpeg', 'pyspng', 'opencv')
Operation = Literal['png decode', 'jpeg decode', 'png encode', 'jpeg encode']

# The automatic order per operation, fastest first, measured by benchmarks/codecs_bench.py. pyspng holds the GIL
# while it decodes, so threads do not scale with it: it comes after OpenCV.
_AUTO_ORDER: dict[Operation, tuple[str, ...]] = {
    'png decode': ('libdeflate', 'imagecodecs', 'opencv', 'pyspng'),
    'jpeg decode': ('simplejpeg', 'imagecodecs', 'opencv'),
    # OpenCV's PNG encoder is faster than libpng's at the same level; imagecodecs' JPEG encoder writes
    # byte-identical files about twice as fast.
    'png encode': ('opencv', 'imagecodecs'),
    'jpeg encode': ('imagecodecs', 'opencv', 'simplejpeg'),
}
_MODULES = {'libdeflate': 'petastorm.codecs._png_reader', 'imagecodecs': 'imagecodecs', 'simplejpeg': 'simplejpeg',
            'pyspng': 'pyspng', 'opencv': 'cv2'}

# decode(payload, layout, out) -> the image in the codec's layout (RGB, grey, or BGRA like OpenCV), written
# into ``out`` when it is given (``out`` has ``layout.shape`` and ``layout.dtype``).
PlainDecoder = Callable[[memoryview, ImageLayout, 'np.ndarray | None'], np.ndarray]
# decode(payload) -> the image in the codec's layout, or None when the library cannot read the payload.
AnyDecoder = Callable[[memoryview], 'np.ndarray | None']
# encode(image, quality) -> the file's bytes; ``image`` is RGB, RGBA or grey.
Encoder = Callable[[np.ndarray, int], bytes]


@dataclass(frozen=True)
class ImageBackends:
    """The libraries chosen for this process: one decoder and encoder per format, and the fallbacks."""

    png_decoder: tuple[str, PlainDecoder] | None
    jpeg_decoder: tuple[str, PlainDecoder] | None
    any_decoders: tuple[tuple[str, AnyDecoder], ...]
    png_encoder: tuple[str, Encoder] | None
    jpeg_encoder: tuple[str, Encoder] | None

    def describe(self) -> dict[str, str]:
        """``{operation: library}`` for logs and benchmarks."""
        chosen = {'png decode': self.png_decoder, 'jpeg decode': self.jpeg_decoder,
                  'png encode': self.png_encoder, 'jpeg encode': self.jpeg_encoder}
        described = {operation: entry[0] if entry else 'none' for operation, entry in chosen.items()}
        described['other images'] = ', '.join(name for name, _ in self.any_decoders) or 'none'
        return described

    def decode(self, payload: memoryview, out: np.ndarray | None = None,
               layout: ImageLayout | None | Literal['unread'] = 'unread') -> np.ndarray | None:
        """Decode ``payload`` (into ``out`` when given and the layout allows); None when nothing can read it.

        ``layout`` is the payload's :func:`plain_layout` when the caller has read it already.

        Raises:
            Exception: what the library raises for a corrupt file (callers wrap it with the field and row).
        """
        if layout == 'unread':
            layout = plain_layout(payload)
        chosen = None if layout is None else self.png_decoder if layout.kind == 'png' else self.jpeg_decoder
        if chosen is not None and layout is not None:
            if out is not None and (out.shape != layout.shape or out.dtype != layout.dtype):
                out = None
            try:
                return chosen[1](payload, layout, out)
            except Exception:
                # A file the fast library refuses goes to the general decoders; if none reads it, it is corrupt.
                image = self._decode_any(payload, out)
                if image is None:
                    raise
                return image
        return self._decode_any(payload, out)

    def _decode_any(self, payload: memoryview, out: np.ndarray | None) -> np.ndarray | None:
        error: Exception | None = None
        for _, decode_any in self.any_decoders:
            try:
                image = decode_any(payload)
            except Exception as err:  # the next library may still read it
                error = err
                continue
            if image is not None:
                if out is not None and out.shape == image.shape and out.dtype == image.dtype:
                    out[...] = image
                    return out
                return image
        if error is not None:
            raise error
        return None


def image_backends() -> ImageBackends:
    """The backends of this process for the current value of ``PETASTORM_IMAGE_BACKEND``.

    Raises:
        ValueError: the variable names an unknown library or one that is not installed.
    """
    return _backends_for(os.environ.get(BACKEND_ENV, 'auto').strip().lower() or 'auto')


@functools.lru_cache(maxsize=8)
def _backends_for(setting: str) -> ImageBackends:
    libraries = _load_libraries(setting)

    def first(operation: Operation, table: dict[str, Any]) -> tuple[str, Any] | None:
        order = _AUTO_ORDER[operation] if setting == 'auto' else (*setting_names(setting), 'opencv')
        for name in order:
            if name in libraries and name in table:
                return name, table[name](libraries[name])
        return None

    # OpenCV is the reference for every other image, and its refusal is final (other libraries are more
    # lenient with damaged files); without it, the other libraries do what they can.
    any_order = ('opencv',) if 'opencv' in libraries else ('imagecodecs', 'simplejpeg', 'pyspng')
    return ImageBackends(
        png_decoder=first('png decode', _PNG_DECODERS),
        jpeg_decoder=first('jpeg decode', _JPEG_DECODERS),
        any_decoders=tuple((name, _ANY_DECODERS[name](libraries[name])) for name in any_order if name in libraries),
        png_encoder=first('png encode', _PNG_ENCODERS),
        jpeg_encoder=first('jpeg encode', _JPEG_ENCODERS))


def setting_names(setting: str) -> tuple[str, ...]:
    """The library names of a non-auto setting of ``PETASTORM_IMAGE_BACKEND``, checked."""
    names = tuple(name.strip() for name in setting.split(',') if name.strip())
    unknown = [name for name in names if name not in LIBRARIES]
    if unknown or not names:
        raise ValueError(f'{BACKEND_ENV}={setting!r}: expected "auto" or a comma-separated list of '
                         f'{", ".join(LIBRARIES)}; unknown: {", ".join(unknown) or "(empty)"}')
    return names


def _load_libraries(setting: str) -> dict[str, Any]:
    """The importable libraries the setting may use, by name (a forced library must import)."""
    wanted = LIBRARIES if setting == 'auto' else setting_names(setting)
    loaded = {}
    for name in dict.fromkeys((*wanted, 'opencv')):
        try:
            loaded[name] = importlib.import_module(_MODULES[name])
        except ImportError as err:
            if setting != 'auto' and name in wanted:
                raise ValueError(f'{BACKEND_ENV}={setting!r} asks for {name}, which cannot be imported ({err}); '
                                 f'install it (pip install "neo-petastorm[image]") or change the setting') from err
    return loaded


def _bgra_like_opencv(image: np.ndarray) -> np.ndarray:
    """Swap red and blue of an RGBA image in place: OpenCV returns 4-channel images as BGRA (and so do we)."""
    if image.ndim == 3 and image.shape[2] == 4:
        red = image[..., 0].copy()
        image[..., 0] = image[..., 2]
        image[..., 2] = red
    return image


def _into(image: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return image
    out[...] = image
    return out


# ---- OpenCV: the reference ----

def _opencv_any(cv2: Any) -> AnyDecoder:
    def decode(payload: memoryview) -> np.ndarray | None:
        if not len(payload):
            return None  # OpenCV raises rather than returning None for an empty buffer
        image = cv2.imdecode(np.frombuffer(payload, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        if image is not None and image.ndim == 3 and image.shape[2] == 3:
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=image)
        return image
    return decode


def _opencv_plain(cv2: Any) -> PlainDecoder:
    def decode(payload: memoryview, layout: ImageLayout, out: np.ndarray | None) -> np.ndarray:
        image = cv2.imdecode(np.frombuffer(payload, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            raise ValueError(f'OpenCV could not decode the {layout.kind} file')
        if image.ndim == 3 and image.shape[2] == 3:
            return cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=out if out is not None and out.shape == image.shape
                                and out.dtype == image.dtype else None)
        return _into(image, out if out is not None and out.shape == image.shape else None)
    return decode


def _opencv_encoder(extension: str) -> Callable[[Any], Encoder]:
    def make(cv2: Any) -> Encoder:
        def encode(image: np.ndarray, quality: int) -> bytes:
            if image.ndim == 3 and image.shape[2] == 3:
                image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)  # OpenCV takes BGR; the file stays standard RGB
            params = [cv2.IMWRITE_JPEG_QUALITY, quality] if extension == '.jpeg' else []
            ok, encoded = cv2.imencode(extension, np.ascontiguousarray(image), params)
            if not ok:
                raise ValueError(f'OpenCV failed to encode the image as {extension[1:]}')
            return encoded.tobytes()
        return encode
    return make


# ---- imagecodecs: libspng, libpng, libjpeg-turbo; releases the GIL and writes into ``out`` ----

def _imagecodecs_png(codecs: Any) -> PlainDecoder:
    def decode(payload: memoryview, layout: ImageLayout, out: np.ndarray | None) -> np.ndarray:
        # libspng has no 16-bit grey or RGB output; libpng covers those.
        decoder = codecs.spng_decode if layout.dtype == np.uint8 else codecs.png_decode
        return _bgra_like_opencv(decoder(payload, out=out))
    return decode


def _imagecodecs_jpeg(codecs: Any) -> PlainDecoder:
    def decode(payload: memoryview, layout: ImageLayout, out: np.ndarray | None) -> np.ndarray:
        return codecs.jpeg8_decode(payload, out=out)
    return decode


def _imagecodecs_any(codecs: Any) -> AnyDecoder:
    def decode(payload: memoryview) -> np.ndarray | None:
        head = bytes(payload[:8])
        if head == PNG_SIGNATURE:
            return _bgra_like_opencv(codecs.png_decode(payload))
        if head[:2] == JPEG_SIGNATURE:
            return codecs.jpeg8_decode(payload)
        return None
    return decode


def _imagecodecs_png_encoder(codecs: Any) -> Encoder:
    def encode(image: np.ndarray, quality: int) -> bytes:
        return bytes(codecs.png_encode(image, level=1))  # OpenCV's default level: fast, still compresses
    return encode


def _imagecodecs_jpeg_encoder(codecs: Any) -> Encoder:
    def encode(image: np.ndarray, quality: int) -> bytes:
        # libjpeg reads quality 0 as 1; imagecodecs would read 0 as "its default".
        return bytes(codecs.jpeg8_encode(np.ascontiguousarray(image), level=max(quality, 1)))
    return encode


# ---- simplejpeg: libjpeg-turbo with the accurate DCT; releases the GIL and writes into ``buffer`` ----

def _simplejpeg_jpeg(simplejpeg: Any) -> PlainDecoder:
    def decode(payload: memoryview, layout: ImageLayout, out: np.ndarray | None) -> np.ndarray:
        colorspace = 'GRAY' if layout.channels == 1 else 'RGB'
        image = simplejpeg.decode_jpeg(payload, colorspace, fastdct=False, fastupsample=False, buffer=out)
        if out is not None:
            return out
        return image[..., 0] if layout.channels == 1 else image
    return decode


def _simplejpeg_any(simplejpeg: Any) -> AnyDecoder:
    def decode(payload: memoryview) -> np.ndarray | None:
        if bytes(payload[:2]) != JPEG_SIGNATURE:
            return None
        return simplejpeg.decode_jpeg(payload, 'RGB', fastdct=False, fastupsample=False)
    return decode


def _simplejpeg_encoder(simplejpeg: Any) -> Encoder:
    def encode(image: np.ndarray, quality: int) -> bytes:
        image = np.ascontiguousarray(image)
        if image.ndim == 2:
            return simplejpeg.encode_jpeg(image[..., None], quality, 'GRAY', 'Gray')
        return simplejpeg.encode_jpeg(image, quality, 'RGB', '420')  # 4:2:0 like OpenCV and libjpeg
    return encode


# ---- our PNG reader over libdeflate: releases the GIL while it inflates and filters, writes into ``out`` ----

def _libdeflate_png(png_reader: Any) -> PlainDecoder:
    return png_reader.PngReader().decode


# ---- pyspng: libspng; fast, but holds the GIL and returns a new array ----

def _pyspng_png(pyspng: Any) -> PlainDecoder:
    def decode(payload: memoryview, layout: ImageLayout, out: np.ndarray | None) -> np.ndarray:
        image = pyspng.load(bytes(payload))
        if layout.dtype == np.uint16 and layout.channels in (1, 3):
            image = image[..., :layout.channels]  # 16-bit grey and RGB come with an added alpha channel
        image = image.reshape(layout.shape)
        return _bgra_like_opencv(_into(image, out) if out is not None else np.ascontiguousarray(image))
    return decode


def _pyspng_any(pyspng: Any) -> AnyDecoder:
    def decode(payload: memoryview) -> np.ndarray | None:
        if bytes(payload[:8]) != PNG_SIGNATURE:
            return None
        return _bgra_like_opencv(np.array(pyspng.load(bytes(payload))))
    return decode


_PNG_DECODERS: dict[str, Callable[[Any], PlainDecoder]] = {
    'libdeflate': _libdeflate_png, 'imagecodecs': _imagecodecs_png, 'pyspng': _pyspng_png, 'opencv': _opencv_plain}
_JPEG_DECODERS: dict[str, Callable[[Any], PlainDecoder]] = {
    'simplejpeg': _simplejpeg_jpeg, 'imagecodecs': _imagecodecs_jpeg, 'opencv': _opencv_plain}
_ANY_DECODERS: dict[str, Callable[[Any], AnyDecoder]] = {
    'opencv': _opencv_any, 'imagecodecs': _imagecodecs_any, 'simplejpeg': _simplejpeg_any, 'pyspng': _pyspng_any}
_PNG_ENCODERS: dict[str, Callable[[Any], Encoder]] = {
    'opencv': _opencv_encoder('.png'), 'imagecodecs': _imagecodecs_png_encoder}
_JPEG_ENCODERS: dict[str, Callable[[Any], Encoder]] = {
    'imagecodecs': _imagecodecs_jpeg_encoder, 'opencv': _opencv_encoder('.jpeg'), 'simplejpeg': _simplejpeg_encoder}
