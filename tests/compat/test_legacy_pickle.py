"""The guarded reader of schemas that Petastorm pickled into dataset metadata.

The pickles are produced here, without Petastorm installed: throwaway classes carry the module and class name
that the original classes had, and a pickler subclass writes those names as the pickle's globals.
"""

from __future__ import annotations

import collections
import decimal
import io
import logging
import pickle
import shlex

import numpy as np
import pyarrow as pa
import pytest

from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import PetastormMetadataError
from petastorm.metadata.legacy import LegacyPickleRefusedError, unischema_from_legacy_pickle

PROTOCOLS = [0, 2, 4]


class _GlobalNamingPickler(pickle._Pickler):
    """Writes the global ``_legacy_global`` of a throwaway class instead of the class's real location."""

    def save_global(self, obj, name=None):
        target = obj.__dict__.get('_legacy_global') if isinstance(obj, type) else None
        if target is None:
            return super().save_global(obj, name)
        module, qualname = target
        if self.proto >= 4:
            self.save(module)
            self.save(qualname)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f'{module}\n{qualname}\n'.encode())
        self.memoize(obj)
        return None


def _dumps(obj, protocol: int) -> bytes:
    buffer = io.BytesIO()
    _GlobalNamingPickler(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()


def _global(module: str, name: str, bases: tuple = (object,), **attrs) -> type:
    """A class that pickles as the global ``module.name``."""
    return type(name, bases, {'_legacy_global': (module, name), **attrs})


def _field_class(module: str = 'petastorm.unischema') -> type:
    # Like the original namedtuple: pickled with its items as constructor arguments.
    return _global(module, 'UnischemaField', (tuple,), __slots__=(), __getnewargs__=lambda self: tuple(self))


def _make_object(cls: type, **state):
    obj = cls()
    obj.__dict__.update(state)
    return obj


def _spark(name: str, **state):
    return _make_object(_global('pyspark.sql.types', name), **state)


def _codec(name: str, module: str = 'petastorm.codecs', **state):
    return _make_object(_global(module, name), **state)


def _legacy_schema(name: str, fields: list[tuple], package: str = 'petastorm'):
    field_cls = _field_class(f'{package}.unischema')
    field_objects = [field_cls(f) for f in fields]
    schema = _make_object(_global(f'{package}.unischema', 'Unischema'), _name=name,
                          _fields=collections.OrderedDict((f[0], f) for f in field_objects))
    for f in field_objects:  # the original stored one attribute per field as well
        schema.__dict__[f[0]] = f
    return schema


def _all_kinds_schema(package: str = 'petastorm', codec_module: str = 'petastorm.codecs'):
    return _legacy_schema('LegacySchema', [
        ('id', np.int64, (), _codec('ScalarCodec', codec_module, _spark_type=_spark('LongType')), False),
        ('small', np.int16, (), _codec('ScalarCodec', codec_module, _spark_type=_spark('ShortType')), False),
        ('label', np.str_, (), _codec('ScalarCodec', codec_module, _spark_type=_spark('StringType')), True),
        ('price', decimal.Decimal, (), _codec('ScalarCodec', codec_module, _spark_type=_spark(
            'DecimalType', precision=10, scale=9, hasPrecisionInfo=True)), False),
        ('image', np.uint8, (8, 6, 3), _codec('CompressedImageCodec', codec_module, _image_codec='.png',
                                              _quality=80), False),
        ('photo', np.uint8, (None, None, 3), _codec('CompressedImageCodec', codec_module,
                                                    _image_codec='.jpeg', _quality=65), True),
        ('matrix', np.float32, (None, 4), _codec('NdarrayCodec', codec_module), False),
        ('packed', np.int32, (3, 3), _codec('CompressedNdarrayCodec', codec_module), True),
        ('raw', np.uint16, (), None, False),
        ('flag', np.bool_, (), None, False),
    ], package=package)


def _check_all_kinds(schema):
    assert schema._name == 'LegacySchema'
    assert list(schema.fields) == ['id', 'small', 'label', 'price', 'image', 'photo', 'matrix', 'packed', 'raw',
                                   'flag']
    f = schema.fields
    assert [f[n].numpy_dtype for n in f] == [np.int64, np.int16, np.str_, decimal.Decimal, np.uint8, np.uint8,
                                             np.float32, np.int32, np.uint16, np.bool_]
    assert f['id'].codec == ScalarCodec(pa.int64())
    assert f['small'].codec == ScalarCodec(pa.int16())
    assert f['label'].codec == ScalarCodec(pa.string())
    assert f['price'].codec == ScalarCodec(pa.decimal128(10, 9))
    assert f['price'].codec.arrow_type() == pa.decimal128(10, 9)
    assert f['image'].codec == CompressedImageCodec('png', 80)
    assert f['photo'].codec.image_codec == 'jpeg'
    assert f['photo'].codec.quality == 65
    assert f['matrix'].codec == NdarrayCodec()
    assert f['packed'].codec == CompressedNdarrayCodec()
    assert f['raw'].codec is None
    assert [f[n].shape for n in f] == [(), (), (), (), (8, 6, 3), (None, None, 3), (None, 4), (3, 3), (), ()]
    assert [f[n].nullable for n in f] == [False, False, True, False, False, True, False, True, False, False]
    assert schema.image is f['image']  # a real Unischema with attribute access


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_converts_every_field_kind(protocol):
    data = _dumps(_all_kinds_schema(), protocol)
    assert b'petastorm.unischema' in data
    assert b'pyspark.sql.types' in data
    _check_all_kinds(unischema_from_legacy_pickle(data, 'test metadata'))


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_numpy_aliases_removed_in_numpy_2(protocol):
    schema = _legacy_schema('Old', [
        ('text', _global('numpy', 'unicode_'), (), None, False),
        ('blob', _global('numpy', 'string_'), (None,), None, False),
        ('real', _global('numpy', 'float_'), (), None, False),
    ])
    restored = unischema_from_legacy_pickle(_dumps(schema, protocol))
    assert restored.fields['text'].numpy_dtype is np.str_
    assert restored.fields['blob'].numpy_dtype is np.bytes_
    assert restored.fields['real'].numpy_dtype is np.float64
    assert restored.fields['blob'].shape == (None,)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_four_item_fields_of_old_releases_are_not_nullable(protocol):
    schema = _legacy_schema('Old', [('x', np.int32, (2,), _codec('NdarrayCodec'))])
    restored = unischema_from_legacy_pickle(_dumps(schema, protocol))
    assert restored.fields['x'].nullable is False
    assert restored.fields['x'].codec == NdarrayCodec()


class _Call:
    """Pickles as a call ``func(*args)`` (a REDUCE); callable so that it can itself be a pickled callable."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __call__(self, *args):  # never called: only pickled
        raise AssertionError('not to be called')

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_namedtuple_fields_restored_through_pyspark(protocol):
    # Petastorm 0.4-0.7 fields were namedtuples rebuilt by pyspark.serializers._restore(name, fields, values).
    restore = _global('pyspark.serializers', '_restore')
    field = _Call(restore, 'UnischemaField', ('name', 'numpy_dtype', 'shape', 'codec', 'nullable'),
                  ('id', np.int32, (), _codec('ScalarCodec', _spark_type=_spark('IntegerType')), True))
    schema = _make_object(_global('petastorm.unischema', 'Unischema'), _name='Old',
                          _fields=collections.OrderedDict(id=field))
    restored = unischema_from_legacy_pickle(_dumps(schema, protocol))
    assert restored.fields['id'].numpy_dtype is np.int32
    assert restored.fields['id'].codec == ScalarCodec(pa.int32())
    assert restored.fields['id'].nullable is True


def test_namedtuple_restore_of_other_names_is_refused():
    restore = _global('pyspark.serializers', '_restore')
    data = _dumps(_Call(restore, 'Popen', ('args',), ('ls',)), 2)
    with pytest.raises(LegacyPickleRefusedError, match='Popen'):
        unischema_from_legacy_pickle(data)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_old_package_path_logs_has_moved(protocol, caplog):
    schema = _all_kinds_schema(package='av.ml.dataset_toolkit', codec_module='av.ml.dataset_toolkit.codecs')
    data = _dumps(schema, protocol)
    assert b'av.ml.dataset_toolkit.unischema' in data
    with caplog.at_level(logging.WARNING, logger='petastorm.metadata.legacy'):
        restored = unischema_from_legacy_pickle(data)
    _check_all_kinds(restored)
    moved = [r.getMessage() for r in caplog.records if 'has moved' in r.getMessage()]
    assert any('av.ml.dataset_toolkit.unischema' in m and 'petastorm.unischema' in m for m in moved)
    assert any('av.ml.dataset_toolkit.codecs' in m for m in moved)


def test_current_package_path_logs_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger='petastorm.metadata.legacy'):
        unischema_from_legacy_pickle(_dumps(_all_kinds_schema(), 4))
    assert not [r for r in caplog.records if 'has moved' in r.getMessage()]


# --- hostile pickles ----------------------------------------------------------------------------------------------

def _payloads(marker) -> dict[str, object]:
    """Pickles that would create ``marker`` if they were unpickled by the standard unpickler."""
    path = str(marker)
    shell = f'touch {shlex.quote(path)}'
    import_os = _Call(_global('builtins', '__import__'), 'os')
    return {
        'os.system': _Call(_global('os', 'system'), shell),
        'posix.system': _Call(_global('posix', 'system'), shell),
        'builtins.eval': _Call(_global('builtins', 'eval'), f'open({path!r}, "w").close()'),
        'subprocess.Popen': _Call(_global('subprocess', 'Popen'), ['touch', path]),
        'builtins.getattr': _Call(_Call(_global('builtins', 'getattr'), import_os, 'system'), shell),
    }


@pytest.mark.parametrize('protocol', PROTOCOLS)
@pytest.mark.parametrize('name', ['os.system', 'posix.system', 'builtins.eval', 'subprocess.Popen',
                                  'builtins.getattr'])
def test_hostile_pickles_are_refused_before_anything_runs(tmp_path, name, protocol):
    marker = tmp_path / 'pwned'
    payload = _payloads(marker)[name]
    # Hidden inside an otherwise legitimate schema, as a field's codec.
    schema = _legacy_schema('Evil', [('id', np.int32, (), payload, False)])
    for data in (_dumps(payload, protocol), _dumps(schema, protocol)):
        with pytest.raises(LegacyPickleRefusedError) as info:
            unischema_from_legacy_pickle(data, 'evil/_common_metadata')
        assert f"'{name}'" in str(info.value)
        assert 'evil/_common_metadata' in str(info.value)
        assert isinstance(info.value, PetastormMetadataError)
        assert isinstance(info.value, pickle.UnpicklingError)
        assert not marker.exists()


@pytest.mark.parametrize('name', ['os.system', 'posix.system', 'builtins.eval', 'subprocess.Popen',
                                  'builtins.getattr'])
def test_hostile_payloads_are_armed(tmp_path, name):
    # The standard unpickler does run them: the refusal above is what keeps the marker from appearing.
    marker = tmp_path / 'pwned'
    result = pickle.loads(_dumps(_payloads(marker)[name], 2))
    if hasattr(result, 'wait'):
        result.wait(timeout=10)
    assert marker.exists()


def test_reconstructor_of_a_forbidden_class_is_refused():
    # copy_reg._reconstructor is allowed, but only to rebuild the inert stand-ins.
    data = _dumps(_Call(_global('copy_reg', '_reconstructor'), collections.OrderedDict, object, None), 0)
    with pytest.raises(LegacyPickleRefusedError, match='_reconstructor'):
        unischema_from_legacy_pickle(data)


@pytest.mark.parametrize('data', [b'', b'garbage bytes, not a pickle', b'\x80\x04\x95', bytes(range(256))])
def test_garbage_is_a_metadata_error(data):
    with pytest.raises(PetastormMetadataError, match='somewhere'):
        unischema_from_legacy_pickle(data, 'somewhere')


@pytest.mark.parametrize('obj', [{'a': 1}, [1, 2], 'text', None])
def test_a_pickle_without_a_unischema_is_a_metadata_error(obj):
    with pytest.raises(PetastormMetadataError, match='does not hold a Petastorm Unischema'):
        unischema_from_legacy_pickle(pickle.dumps(obj, protocol=2))


def test_unknown_petastorm_class_is_refused():
    data = _dumps(_make_object(_global('petastorm.codecs', 'MyOwnCodec')), 4)
    with pytest.raises(LegacyPickleRefusedError, match='petastorm.codecs.MyOwnCodec'):
        unischema_from_legacy_pickle(data)
