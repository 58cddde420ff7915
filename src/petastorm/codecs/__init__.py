"""Codecs: how a field's values are stored in a Parquet cell, and how whole columns are decoded back.

Byte formats are the standard ones Petastorm uses, so datasets move between the two implementations:

* :class:`NdarrayCodec`: a ``.npy`` file (what ``np.save`` writes);
* :class:`CompressedNdarrayCodec`: an ``.npz`` archive holding ``arr.npy`` (``np.savez_compressed``);
* :class:`CompressedImageCodec`: a standard PNG or JPEG of the RGB (or grey) image;
* :class:`ScalarCodec`: the native Parquet value of a Spark/Arrow type;
* :class:`ArrowTensorCodec`: numeric arrays as Arrow's ``fixed_shape_tensor`` / ``variable_shape_tensor`` columns
  (not Petastorm's format: Arrow tools read them as tensors, Petastorm 0.13.1 cannot);
* :class:`HFImageCodec` and :class:`ClassLabelCodec`: Hugging Face ``datasets`` ``Image`` and ``ClassLabel``
  columns (the structs of image file bytes and paths, and class integers with their names);
* :class:`CategoryCodec`: values (categorical, dictionary-encoded or plain) read as int64 codes into a list of
  categories (what readers give the fields of ``categorical_codes=``);
* :class:`AudioCodec` and :class:`VideoCodec`: audio and video files (a binary column, or Hugging Face's ``Audio``
  and ``Video`` structs) decoded to float32 samples and to sampled uint8 RGB frames (docs/media.md).

Every codec has a stable registry name and a JSON description (:meth:`DataframeColumnCodec.to_json`) that is
what the dataset metadata stores. ``decode_column`` decodes a whole Arrow column at once; readers call it per
row group, never per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs._audio import AudioCodec
from petastorm.codecs._base import ColumnBuilder, DataframeColumnCodec, _shape_matches, check_array, stack_or_objects
from petastorm.codecs._category import CategoryCodec
from petastorm.codecs._hf import ClassLabelCodec, HFImageCodec
from petastorm.codecs._image import CompressedImageCodec
from petastorm.codecs._media import decode_stored_column
from petastorm.codecs._ndarray import CompressedNdarrayCodec, NdarrayCodec
from petastorm.codecs._scalar import ScalarCodec
from petastorm.codecs._tensor import ArrowTensorCodec
from petastorm.codecs._video import VideoCodec
from petastorm.errors import SchemaError
from petastorm.typemaps.scalars import native_arrow_type, to_arrow_scalar, to_arrow_value

__all__ = ['CODECS_BY_NAME', 'ArrowTensorCodec', 'AudioCodec', 'CategoryCodec', 'ClassLabelCodec', 'ColumnBuilder',
           'CompressedImageCodec', 'CompressedNdarrayCodec', 'DataframeColumnCodec', 'HFImageCodec', 'NdarrayCodec',
           'ScalarCodec', 'VideoCodec', 'check_array', 'codec_from_json', 'decode_stored_column', 'encode_value',
           'stack_or_objects']

OPENCV_AVAILABLE: bool
"""Kept for compatibility; computed on first access without importing OpenCV eagerly."""


def __getattr__(name: str) -> Any:
    if name == 'OPENCV_AVAILABLE':
        import importlib.util

        return importlib.util.find_spec('cv2') is not None
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


# The classes live in private modules but are named ``petastorm.codecs.<Class>``, so pickles, reprs and
# Petastorm's own references keep the one public path.
for _cls in (DataframeColumnCodec, NdarrayCodec, CompressedNdarrayCodec, CompressedImageCodec, ScalarCodec,
             ArrowTensorCodec, HFImageCodec, ClassLabelCodec, CategoryCodec, AudioCodec, VideoCodec):
    _cls.__module__ = __name__
del _cls

CODECS_BY_NAME: dict[str, type[DataframeColumnCodec]] = {
    cls.codec_name: cls for cls in (NdarrayCodec, CompressedNdarrayCodec, CompressedImageCodec, ScalarCodec,
                                    ArrowTensorCodec, HFImageCodec, ClassLabelCodec, CategoryCodec, AudioCodec,
                                    VideoCodec)}


def codec_from_json(description: dict[str, Any], where: str = '') -> DataframeColumnCodec:
    """Rebuild a codec from its JSON description.

    Raises:
        SchemaError: the codec name is unknown (the message names it, ``where`` it was found, and the known names).
    """
    name = description.get('codec') if isinstance(description, dict) else None
    cls = CODECS_BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        raise SchemaError(f'unknown codec {name!r}{" in " + where if where else ""}; known codecs: '
                          f'{", ".join(sorted(CODECS_BY_NAME))}')
    return cls.from_json(description)


def encode_value(field: Any, value: Any) -> Any:
    """Encode one non-None value of ``field`` for storage (codec, or native scalar/list conversion).

    Args:
        field: the :class:`~petastorm.unischema.UnischemaField` the value belongs to.
        value: the value, as ``dict_to_spark_row`` takes it.

    Returns:
        What the field's Parquet cell stores (bytes for payload codecs, a Python scalar or list otherwise).

    Raises:
        SchemaError: the value's type or shape does not match the field.
    """
    if field.codec is not None:
        return field.codec.encode(field, value)
    arrow_type = native_arrow_type(field)
    if pa.types.is_list(arrow_type) and len(field.shape) > 1:
        return to_arrow_value(field.name, arrow_type, value)  # ragged rows of several dimensions
    if pa.types.is_list(arrow_type):
        array = np.asarray(value)
        if array.ndim != 1 or not _shape_matches(tuple(field.shape), array.shape):
            raise SchemaError(f'Unexpected dimensions of {field.name} feature, expected {tuple(field.shape)}, '
                              f'got {array.shape}')
        return [to_arrow_scalar(field.name, arrow_type.value_type, v) for v in array.tolist()]
    if isinstance(value, np.generic) and field.numpy_dtype is not None and isinstance(field.numpy_dtype, type) \
            and issubclass(field.numpy_dtype, np.generic) and not isinstance(value, field.numpy_dtype) \
            and np.dtype(type(value)).kind != np.dtype(field.numpy_dtype).kind:
        raise SchemaError(f'Unexpected type of {field.name} feature, expected {np.dtype(field.numpy_dtype)}, '
                          f'got {np.dtype(type(value))}')
    return to_arrow_scalar(field.name, arrow_type, value)
