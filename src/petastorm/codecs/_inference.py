"""The field a column of a plain Parquet file is read as: its numpy type, its shape and the codec that decodes it.

A dataset that stores no Unischema has one inferred (:func:`petastorm.unischema.infer_unischema`), one field per
column, from what the file says of the column:

* the Hugging Face feature stored beside it (:func:`field_type_of_feature`);
* else its Arrow type (:func:`field_type_of_column`): an Arrow tensor extension column of numbers is an n-d field
  decoded by :class:`~petastorm.codecs.ArrowTensorCodec`; other columns are typed by
  :func:`petastorm.typemaps.scalars.field_type_of_arrow`, with a :class:`~petastorm.codecs.ScalarCodec` of the
  column's type when the numpy type and shape do not say it all.

``Dataset.to_parquet`` (and the Hub's Parquet files) store the dataset's features as JSON under the schema
metadata key ``huggingface``. Arrow's types say most of it (``Value``, ``Sequence``/``List``); the features add
what they do not:

* ``Image``: the ``struct<bytes, path>`` column is an image field, decoded by
  :class:`~petastorm.codecs.HFImageCodec` (``mode`` kept);
* ``ClassLabel``: an integer field whose :class:`~petastorm.codecs.ClassLabelCodec` holds the class names;
* ``Array2D`` ... ``Array5D``: an n-d field of the feature's shape and dtype (a ``None`` first dimension varies);
* ``Audio``: a float32 field decoded by :class:`~petastorm.codecs.AudioCodec` at the feature's ``sampling_rate``:
  mono ``(samples,)`` unless the feature asks for channels (``num_channels`` of 2 or more, or ``mono: false``:
  ``(channels, samples)``); ``datasets`` before version 4 delivered mono by default too;
* ``Video``: a uint8 field of ``(frames, H, W, 3)`` decoded by :class:`~petastorm.codecs.VideoCodec` (every frame;
  a reader given a field with another ``VideoCodec`` samples frames: docs/media.md).

Features with ``decode: false`` and others (translations...) are read as their Arrow types say (structs of bytes and
paths, dicts of strings). Nothing is fetched: the metadata is all that is read.

The choice is the codecs' to make (each codec knows the columns it reads), so this sits below the Unischema, which
wraps each ``(numpy type, shape, codec)`` into a field.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._warnings import warn_user
from petastorm.codecs._audio import AudioCodec
from petastorm.codecs._hf import ClassLabelCodec, HFImageCodec, hf_image_shape
from petastorm.codecs._scalar import ScalarCodec
from petastorm.codecs._tensor import ArrowTensorCodec
from petastorm.codecs._video import VideoCodec
from petastorm.typemaps.scalars import field_type_of_arrow

logger = logging.getLogger(__name__)

#: The schema metadata key ``datasets`` writes its features under.
HF_METADATA_KEY = b'huggingface'
_ARRAY_FEATURES = {'Array2D', 'Array3D', 'Array4D', 'Array5D'}

#: ``(numpy type, shape, codec or None)``: what a field makes of a column.
FieldType = tuple[Any, tuple[int | None, ...], Any]


def hf_features(arrow_schema: pa.Schema) -> dict[str, Any]:
    """The top-level features of a ``datasets`` schema (``{column: feature JSON}``), empty for other files.

    Metadata that is not valid JSON, or not of the expected form, is ignored with a warning in the log: the
    columns are then read as their Arrow types say.
    """
    metadata = arrow_schema.metadata or {}
    raw = metadata.get(HF_METADATA_KEY)
    if raw is None:
        return {}
    try:
        features = json.loads(raw)['info']['features']
    except (ValueError, KeyError, TypeError):
        logger.warning('the huggingface schema metadata is not what datasets writes; its features are ignored')
        return {}
    return features if isinstance(features, dict) else {}


def field_type_of_feature(feature: Any, arrow_type: pa.DataType) -> FieldType | None:
    """``(numpy type, shape, codec)`` of the field a ``datasets`` feature makes of a column, or None.

    None means that the feature adds nothing to the column's Arrow type (the field is inferred from it).
    """
    if not isinstance(feature, dict):
        return None
    kind = feature.get('_type')
    if kind == 'Image' and pa.types.is_struct(arrow_type) and arrow_type.get_field_index('bytes') >= 0 and \
            feature.get('decode', True):
        mode = feature.get('mode')
        return np.uint8, hf_image_shape(mode), HFImageCodec(mode)
    if kind in ('Audio', 'Video') and pa.types.is_struct(arrow_type) and arrow_type.get_field_index('bytes') >= 0 \
            and feature.get('decode', True):
        return _audio_field(feature) if kind == 'Audio' else (np.uint8, (None, None, None, 3), VideoCodec(layout='hf'))
    if kind == 'ClassLabel' and pa.types.is_integer(arrow_type):
        names = feature.get('names') or []
        numpy_type = np.dtype(arrow_type.to_pandas_dtype()).type
        return numpy_type, (), ClassLabelCodec(list(names), arrow_type)
    if kind in _ARRAY_FEATURES and isinstance(feature.get('shape'), list):
        try:
            numpy_type = np.dtype(feature.get('dtype', 'float32')).type
        except TypeError:
            return None
        shape = tuple(None if d is None else int(d) for d in feature['shape'])
        return numpy_type, shape, ScalarCodec(plain_type(arrow_type))
    return None


def _audio_field(feature: dict[str, Any]) -> FieldType:
    """The field of an ``Audio`` feature: mono unless it asks for channels, at its sampling rate."""
    rate = feature.get('sampling_rate')
    rate = int(rate) if isinstance(rate, int) and rate > 0 else None
    channels = feature.get('num_channels')
    channels = int(channels) if isinstance(channels, int) and channels > 0 else None
    mono = bool(feature.get('mono', True)) if channels is None else channels == 1
    if mono:
        return np.float32, (None,), AudioCodec(sample_rate=rate, mono=True, layout='hf')
    return np.float32, (channels, None), AudioCodec(sample_rate=rate, channels=channels, layout='hf')


def field_type_of_column(arrow_field: pa.Field, omit_unsupported: bool) -> FieldType | None:
    """``(numpy type, shape, codec or None)`` of the field a column of a plain Parquet file is read as.

    Returns None for a column of a type no field reads, with a warning naming it, when ``omit_unsupported``.

    Raises:
        ValueError: the column's type is unsupported and ``omit_unsupported`` is False.
    """
    tensor = ArrowTensorCodec.field_type_of_column(arrow_field.type, arrow_field.metadata)
    if tensor is not None:
        return tensor[0], tensor[1], ArrowTensorCodec()
    described = field_type_of_arrow(arrow_field.type)
    if described is None:
        if not omit_unsupported:
            raise ValueError(f'Cannot auto-create unischema due to unsupported column type {arrow_field.type} '
                             f'of column {arrow_field.name!r}')
        warn_user(f'Column {arrow_field.name!r} has an unsupported field {arrow_field.type}. Ignoring...',
                  UserWarning)
        return None
    numpy_type, shape, needs_codec = described
    return numpy_type, shape, ScalarCodec(plain_type(arrow_field.type)) if needs_codec else None


def plain_type(arrow_type: pa.DataType) -> pa.DataType:
    """The type a reader decodes a column of ``arrow_type`` as: extension types as their storage."""
    return arrow_type.storage_type if isinstance(arrow_type, pa.BaseExtensionType) else arrow_type
