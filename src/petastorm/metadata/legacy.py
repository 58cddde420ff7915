"""The guarded reader of the pickles that Petastorm releases stored in dataset metadata.

Petastorm stored its schema (``dataset-toolkit.unischema.v1``) and its row-group indexes
(``dataset-toolkit.rowgroups_index.v1``) as pickles. Opening a dataset must never run code from it, so the
unpickler resolves globals from an explicit allow-list only. Petastorm's own classes are not imported (they are
not ours to mimic): they resolve to inert stand-ins that merely collect the pickled state, and the stand-ins
are then converted to our :class:`~petastorm.unischema.Unischema`. Spark types resolve to stand-ins too, so no
pyspark is needed. Everything else raises :class:`LegacyPickleRefusedError` before anything is called.
"""

from __future__ import annotations

import collections
import decimal
import io
import logging
import pickle
from typing import Any

import numpy as np

from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import PetastormMetadataError
from petastorm.typemaps.spark import arrow_type_from_spark
from petastorm.unischema import Unischema, UnischemaField

__all__ = ['LegacyPickleRefusedError', 'legacy_indexes_from_pickle', 'restricted_loads', 'unischema_from_legacy_pickle']

logger = logging.getLogger(__name__)


class LegacyPickleRefusedError(PetastormMetadataError, pickle.UnpicklingError):
    """A legacy pickle referenced a global outside the allow-list; nothing from it was executed."""


class _Stateful:
    """An inert stand-in for a pickled object: it only records the state pickle hands to it."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) form
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f'unexpected state {type(state).__name__} for {type(self).__name__}')
        self.__dict__.update(state)


class _LegacyUnischema(_Stateful):
    pass


class _LegacyField(tuple):
    """Stand-in for Petastorm's ``UnischemaField`` (a 4- or 5-tuple)."""

    def __new__(cls, *args: Any) -> _LegacyField:
        return tuple.__new__(cls, args)


class _LegacyCodec(_Stateful):
    kind = ''


def _codec_class(kind: str) -> type:
    return type(f'_Legacy{kind}', (_LegacyCodec,), {'kind': kind})


class _LegacySparkType(_Stateful):
    """Stand-in for a ``pyspark.sql.types`` instance; its class name is the Spark type's name."""


def _spark_type_class(name: str) -> type:
    return type(name, (_LegacySparkType,), {})


class _LegacyIndexer(_Stateful):
    kind = ''


def _indexer_class(kind: str) -> type:
    return type(f'_Legacy{kind}', (_LegacyIndexer,), {'kind': kind})


_STAND_INS: dict[str, type] = {'Unischema': _LegacyUnischema, 'UnischemaField': _LegacyField}
_STAND_INS.update({name: _codec_class(name) for name in (
    'ScalarCodec', 'NdarrayCodec', 'CompressedNdarrayCodec', 'CompressedImageCodec')})
_INDEXERS = {name: _indexer_class(name) for name in ('SingleFieldIndexer', 'FieldNotNullIndexer')}
_SPARK_TYPES = {name: _spark_type_class(name) for name in (
    'ByteType', 'ShortType', 'IntegerType', 'LongType', 'FloatType', 'DoubleType', 'BooleanType', 'StringType',
    'BinaryType', 'DateType', 'TimestampType', 'TimestampNTZType', 'DecimalType', 'NullType')}


def _numpy_core(name: str) -> Any:
    for module in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        try:
            return getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
    raise pickle.UnpicklingError(f'numpy has no {name}')


def _reconstructor(cls: type, base: type, state: Any) -> Any:
    """Safe replacement for ``copyreg._reconstructor`` (protocol 0/1 pickles): only for our stand-ins."""
    if not (isinstance(cls, type) and issubclass(cls, (_Stateful, _LegacyField))):
        raise LegacyPickleRefusedError(f'copy_reg._reconstructor of {cls!r} is forbidden')
    if issubclass(cls, tuple):
        return cls(*(state or ()))
    return cls.__new__(cls)


def _restore_namedtuple(name: str, fields: tuple, values: tuple) -> Any:
    """Replacement for ``pyspark.serializers._restore``: Petastorm 0.4-0.7 pickled fields as namedtuples."""
    if name != 'UnischemaField':
        raise LegacyPickleRefusedError(f'pyspark.serializers._restore of {name!r} is forbidden')
    return _LegacyField(*values)


def _ndarray_reconstruct(*args: Any) -> Any:
    return _numpy_core('_reconstruct')(*args)


def _numpy_scalar(*args: Any) -> Any:
    return _numpy_core('scalar')(*args)


def _codecs_encode(text: str, encoding: str = 'utf-8') -> bytes:
    # Python 3 pickles bytes for protocols < 3 as _codecs.encode(str, 'latin1').
    if encoding not in ('latin1', 'latin-1', 'utf-8', 'utf8', 'ascii'):
        raise LegacyPickleRefusedError(f'_codecs.encode with encoding {encoding!r} is forbidden')
    return text.encode(encoding)


_NUMPY_TYPES = {
    'str_': np.str_, 'unicode_': np.str_, 'unicode': np.str_, 'bytes_': np.bytes_, 'string_': np.bytes_,
    'bool_': np.bool_, 'bool': np.bool_, 'object_': np.object_, 'int8': np.int8, 'uint8': np.uint8,
    'int16': np.int16, 'uint16': np.uint16, 'int32': np.int32, 'uint32': np.uint32, 'int64': np.int64,
    'uint64': np.uint64, 'float16': np.float16, 'float32': np.float32, 'float64': np.float64,
    'float_': np.float64, 'complex64': np.complex64, 'complex128': np.complex128, 'datetime64': np.datetime64,
    'timedelta64': np.timedelta64, 'dtype': np.dtype, 'ndarray': np.ndarray,
}

_BUILTINS = {
    'object': object, 'tuple': tuple, 'list': list, 'dict': dict, 'set': set, 'frozenset': frozenset,
    'int': int, 'float': float, 'bool': bool, 'str': str, 'bytes': bytes, 'unicode': str, 'long': int,
}

_OLD_PACKAGES = ('av.experimental.deepdrive.dataset_toolkit', 'av.ml.dataset_toolkit')


def _resolve(module: str, name: str) -> Any:
    """The allow-list: what each permitted global resolves to. Returns None when refused."""
    moved_from = next((old for old in _OLD_PACKAGES if module == old or module.startswith(old + '.')), None)
    if moved_from is not None:
        logger.warning('Depickling "%s.%s" which has moved to "petastorm%s". Regenerate metadata.',
                       module, name, module[len(moved_from):])
        module = 'petastorm' + module[len(moved_from):]
    numpy_core = {'scalar': _numpy_scalar, '_reconstruct': _ndarray_reconstruct}
    copy_registry = {'_reconstructor': _reconstructor}
    allowed: dict[str, dict[str, Any]] = {
        'petastorm.unischema': _STAND_INS, 'petastorm.codecs': _STAND_INS,
        'petastorm.etl.rowgroup_indexers': _INDEXERS,
        'pyspark.sql.types': _SPARK_TYPES,
        'pyspark.serializers': {'_restore': _restore_namedtuple},
        'numpy': _NUMPY_TYPES, 'numpy.core.multiarray': numpy_core, 'numpy._core.multiarray': numpy_core,
        'builtins': _BUILTINS, '__builtin__': _BUILTINS,
        'collections': {'OrderedDict': collections.OrderedDict, 'defaultdict': collections.defaultdict},
        'copy_reg': copy_registry, 'copyreg': copy_registry,
        'decimal': {'Decimal': decimal.Decimal},
        '_codecs': {'encode': _codecs_encode},
    }
    return allowed.get(module, {}).get(name)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        resolved = _resolve(module, name)
        if resolved is None:
            raise LegacyPickleRefusedError(f"global '{module}.{name}' is forbidden")
        return resolved


def restricted_loads(data: bytes, where: str = 'legacy metadata') -> Any:
    """Unpickle ``data`` with the allow-list; Petastorm classes come back as inert stand-ins.

    Raises:
        LegacyPickleRefusedError: a global outside the allow-list was referenced (nothing was executed).
        PetastormMetadataError: the bytes are not a readable pickle.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data), encoding='latin1').load()
    except LegacyPickleRefusedError as err:
        raise LegacyPickleRefusedError(f'{where}: refused to unpickle: {err}. Only Petastorm schema and index '
                                       f'classes, numpy types and plain containers are allowed.') from None
    except Exception as err:  # a corrupt pickle can raise almost anything
        raise PetastormMetadataError(f'{where}: the legacy pickled value cannot be read: '
                                     f'{type(err).__name__}: {err}') from err


def _convert_codec(codec: Any, where: str) -> Any:
    if codec is None:
        return None
    if not isinstance(codec, _LegacyCodec):
        raise PetastormMetadataError(f'{where}: unexpected codec object {codec!r}')
    if codec.kind == 'NdarrayCodec':
        return NdarrayCodec()
    if codec.kind == 'CompressedNdarrayCodec':
        return CompressedNdarrayCodec()
    if codec.kind == 'CompressedImageCodec':
        return CompressedImageCodec(getattr(codec, '_image_codec', '.png'), getattr(codec, '_quality', 80))
    if codec.kind == 'ScalarCodec':
        spark_type = getattr(codec, '_spark_type', None)
        if not isinstance(spark_type, _LegacySparkType):
            raise PetastormMetadataError(f'{where}: ScalarCodec without a Spark type ({spark_type!r})')
        return ScalarCodec(arrow_type_from_spark(spark_type))
    raise PetastormMetadataError(f'{where}: unsupported legacy codec {codec.kind}')


def _convert_field(field: Any, where: str) -> UnischemaField:
    if not isinstance(field, tuple) or len(field) not in (4, 5):
        raise PetastormMetadataError(f'{where}: unexpected field object {field!r}')
    name, dtype, shape, codec = field[:4]
    nullable = bool(field[4]) if len(field) == 5 else False
    here = f'{where}, field {name!r}'
    return UnischemaField(str(name), dtype, tuple(shape), _convert_codec(codec, here), nullable)


def unischema_from_legacy_pickle(data: bytes, where: str = 'legacy metadata') -> Unischema:
    """Read a Unischema pickled by Petastorm (any release, protocol 0 to 5) through the allow-list.

    Raises:
        LegacyPickleRefusedError: the pickle references anything outside the allow-list.
        PetastormMetadataError: the pickle does not hold a Petastorm Unischema.
    """
    obj = restricted_loads(data, where)
    pickled_fields = getattr(obj, '_fields', None)
    if not isinstance(obj, _LegacyUnischema) or not isinstance(pickled_fields, dict):
        raise PetastormMetadataError(f'{where}: the legacy pickle does not hold a Petastorm Unischema '
                                     f'(got {type(obj).__name__})')
    fields = [_convert_field(f, where) for f in pickled_fields.values()]
    return Unischema(str(getattr(obj, '_name', 'schema')), fields)


def legacy_indexes_from_pickle(data: bytes, where: str = 'legacy index metadata') -> dict[str, Any]:
    """Read Petastorm's pickled row-group indexes: ``{index_name: {'kind', 'column', 'data'}}``.

    ``data`` is ``{value: set(piece indexes)}`` for a ``SingleFieldIndexer`` and ``set(piece indexes)`` for a
    ``FieldNotNullIndexer``; numpy scalar values are turned into plain Python values.
    """
    obj = restricted_loads(data, where)
    if not isinstance(obj, dict):
        raise PetastormMetadataError(f'{where}: expected a dict of indexers, got {type(obj).__name__}')
    result = {}
    for name, indexer in obj.items():
        if not isinstance(indexer, _LegacyIndexer):
            raise PetastormMetadataError(f'{where}: index {name!r} is not a Petastorm indexer ({indexer!r})')
        raw = getattr(indexer, '_index_data', None)
        if isinstance(raw, dict):
            data_out: Any = {(v.item() if isinstance(v, np.generic) else v): sorted(int(i) for i in pieces)
                             for v, pieces in raw.items()}
        else:
            data_out = sorted(int(i) for i in (raw or ()))
        result[str(name)] = {'kind': indexer.kind, 'column': getattr(indexer, '_column_name', None),
                             'data': data_out}
    return result
