"""PNG and JPEG image codec."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from petastorm.codecs._base import ColumnBuilder, DataframeColumnCodec, _binary_payloads, _field_name, check_array
from petastorm.codecs._image_backends import ImageBackends, image_backends
from petastorm.codecs._image_formats import ImageLayout, plain_layout
from petastorm.errors import CodecError, MissingDependencyError, SchemaError

_IMAGE_FORMATS = {'png': '.png', 'jpeg': '.jpeg', 'jpg': '.jpeg'}


class CompressedImageCodec(DataframeColumnCodec):
    """Stores a uint8/uint16 image (H x W grey or H x W x 3 RGB) as a standard PNG or JPEG file.

    Decoding gives exactly the pixels of OpenCV's ``imdecode(..., IMREAD_UNCHANGED)`` (colour as RGB; files with
    4 channels stay BGRA, as in Petastorm), through the fastest installed library that matches them: our own
    PNG reader over libdeflate (``libdeflate``, with imagecodecs) for PNG, simplejpeg (libjpeg-turbo, accurate
    DCT) for JPEG; OpenCV takes every other kind of file. Set the environment variable
    ``PETASTORM_IMAGE_BACKEND`` to ``opencv`` (OpenCV only), or to a comma-separated list of ``libdeflate``,
    ``imagecodecs``, ``simplejpeg``, ``pyspng``, ``opencv`` to force an order; the default is ``auto``. Either
    OpenCV or the other libraries suffice.

    Args:
        image_codec: ``'png'`` (lossless) or ``'jpeg'``.
        quality: JPEG quality, 0-100 (ignored for PNG).
    """

    codec_name = 'compressed_image'

    def __init__(self, image_codec: str = 'png', quality: int = 80) -> None:
        key = str(image_codec).lower().lstrip('.')
        if key not in _IMAGE_FORMATS:
            raise ValueError(f'CompressedImageCodec: image_codec must be "png" or "jpeg", got {image_codec!r}')
        if not isinstance(quality, (int, np.integer)) or not 0 <= int(quality) <= 100:
            raise ValueError(f'CompressedImageCodec: quality must be an int in [0, 100], got {quality!r}')
        self._image_codec = _IMAGE_FORMATS[key]
        self._quality = int(quality)

    @property
    def image_codec(self) -> str:
        """``'png'`` or ``'jpeg'``."""
        return self._image_codec[1:]

    @property
    def quality(self) -> int:
        """JPEG quality."""
        return self._quality

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, 'format': self.image_codec, 'quality': self._quality}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> CompressedImageCodec:
        return cls(description.get('format', 'png'), description.get('quality', 80))

    def encode(self, unischema_field: Any, value: Any) -> bytes:
        value = check_array(unischema_field, value)
        if value.ndim != 2 and not (value.ndim == 3 and value.shape[2] == 3):
            raise SchemaError(f'Unexpected image dimensions of {_field_name(unischema_field)}. Supported '
                              f'dimensions are (H, W) or (H, W, 3). Got {value.shape}')
        if value.dtype not in (np.uint8, np.uint16) or (value.dtype == np.uint16 and self.image_codec == 'jpeg'):
            raise SchemaError(f'field {_field_name(unischema_field)}: {self.image_codec} images must be uint8'
                              f'{" or uint16" if self.image_codec == "png" else ""}, got {value.dtype}')
        backends = _backends()
        chosen = backends.png_encoder if self.image_codec == 'png' else backends.jpeg_encoder
        if chosen is None:
            raise _missing_library(f'encoding {self.image_codec}')
        try:
            return chosen[1](value, self._quality)
        except Exception as err:
            raise CodecError(f'field {_field_name(unischema_field)}: {chosen[0]} failed to encode a {value.shape} '
                             f'{value.dtype} image as {self.image_codec}: {err}') from err

    def check_available(self, operation: Literal['encode', 'decode']) -> None:
        """Raise ``MissingDependencyError`` (naming the ``image`` extra) when no library can do ``operation``."""
        backends = _backends()
        if operation == 'encode':
            available = (backends.png_encoder if self.image_codec == 'png' else backends.jpeg_encoder) is not None
        else:
            decoder = backends.png_decoder if self.image_codec == 'png' else backends.jpeg_decoder
            available = decoder is not None or bool(backends.any_decoders)
        if not available:
            raise _missing_library(f'{operation.rstrip("e")}ing {self.image_codec} images')

    def _decode_payload(self, backends: ImageBackends, unischema_field: Any, payload: Any,
                        out: np.ndarray | None, row: int | None,
                        layout: ImageLayout | None | Literal['unread'] = 'unread') -> np.ndarray:
        """One stored image in our layout (RGB, grey, or BGRA as OpenCV gives it), into ``out`` when it fits."""
        error: Exception | None = None
        try:
            image = backends.decode(memoryview(payload).cast('B'), out, layout)
        except Exception as err:
            image, error = None, err
        if image is None:
            if error is None and not backends.any_decoders and len(payload):
                raise _missing_library('decoding this kind of image')
            detail = f': {error}' if error is not None else ''
            where = '' if row is None else f' (row {row} of the column)'
            raise CodecError(f'field {_field_name(unischema_field)}{where}: the stored value is not a decodable '
                             f'{self.image_codec} image ({len(payload)} bytes){detail}') from error
        return image

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        return self._decode_payload(_backends(), unischema_field, value, None, None)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        backends = _backends()
        payloads = _binary_payloads(column)
        builder = ColumnBuilder(len(payloads))
        for row, payload in enumerate(_iter_buffers(payloads)):
            if payload is None:
                builder.add(None)
                continue
            # The header gives the image's shape and dtype, so the decoder writes into its row of the column.
            layout = plain_layout(payload)
            out = None if layout is None else builder.reserve(layout.shape, layout.dtype)
            builder.add(self._decode_payload(backends, unischema_field, payload, out, row, layout))
        return builder.result()

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        return import_optional('pyspark.sql.types', 'CompressedImageCodec.spark_dtype()').BinaryType()

    def arrow_type(self) -> pa.DataType:
        return pa.binary()

    def __str__(self) -> str:
        return f'CompressedImageCodec({self.image_codec!r}, {self._quality})'


def _backends() -> ImageBackends:
    try:
        return image_backends()
    except ValueError as err:
        raise CodecError(f'CompressedImageCodec: {err}') from err


def _missing_library(what: str) -> MissingDependencyError:
    return MissingDependencyError(f'CompressedImageCodec needs an image library for {what} (OpenCV, or '
                                  f'imagecodecs / simplejpeg / pyspng), and none could be imported. Install '
                                  f"them with: pip install 'neo-petastorm[image]'")


def _iter_buffers(payloads: pa.Array) -> Iterator[memoryview | None]:
    """Yield each cell of a binary array as a zero-copy memoryview of unsigned bytes (None for nulls)."""
    n = len(payloads)
    offset_type = np.int64 if pa.types.is_large_binary(payloads.type) else np.int32
    offsets = np.frombuffer(payloads.buffers()[1], dtype=offset_type)[payloads.offset:payloads.offset + n + 1]
    # An Arrow buffer's memoryview has the format 'b' (signed chars): its bytes read as -128..127 one at a time,
    # so header parsers comparing them with 0xFF would never match. Cast once to 'B'.
    data = memoryview(payloads.buffers()[2]).cast('B') if payloads.buffers()[2] is not None else memoryview(b'')
    valid = payloads.is_valid().to_numpy(zero_copy_only=False) if payloads.null_count else None
    bounds = offsets.tolist()
    for i in range(n):
        if valid is not None and not valid[i]:
            yield None
        else:
            yield data[bounds[i]:bounds[i + 1]]
