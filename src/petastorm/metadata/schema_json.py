"""The versioned JSON form of a :class:`~petastorm.unischema.Unischema`, as stored in dataset metadata.

Document layout (``format_version`` 1)::

    {"format_version": 1, "name": "HelloWorldSchema",
     "fields": [{"name": "id", "numpy_dtype": "int32", "shape": [], "nullable": false,
                 "codec": {"codec": "scalar", "type": "int32"}}, ...]}

Numpy types are named from an explicit table (never resolved with ``getattr``), codecs by their registry name.
"""

from __future__ import annotations

import decimal
import json
from typing import Any

import numpy as np

from petastorm.codecs import codec_from_json
from petastorm.errors import PetastormMetadataError, SchemaError
from petastorm.unischema import Unischema, UnischemaField

__all__ = [
    'FORMAT_VERSION', 'dtype_from_name', 'dtype_to_name', 'field_from_json', 'field_to_json', 'unischema_from_json',
    'unischema_to_json',
]

FORMAT_VERSION = 1

_DTYPES_BY_NAME: dict[str, Any] = {
    **{np.dtype(t).name: t for t in (
        np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
        np.float16, np.float32, np.float64, np.complex64, np.complex128)},
    'bool': np.bool_,
    'str': np.str_,
    'bytes': np.bytes_,
    'datetime64': np.datetime64,
    'timedelta64': np.timedelta64,
    'object': np.object_,
    'Decimal': decimal.Decimal,
    'dict': dict,  # struct and map fields: a dict per row (their Arrow type is in the codec)
    'none': None,
}
_NAMES_BY_DTYPE = {dtype: name for name, dtype in _DTYPES_BY_NAME.items()}


def dtype_to_name(numpy_dtype: Any, field_name: str = '') -> str:
    """The persisted name of a field's ``numpy_dtype``."""
    name = _NAMES_BY_DTYPE.get(numpy_dtype)
    if name is None:
        try:
            name = _NAMES_BY_DTYPE.get(np.dtype(numpy_dtype).type)
        except TypeError:
            name = None
    if name is None:
        raise SchemaError(f'field {field_name!r}: numpy_dtype {numpy_dtype!r} cannot be stored in the schema '
                          f'metadata; supported: {", ".join(sorted(_DTYPES_BY_NAME))}')
    return name


def dtype_from_name(name: object, where: str = '') -> Any:
    """Inverse of :func:`dtype_to_name`.

    Args:
        name: the stored name (anything a JSON document may hold there).
        where: what holds the name, for the message.

    Raises:
        PetastormMetadataError: ``name`` is not a known numpy type name.
    """
    if not isinstance(name, str) or name not in _DTYPES_BY_NAME:
        raise PetastormMetadataError(f'unknown numpy_dtype {name!r}{" in " + where if where else ""}; expected one '
                                     f'of {", ".join(sorted(_DTYPES_BY_NAME))}')
    return _DTYPES_BY_NAME[name]


def field_to_json(field: UnischemaField) -> dict[str, Any]:
    """The JSON description of one field."""
    return {
        'name': field.name,
        'numpy_dtype': dtype_to_name(field.numpy_dtype, field.name),
        'shape': [None if d is None else int(d) for d in field.shape],
        'nullable': bool(field.nullable),
        'codec': None if field.codec is None else field.codec.to_json(),
    }


def field_from_json(description: Any, where: str = '') -> UnischemaField:
    """Inverse of :func:`field_to_json`."""
    if not isinstance(description, dict) or not isinstance(description.get('name'), str):
        raise PetastormMetadataError(f'malformed field description {description!r}{" in " + where if where else ""}')
    name = description['name']
    here = f'field {name!r}' + (f' of {where}' if where else '')
    shape = description.get('shape', [])
    if not isinstance(shape, list) or not all(d is None or (isinstance(d, int) and d >= 0) for d in shape):
        raise PetastormMetadataError(f'{here}: shape must be a list of non-negative ints or nulls, got {shape!r}')
    codec = description.get('codec')
    try:
        codec_obj = None if codec is None else codec_from_json(codec, here)
    except (SchemaError, KeyError, TypeError, ValueError) as err:
        raise PetastormMetadataError(str(err)) from err
    return UnischemaField(name, dtype_from_name(description.get('numpy_dtype'), here), tuple(shape), codec_obj,
                          bool(description.get('nullable', False)))


def unischema_to_json(schema: Unischema) -> str:
    """Serialize a schema to the JSON text stored in the metadata."""
    return json.dumps({'format_version': FORMAT_VERSION, 'name': schema._name,
                       'fields': [field_to_json(f) for f in schema.fields.values()]}, sort_keys=True)


def unischema_from_json(text: str | bytes, where: str = '') -> Unischema:
    """Parse :func:`unischema_to_json` output.

    Raises:
        PetastormMetadataError: malformed JSON, an unknown codec or type, or a newer ``format_version``; the
            message names ``where`` (the metadata file) and what was expected.
    """
    suffix = f' in {where}' if where else ''
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise PetastormMetadataError(f'the stored schema{suffix} is not valid JSON: {err}') from err
    if not isinstance(document, dict):
        raise PetastormMetadataError(f'the stored schema{suffix} must be a JSON object, got {type(document).__name__}')
    version = document.get('format_version')
    if not isinstance(version, int) or version < 1:
        raise PetastormMetadataError(f'the stored schema{suffix} has no valid format_version ({version!r})')
    if version > FORMAT_VERSION:
        raise PetastormMetadataError(
            f'the stored schema{suffix} has format_version {version}, written by a newer petastorm; this version '
            f'reads format_version <= {FORMAT_VERSION}. Upgrade petastorm to read this dataset.')
    fields = document.get('fields')
    if not isinstance(fields, list):
        raise PetastormMetadataError(f'the stored schema{suffix} has no "fields" list')
    return Unischema(str(document.get('name', 'schema')), [field_from_json(f, where) for f in fields])
