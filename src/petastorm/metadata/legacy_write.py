"""Writing Petastorm's legacy schema entry, so that Petastorm releases can open datasets we write.

Petastorm stores its schema under ``dataset-toolkit.unischema.v1`` as a pickle of its own classes. We do not
have (or mimic) those classes: the pickle is produced from a *description* of the objects Petastorm expects
(module path, class name, constructor arguments and instance state) by a small opcode writer. The bytes use
only globals that Petastorm's own restricted unpickler allows (``petastorm``, ``pyspark``, ``numpy``,
``collections``, ``decimal``) and that our guarded reader in :mod:`petastorm.metadata.legacy` resolves.

The structure written is the one Petastorm's Python 3 writer produces:

* ``petastorm.unischema.Unischema`` created with ``NEWOBJ()`` and ``BUILD`` with ``{'_name', '_fields'
  (an OrderedDict), one entry per field name}``;
* each field a ``petastorm.unischema.UnischemaField`` created with ``NEWOBJ`` of ``(name, numpy type, shape,
  codec or None, nullable)``;
* codecs ``petastorm.codecs.<Class>`` with their ``__dict__`` state; a ``ScalarCodec`` holds a
  ``pyspark.sql.types.<Name>Type`` instance.
"""

from __future__ import annotations

import decimal
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import PetastormMetadataError
from petastorm.unischema import Unischema, UnischemaField

__all__ = [
    'PROTOCOL',
    'LegacySchemaError',
    'PickledGlobal',
    'PickledObject',
    'describe_unischema',
    'dumps_description',
    'unischema_to_legacy_pickle',
]

#: The pickle protocol Petastorm's writer used on Python 3.8+.
PROTOCOL = 4

# Attributes of Petastorm's Unischema class: a field with one of these names gets no per-field attribute
# (Petastorm's constructor skips names the object already has, and an instance entry would shadow a method).
_UNISCHEMA_CLASS_ATTRIBUTES = frozenset({
    'fields', 'create_schema_view', 'make_namedtuple', 'make_namedtuple_tf', 'as_spark_schema',
    'from_arrow_schema', 'get_field_by_name',
})

# numpy scalar types by the attribute name that resolves in every numpy release (1.x and 2.x).
_NUMPY_NAMES = {
    np.bool_: 'bool_', np.str_: 'str_', np.bytes_: 'bytes_', np.object_: 'object_',
    np.int8: 'int8', np.int16: 'int16', np.int32: 'int32', np.int64: 'int64',
    np.uint8: 'uint8', np.uint16: 'uint16', np.uint32: 'uint32', np.uint64: 'uint64',
    np.float16: 'float16', np.float32: 'float32', np.float64: 'float64',
    np.complex64: 'complex64', np.complex128: 'complex128',
    np.datetime64: 'datetime64', np.timedelta64: 'timedelta64',
}


class LegacySchemaError(PetastormMetadataError):
    """The schema holds something Petastorm's pickled schema cannot express (e.g. a custom codec)."""


@dataclass(frozen=True)
class PickledGlobal:
    """A reference to a class or function by module path and qualified name (no import is done)."""

    module: str
    qualname: str


@dataclass(eq=False)
class PickledObject:
    """An object to rebuild on load.

    ``cls(*args)`` through ``NEWOBJ`` (``cls.__new__``) or, with ``reduce=True``, by calling ``cls`` (``REDUCE``);
    then ``items`` are set as mapping entries and ``state`` is applied with ``BUILD`` (skipped when empty).
    """

    cls: PickledGlobal
    args: tuple = ()
    state: dict[str, Any] | None = None
    items: list[tuple[Any, Any]] | None = None
    reduce: bool = False


class _OpcodeWriter:
    """Emits protocol-4 pickle opcodes for plain values, :class:`PickledGlobal` and :class:`PickledObject`."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._memo: dict[Any, int] = {}

    def _get(self, index: int) -> None:
        self._out += b'h' + bytes([index]) if index < 256 else b'j' + struct.pack('<I', index)

    def _memoize(self, key: Any) -> None:
        self._memo[key] = len(self._memo)
        self._out += b'\x94'  # MEMOIZE

    def dumps(self, obj: Any) -> bytes:
        self._out += b'\x80' + bytes([PROTOCOL])
        self._save(obj)
        self._out += b'.'
        return bytes(self._out)

    def _save(self, obj: Any) -> None:
        if obj is None:
            self._out += b'N'
        elif obj is True or obj is False:
            self._out += b'\x88' if obj else b'\x89'
        elif isinstance(obj, int):
            self._save_int(obj)
        elif isinstance(obj, float):
            self._out += b'G' + struct.pack('>d', obj)
        elif isinstance(obj, str):
            self._save_str(obj)
        elif isinstance(obj, tuple):
            self._save_tuple(obj)
        elif isinstance(obj, dict):
            self._out += b'}'
            self._save_items(list(obj.items()))
        elif isinstance(obj, PickledGlobal):
            self._save_global(obj)
        elif isinstance(obj, PickledObject):
            self._save_object(obj)
        else:
            raise LegacySchemaError(f'cannot write {type(obj).__name__} values into a legacy pickle')

    def _save_int(self, value: int) -> None:
        if 0 <= value < 256:
            self._out += b'K' + bytes([value])
        elif -2 ** 31 <= value < 2 ** 31:
            self._out += b'J' + struct.pack('<i', value)
        else:
            encoded = value.to_bytes((value.bit_length() + 8) // 8, 'little', signed=True)
            self._out += b'\x8a' + bytes([len(encoded)]) + encoded  # LONG1

    def _save_str(self, value: str) -> None:
        encoded = value.encode('utf-8', 'surrogatepass')
        if len(encoded) < 256:
            self._out += b'\x8c' + bytes([len(encoded)]) + encoded
        else:
            self._out += b'X' + struct.pack('<I', len(encoded)) + encoded

    def _save_tuple(self, value: tuple) -> None:
        if not value:
            self._out += b')'
            return
        self._out += b'('
        for item in value:
            self._save(item)
        self._out += b't'

    def _save_items(self, items: list[tuple[Any, Any]]) -> None:
        if not items:
            return
        self._out += b'('
        for key, value in items:
            self._save(key)
            self._save(value)
        self._out += b'u'  # SETITEMS

    def _save_global(self, ref: PickledGlobal) -> None:
        key = ('global', ref.module, ref.qualname)
        if key in self._memo:
            self._get(self._memo[key])
            return
        self._out += b'c' + ref.module.encode() + b'\n' + ref.qualname.encode() + b'\n'
        self._memoize(key)

    def _save_object(self, obj: PickledObject) -> None:
        key = ('object', id(obj))
        if key in self._memo:
            self._get(self._memo[key])
            return
        self._save_global(obj.cls)
        self._save_tuple(obj.args)
        self._out += b'R' if obj.reduce else b'\x81'  # REDUCE / NEWOBJ
        self._memoize(key)
        if obj.items:
            self._save_items(obj.items)
        if obj.state:
            self._save(obj.state)
            self._out += b'b'  # BUILD


def _spark_type(arrow_type: pa.DataType, where: str) -> PickledObject:
    """The ``pyspark.sql.types`` instance Spark uses to store ``arrow_type`` (as Petastorm's ScalarCodec holds)."""

    def spark(name: str, state: dict[str, Any] | None = None) -> PickledObject:
        return PickledObject(PickledGlobal('pyspark.sql.types', name), state=state)

    if pa.types.is_decimal(arrow_type):
        return spark('DecimalType', {'precision': arrow_type.precision, 'scale': arrow_type.scale,
                                     'hasPrecisionInfo': True})
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        # pyspark 4 StringType methods read ``collation``; older pyspark ignores the extra attribute.
        return spark('StringType', {'collation': 'UTF8_BINARY'})
    if pa.types.is_timestamp(arrow_type):
        return spark('TimestampType' if arrow_type.tz else 'TimestampNTZType')
    simple = {
        pa.int8(): 'ByteType', pa.int16(): 'ShortType', pa.int32(): 'IntegerType', pa.int64(): 'LongType',
        pa.uint8(): 'ShortType', pa.uint16(): 'IntegerType', pa.uint32(): 'LongType',
        pa.float32(): 'FloatType', pa.float64(): 'DoubleType', pa.bool_(): 'BooleanType',
        pa.binary(): 'BinaryType', pa.large_binary(): 'BinaryType', pa.date32(): 'DateType',
    }
    for candidate, name in simple.items():
        if arrow_type == candidate:
            return spark(name)
    raise LegacySchemaError(f'{where}: Arrow type {arrow_type} has no Spark type Petastorm could hold')


def _codec(codec: Any, where: str) -> PickledObject | None:
    def petastorm_codec(name: str, state: dict[str, Any] | None = None) -> PickledObject:
        return PickledObject(PickledGlobal('petastorm.codecs', name), state=state)

    if codec is None:
        return None
    if isinstance(codec, ScalarCodec):
        return petastorm_codec('ScalarCodec', {'_spark_type': _spark_type(codec.arrow_type(), where)})
    if isinstance(codec, CompressedImageCodec):
        return petastorm_codec('CompressedImageCodec', {'_image_codec': '.' + codec.image_codec,
                                                        '_quality': int(codec.quality)})
    if isinstance(codec, CompressedNdarrayCodec):
        return petastorm_codec('CompressedNdarrayCodec')
    if isinstance(codec, NdarrayCodec):
        return petastorm_codec('NdarrayCodec')
    raise LegacySchemaError(f'{where}: codec {type(codec).__name__} has no Petastorm equivalent')


def _numpy_type(numpy_dtype: Any, where: str) -> PickledGlobal:
    if numpy_dtype is decimal.Decimal:
        return PickledGlobal('decimal', 'Decimal')
    name = _NUMPY_NAMES.get(numpy_dtype)
    if name is None:
        raise LegacySchemaError(f'{where}: numpy type {numpy_dtype!r} cannot be written as a Petastorm type')
    return PickledGlobal('numpy', name)


def _field(f: UnischemaField, where: str) -> PickledObject:
    here = f'{where}, field {f.name!r}'
    shape = tuple(None if d is None else int(d) for d in f.shape)
    return PickledObject(PickledGlobal('petastorm.unischema', 'UnischemaField'),
                         args=(str(f.name), _numpy_type(f.numpy_dtype, here), shape, _codec(f.codec, here),
                               bool(f.nullable)))


def describe_unischema(schema: Unischema, where: str = 'schema') -> PickledObject:
    """The description of the Petastorm ``Unischema`` object equivalent to ``schema``.

    Raises:
        LegacySchemaError: a field's type or codec cannot be expressed with Petastorm's classes.
    """
    fields = [(name, _field(f, where)) for name, f in schema.fields.items()]
    ordered = PickledObject(PickledGlobal('collections', 'OrderedDict'), reduce=True, items=fields)
    state: dict[str, Any] = {'_name': schema._name, '_fields': ordered}
    for name, described in fields:
        if name not in state and name not in _UNISCHEMA_CLASS_ATTRIBUTES and not name.startswith('__'):
            state[name] = described
    return PickledObject(PickledGlobal('petastorm.unischema', 'Unischema'), state=state)


def dumps_description(obj: Any) -> bytes:
    """Pickle bytes (protocol 4) for a tree of plain values, :class:`PickledGlobal` and :class:`PickledObject`."""
    return _OpcodeWriter().dumps(obj)


def unischema_to_legacy_pickle(schema: Unischema, where: str = 'schema') -> bytes:
    """The value of ``dataset-toolkit.unischema.v1`` that Petastorm releases read as ``schema``.

    Raises:
        LegacySchemaError: the schema cannot be expressed with Petastorm's classes.
    """
    return dumps_description(describe_unischema(schema, where))
