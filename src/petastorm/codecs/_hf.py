"""Hugging Face ``datasets`` columns: ``Image`` (a struct of the file's bytes and path) and ``ClassLabel``.

``datasets`` stores an ``Image`` feature as ``struct<bytes: binary, path: string>``: the bytes of the image file as
it was given (PNG for arrays, the original file for images read from disk: JPEG, PNG, WebP, GIF, BMP, TIFF...),
or only a path. :class:`HFImageCodec` decodes a whole column of them: plain PNGs and JPEGs through the fast decoders
of :class:`~petastorm.codecs.CompressedImageCodec`, straight into the column's array, anything else through
Pillow (which ``datasets`` itself uses, so the pixels are those it gives). Rows stored as a path only are read by
the reader from the dataset's directory before decoding (see :func:`petastorm.reading.media_paths.resolve_media_paths`).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs._base import ColumnBuilder, DataframeColumnCodec, _field_name
from petastorm.codecs._category import LabelNames
from petastorm.codecs._image import _backends, _iter_buffers
from petastorm.codecs._image_formats import plain_layout
from petastorm.errors import CodecError, MissingDependencyError, SchemaError

#: The stored type of a ``datasets`` ``Image`` feature.
HF_IMAGE_TYPE = pa.struct([pa.field('bytes', pa.binary()), pa.field('path', pa.string())])
# Channels of the Pillow modes images are delivered in (a mode the feature names is converted to).
_MODE_CHANNELS = {'L': 1, 'LA': 2, 'RGB': 3, 'RGBA': 4, 'I;16': 1, 'I': 1, 'F': 1}
# Pillow modes made into one of the above before their pixels are taken.
_CONVERT = {'1': 'L', 'P': 'RGB', 'PA': 'RGBA', 'CMYK': 'RGB', 'YCbCr': 'RGB', 'LAB': 'RGB', 'HSV': 'RGB',
            'La': 'LA', 'RGBa': 'RGBA', 'RGBX': 'RGB'}


def hf_image_shape(mode: str | None) -> tuple[int | None, ...]:
    """The field shape of images of a Pillow ``mode`` (None: any): ``(H, W, channels)``, sizes left free."""
    return (None, None, _MODE_CHANNELS.get(mode) if mode else None)


class HFImageCodec(DataframeColumnCodec):
    """Decodes a Hugging Face ``Image`` column (``struct<bytes, path>``) into ``(height, width, channels)`` arrays.

    Pixels are Pillow's (what ``datasets`` gives), always three-dimensional: grey images are ``(H, W, 1)``, colour
    ones RGB or RGBA in that order; palette images are expanded to RGB (RGBA with transparency). With ``mode``
    (the feature's own, e.g. ``'RGB'``), every image is converted to it as ``datasets`` does. Images of different
    sizes make an object column of per-row arrays, as other image codecs do.

    Args:
        mode: the Pillow mode to convert every image to, or None to keep each image's own.
    """

    codec_name = 'hf_image'

    def __init__(self, mode: str | None = None) -> None:
        if mode is not None and not isinstance(mode, str):
            raise ValueError(f'HFImageCodec: mode must be a Pillow mode name or None, got {mode!r}')
        self._mode = mode

    @property
    def mode(self) -> str | None:
        """The Pillow mode images are converted to, or None."""
        return self._mode

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, 'mode': self._mode}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> HFImageCodec:
        return cls(description.get('mode'))

    def arrow_type(self) -> pa.DataType:
        return HF_IMAGE_TYPE

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        types = import_optional('pyspark.sql.types', 'HFImageCodec.spark_dtype()')
        return types.StructType([types.StructField('bytes', types.BinaryType(), True),
                                 types.StructField('path', types.StringType(), True)])

    def encode(self, unischema_field: Any, value: Any) -> Any:
        """One image as ``datasets`` stores it: file bytes (arrays become PNG), or a path."""
        if isinstance(value, dict):
            return {'bytes': value.get('bytes'), 'path': value.get('path')}
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {'bytes': bytes(value), 'path': None}
        if isinstance(value, str):
            return {'bytes': None, 'path': value}
        if isinstance(value, np.ndarray):
            from petastorm.codecs._image import CompressedImageCodec

            image = value[..., 0] if value.ndim == 3 and value.shape[2] == 1 else value
            if image.ndim == 3 and image.shape[2] == 4:
                return {'bytes': _pillow_png(image), 'path': None}
            shaped = unischema_field._replace(shape=image.shape) if hasattr(unischema_field, '_replace') else \
                unischema_field
            return {'bytes': CompressedImageCodec('png').encode(shaped, image), 'path': None}
        raise SchemaError(f'field {_field_name(unischema_field)}: an image is an array, the bytes of an image file, '
                          f'a path or a {{"bytes", "path"}} dict; got {type(value).__name__}')

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        if isinstance(value, dict):
            if value.get('bytes') is None:
                raise _path_only_error(unischema_field, value.get('path'))
            value = value['bytes']
        return self._decode_one(unischema_field, memoryview(value), None, None)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Decode a whole column; rows that are null stay None, rows stored as a path only are refused."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if not pa.types.is_struct(column.type) or column.type.get_field_index('bytes') < 0:
            raise CodecError(f'field {_field_name(unischema_field)}: a Hugging Face image column is a struct of '
                             f'"bytes" and "path", got Arrow type {column.type}')
        payloads = column.field('bytes')
        if pa.types.is_large_binary(payloads.type) or pa.types.is_binary(payloads.type):
            pass
        else:
            payloads = payloads.cast(pa.binary())
        row_valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
        paths = column.field('path') if column.type.get_field_index('path') >= 0 else None
        builder = ColumnBuilder(len(column))
        for row, payload in enumerate(_iter_buffers(payloads)):
            if row_valid is not None and not row_valid[row]:
                builder.add(None)
                continue
            if payload is None:
                raise _path_only_error(unischema_field, None if paths is None else paths[row].as_py(), row)
            builder.add(self._decode_one(unischema_field, payload, builder, row))
        return builder.result()

    def _decode_one(self, field: Any, payload: memoryview, builder: ColumnBuilder | None,
                    row: int | None) -> np.ndarray:
        layout = plain_layout(payload)
        fast = layout is not None and (self._mode is None or _MODE_CHANNELS.get(self._mode) == layout.channels)
        if fast:
            assert layout is not None
            shape = (layout.height, layout.width, layout.channels)
            out = builder.reserve(shape, layout.dtype) if builder is not None else None
            target = None if out is None else (out[..., 0] if layout.channels == 1 else out)
            try:
                image = _backends().decode(payload, target, layout)
            except Exception as err:
                raise _decode_error(field, payload, row, err) from err
            if image is None:
                raise _decode_error(field, payload, row, None)
            if image.ndim == 2:
                image = out if out is not None and image is target else image[..., np.newaxis]
            elif image.shape[2] == 4:  # OpenCV's (and Petastorm's) BGRA: make it RGBA, as Pillow gives it
                image[..., [0, 2]] = image[..., [2, 0]]
            return image
        return _pillow_decode(field, payload, self._mode, row)

    def __str__(self) -> str:
        return f'HFImageCodec({self._mode!r})' if self._mode else 'HFImageCodec()'


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as err:
        raise MissingDependencyError("decoding this image needs Pillow (pip install pillow); the PNG and JPEG "
                                     "decoders of 'neo-petastorm[image]' read plain PNG and JPEG files only") from err
    return Image


def _pillow_decode(field: Any, payload: memoryview, mode: str | None, row: int | None) -> np.ndarray:
    image_module = _pillow()
    try:
        with image_module.open(io.BytesIO(payload)) as image:
            image.load()
            if mode is not None and image.mode != mode:
                image = image.convert(mode)
            elif image.mode not in _MODE_CHANNELS:
                target = _CONVERT.get(image.mode, 'RGB')
                if image.mode == 'P' and 'transparency' in image.info:
                    target = 'RGBA'
                image = image.convert(target)
            pixels = np.asarray(image)
    except MissingDependencyError:
        raise
    except Exception as err:
        raise _decode_error(field, payload, row, err) from err
    return pixels[..., np.newaxis] if pixels.ndim == 2 else pixels


def _pillow_png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    _pillow().fromarray(image).save(buffer, format='PNG')
    return buffer.getvalue()


def _decode_error(field: Any, payload: memoryview, row: int | None, err: Exception | None) -> CodecError:
    where = '' if row is None else f' (row {row} of the column)'
    detail = f': {err}' if err is not None else ''
    return CodecError(f'field {_field_name(field)}{where}: the stored value is not a decodable image '
                      f'({len(payload)} bytes){detail}')


def _path_only_error(field: Any, path: str | None, row: int | None = None) -> CodecError:
    where = '' if row is None else f' (row {row} of the column)'
    if path is None:
        return CodecError(f'field {_field_name(field)}{where}: the image has neither bytes nor a path')
    return CodecError(f'field {_field_name(field)}{where}: the image is stored as the path {path!r} only, which '
                      f'was not found; keep the image files next to the dataset (paths are taken relative to the '
                      f'data file), or write the dataset with the images embedded (datasets: Dataset.to_parquet '
                      f'after ds = ds.cast_column(name, Image()) on loaded files, or embed_external_files=True)')


class ClassLabelCodec(LabelNames):
    """A ``datasets`` ``ClassLabel`` column: integers stored natively, with the names of the classes.

    Args:
        names: the class names, by label.
        arrow_type: the stored integer type (default int64, what ``datasets`` stores).

    Example::

        codec = reader.schema.fields['label'].codec
        codec.names[3], codec.int2str(3), codec.str2int('cat')
    """

    codec_name = 'class_label'

    def __init__(self, names: list[str], arrow_type: pa.DataType | None = None) -> None:
        super().__init__(pa.int64() if arrow_type is None else arrow_type)
        self.names = [str(name) for name in names]

    def __str__(self) -> str:
        return f'ClassLabelCodec({len(self.names)} names, {self.arrow_type()})'
