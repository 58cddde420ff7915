"""PNG and JPEG image codec."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs._base import ColumnBuilder, DataframeColumnCodec, _binary_payloads, _field_name, check_array
from petastorm.errors import CodecError, SchemaError

_IMAGE_FORMATS = {'png': '.png', 'jpeg': '.jpeg', 'jpg': '.jpeg'}


def _cv2() -> Any:
    from petastorm._optional import import_optional

    cv2 = import_optional('cv2', 'CompressedImageCodec')
    return cv2


class CompressedImageCodec(DataframeColumnCodec):
    """Stores a uint8/uint16 image (H x W grey or H x W x 3 RGB) as a standard PNG or JPEG file.

    Args:
        image_codec: ``'png'`` (lossless) or ``'jpeg'``.
        quality: JPEG quality, 0-100 (ignored for PNG).
    """

    codec_name = 'compressed_image'

    def __init__(self, image_codec: str = 'png', quality: int = 80):
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
        if value.ndim == 3 and value.shape[2] == 3:
            value = value[:, :, ::-1]  # OpenCV takes BGR; the file stays standard RGB
        elif value.ndim != 2:
            raise SchemaError(f'Unexpected image dimensions of {_field_name(unischema_field)}. Supported '
                              f'dimensions are (H, W) or (H, W, 3). Got {value.shape}')
        if value.dtype not in (np.uint8, np.uint16) or (value.dtype == np.uint16 and self.image_codec == 'jpeg'):
            raise SchemaError(f'field {_field_name(unischema_field)}: {self.image_codec} images must be uint8'
                              f'{" or uint16" if self.image_codec == "png" else ""}, got {value.dtype}')
        cv2 = _cv2()
        params = [cv2.IMWRITE_JPEG_QUALITY, self._quality] if self.image_codec == 'jpeg' else []
        ok, encoded = cv2.imencode(self._image_codec, np.ascontiguousarray(value), params)
        if not ok:
            raise CodecError(f'field {_field_name(unischema_field)}: OpenCV failed to encode a {value.shape} '
                             f'{value.dtype} image as {self.image_codec}')
        return encoded.tobytes()

    def _decode_stored(self, cv2: Any, unischema_field: Any, value: Any) -> np.ndarray:
        """The image as OpenCV decodes it (BGR channel order for colour images)."""
        # OpenCV raises (rather than returning None) for an empty buffer
        image = cv2.imdecode(np.frombuffer(value, dtype=np.uint8), cv2.IMREAD_UNCHANGED) if len(value) else None
        if image is None:
            raise CodecError(f'field {_field_name(unischema_field)}: the stored value is not a decodable '
                             f'{self.image_codec} image ({len(value)} bytes)')
        return image

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        cv2 = _cv2()
        return _to_rgb(cv2, self._decode_stored(cv2, unischema_field, value), None)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        cv2 = _cv2()
        payloads = _binary_payloads(column)
        builder = ColumnBuilder(len(payloads))
        for payload in _iter_buffers(payloads):
            if payload is None:
                builder.add(None)
            else:
                # The colour conversion writes straight into the image's row of the column.
                builder.add(self._decode_stored(cv2, unischema_field, payload),
                            lambda image, out: _to_rgb(cv2, image, out))
        return builder.result()

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        return import_optional('pyspark.sql.types', 'CompressedImageCodec.spark_dtype()').BinaryType()

    def arrow_type(self) -> pa.DataType:
        return pa.binary()

    def __str__(self) -> str:
        return f'CompressedImageCodec({self.image_codec!r}, {self._quality})'


def _to_rgb(cv2: Any, image: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A decoded colour image in RGB order (written into ``out`` when given); other images as they are."""
    if image.ndim == 3 and image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=out)
    if out is None:
        return image
    out[...] = image
    return out


def _iter_buffers(payloads: pa.Array):
    """Yield each cell of a binary array as a zero-copy memoryview (None for nulls)."""
    n = len(payloads)
    offset_type = np.int64 if pa.types.is_large_binary(payloads.type) else np.int32
    offsets = np.frombuffer(payloads.buffers()[1], dtype=offset_type)[payloads.offset:payloads.offset + n + 1]
    data = memoryview(payloads.buffers()[2]) if payloads.buffers()[2] is not None else memoryview(b'')
    valid = payloads.is_valid().to_numpy(zero_copy_only=False) if payloads.null_count else None
    bounds = offsets.tolist()
    for i in range(n):
        if valid is not None and not valid[i]:
            yield None
        else:
            yield data[bounds[i]:bounds[i + 1]]
