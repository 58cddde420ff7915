"""The local disk cache on its own: a miss fills once and later gets hit, tables come back equal (read-only, or
writable without changing the entry), values other than tables round-trip through the disk or are refused naming
where, and damaged or crafted entries are read again without running anything."""

import collections
import decimal
import enum
import io
import json
import logging
import math
import pickle

import numpy as np
import pyarrow as pa
import pytest

from petastorm.cache import CacheBase, NullCache, make_cache
from petastorm.cache._values import MAGIC
from petastorm.local_disk_cache import LocalDiskCache, UncacheableValueError
from support.cache_stores import LIMIT, small_table


def test_null_cache_always_fills_and_cache_base_is_abstract():
    fills = []
    cache = NullCache()
    assert cache.get('k', lambda: fills.append(1) or 'v') == 'v'
    assert cache.get('k', lambda: fills.append(1) or 'v') == 'v'
    assert len(fills) == 2
    cache.cleanup()
    with pytest.raises(TypeError):
        CacheBase()
    assert isinstance(make_cache('null', None, None, None), NullCache)
    assert isinstance(make_cache(None, None, None, None), NullCache)
    with pytest.raises(ValueError, match='Unknown cache_type'):
        make_cache('memory', None, None, None)


def test_miss_fills_once_then_hits_from_an_arrow_ipc_file(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, 1000)
    fills = []

    def fill():
        fills.append(1)
        return small_table(1)

    first = cache.get('key', fill)
    second = cache.get('key', fill)
    assert len(fills) == 1
    assert second.equals(first)
    assert second.equals(small_table(1))
    entries = list((tmp_path / 'c' / 'entries').rglob('*.arrow'))
    assert len(entries) == 1
    assert entries[0].read_bytes()[:6] == b'ARROW1'  # the Arrow IPC file format, not a pickle
    assert cache.volume() == entries[0].stat().st_size
    assert cache.get('other key', lambda: small_table(2)).equals(small_table(2))
    assert len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) == 2


def _table_of_every_kind(rows=5):
    ints = pa.array(range(rows), type=pa.int32())
    return pa.table({
        'int': ints,
        'float with nulls': pa.array([None if i == 2 else i / 3 for i in range(rows)]),
        'bool': pa.array([i % 2 == 0 for i in range(rows)]),
        'string': pa.array([f'row {i}' * i for i in range(rows)]),
        'binary': pa.array([bytes([i]) * i for i in range(rows)], type=pa.large_binary()),
        'decimal': pa.array([decimal.Decimal(i) / 8 for i in range(rows)], type=pa.decimal128(6, 3)),
        'timestamp': pa.array(np.arange(rows).astype('datetime64[ms]')),
        'list': pa.array([list(range(i)) for i in range(rows)]),
        'fixed list': pa.FixedSizeListArray.from_arrays(pa.array(np.arange(rows * 2, dtype=np.float32)), 2),
        'struct': pa.StructArray.from_arrays([ints, pa.array([str(i) for i in range(rows)])], names=['a', 'b']),
        'tensor': pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.uint8(), (2, 2)),
                                                 pa.FixedSizeListArray.from_arrays(
                                                     pa.array(np.arange(rows * 4, dtype=np.uint8)), 4)),
        'dictionary': pa.array(['a', 'b', 'a', 'c', 'b'][:rows]).dictionary_encode(),
    })


def test_tables_come_back_equal_and_read_only_by_default(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    table = _table_of_every_kind()
    cache.get('key', lambda: table)
    hit = cache.get('key', lambda: pytest.fail('should hit'))
    assert hit.equals(table)
    assert hit.schema == table.schema
    assert not np.frombuffer(hit.column('int').chunk(0).buffers()[1], dtype=np.int32).flags.writeable


def test_writable_tables_come_back_equal_and_writable_without_changing_the_entry(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None, writable_tables=True)
    table = _table_of_every_kind()
    cache.get('key', lambda: table)
    [entry] = (tmp_path / 'c' / 'entries').rglob('*.arrow')
    stored = entry.read_bytes()
    hit = cache.get('key', lambda: pytest.fail('should hit'))
    assert hit.equals(table)
    assert hit.schema == table.schema
    ints = np.frombuffer(hit.column('int').chunk(0).buffers()[1], dtype=np.int32)
    values = hit.column('tensor').chunk(0).storage.values
    pixels = np.frombuffer(values.buffers()[1], dtype=np.uint8)
    # Views of the entry's pages, writable as a decoded column without the cache: a write changes a private copy.
    assert ints.flags.writeable
    assert pixels.flags.writeable
    ints[:] = -1
    pixels[:] = 0
    assert entry.read_bytes() == stored
    assert cache.get('key', lambda: pytest.fail('should hit')).equals(table)


def test_cache_pickles_as_its_settings_and_works_in_the_copy(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, 1000, shards=3, eviction_policy='least-recently-stored',
                           writable_tables=True)
    cache.get('key', lambda: small_table(1))
    copy = pickle.loads(pickle.dumps(cache))
    assert repr(copy) == repr(cache)
    assert copy.get('key', lambda: pytest.fail('should hit')).equals(small_table(1))


class _Point(tuple):
    """A tuple subclass: it would come back as a plain tuple, so the cache refuses it."""


class _Colour(enum.IntEnum):
    RED = 1


STRUCTURED = np.zeros(3, dtype=[('x', '<i4'), ('y', '<f8', (2,))])
VALUES = {
    'int': 42,
    'big int': 2 ** 100,
    'negative zero': -0.0,
    'float': 1.5,
    'infinity': float('-inf'),
    'bool': True,
    'str': 'päivää \U0001f600',
    'bytes': b'\x00\xff' * 10,
    'decimal': decimal.Decimal('-12.50'),
    'numpy scalar': np.float32(2.5),
    'numpy datetime': np.datetime64('2020-01-02T03:04:05', 'ns'),
    'numpy string': np.str_('abc'),
    'uint8 record': np.random.default_rng(0).integers(0, 255, 5000, dtype=np.uint8),
    'fortran matrix': np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    'strided view': np.arange(20, dtype=np.int16)[::3],
    'empty array': np.empty((0, 3), dtype=np.float32),
    'structured array': STRUCTURED,
    'object array of str': np.array(['a', 'bc', None], dtype=object),
    'rows': [{'id': np.int64(i), 'name': f'r{i}', 'vec': np.full(2, i, np.float32)} for i in range(3)],
    'tuple keys and nesting': {(1, 'a'): [(), [], {}], 2: (None, b'', decimal.Decimal('1e-3'))},
}


def _same(left, right):
    """Equal values of the same types, all the way down (arrays by dtype, shape and content)."""
    assert type(left) is type(right), (left, right)
    if isinstance(left, np.ndarray):
        assert left.dtype == right.dtype
        assert left.shape == right.shape
        if left.dtype == object:
            for a, b in zip(left.flat, right.flat, strict=True):
                _same(a, b)
        else:
            np.testing.assert_array_equal(left, right)
    elif isinstance(left, dict):
        assert list(left) == list(right)
        for key in left:
            _same(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            _same(a, b)
    elif isinstance(left, float):
        assert left == right
        assert math.copysign(1, left) == math.copysign(1, right)
    elif isinstance(left, np.generic):
        assert left.dtype == right.dtype
        assert left == right
    else:
        assert left == right


@pytest.mark.parametrize('name', list(VALUES))
def test_values_other_than_tables_round_trip_through_the_disk(tmp_path, name):
    value = VALUES[name]
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    assert cache.get('key', lambda: value) is value  # a miss returns what the fill made
    fresh = LocalDiskCache(tmp_path / 'c', LIMIT, None)  # another reader of the directory, nothing in memory
    _same(fresh.get('key', lambda: pytest.fail('should be read from the disk')), value)
    [entry] = (tmp_path / 'c' / 'entries').rglob('*.value')
    assert entry.read_bytes().startswith(MAGIC)
    assert not list((tmp_path / 'c' / 'entries').rglob('*.arrow'))


def test_nan_and_a_shared_sub_value_round_trip(tmp_path):
    shared = [1, 2]
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    cache.get('nan', lambda: {'x': float('nan'), 'a': shared, 'b': shared})
    value = LocalDiskCache(tmp_path / 'c', LIMIT, None).get('nan', lambda: pytest.fail('should hit'))
    assert math.isnan(value['x'])
    assert value['a'] == value['b'] == [1, 2]  # the same list twice is not a cycle


def test_none_is_returned_but_not_stored_as_in_petastorm(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    fills = []
    assert cache.get('k', lambda: fills.append(1)) is None
    assert cache.get('k', lambda: fills.append(1)) is None
    assert len(fills) == 2
    assert cache.volume() == 0
    assert not list((tmp_path / 'c' / 'locks').iterdir())  # nothing stored, no lock file left for the key


def _cycle():
    items = [1]
    items.append(items)
    return items


@pytest.mark.parametrize(('value', 'where', 'kind'), [
    ({1, 2}, 'the value', 'builtins.set'),
    (frozenset(), 'the value', 'builtins.frozenset'),
    (object(), 'the value', 'builtins.object'),
    (bytearray(b'x'), 'the value', 'builtins.bytearray'),
    (_Point((1, 2)), 'the value', '_Point'),
    (_Colour.RED, 'the value', '_Colour'),
    (collections.OrderedDict(a=1), 'the value', 'collections.OrderedDict'),
    (np.ma.masked_array([1, 2], mask=[0, 1]), 'the value', 'MaskedArray'),  # numpy.ma(.core) by version
    (np.zeros(2, dtype=[('o', object)]), 'the value', 'numpy.ndarray of dtype'),
    ({'rows': [1, {'bad': lambda: 0}]}, "the value['rows'][1]['bad']", 'builtins.function'),
    ({pa.scalar(1): 1}, 'a key of the value', 'pyarrow.'),
    (np.array([{1}], dtype=object), 'the value.flat[0]', 'builtins.set'),
    (pa.RecordBatch.from_pydict({'a': [1]}), 'the value', 'pyarrow.lib.RecordBatch'),
])
def test_values_without_a_safe_encoding_are_refused_naming_where(tmp_path, value, where, kind):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    with pytest.raises(TypeError, match='cannot store') as raised:
        cache.get('the key', lambda: value)
    message = str(raised.value)
    assert isinstance(raised.value, UncacheableValueError)
    assert f'cannot store {where}' in message
    assert kind in message
    assert "'the key'" in message
    assert 'pyarrow Tables' in message  # what it does store
    assert cache.volume() == 0
    assert not list((tmp_path / 'c' / 'tmp').iterdir())


def test_a_cyclic_value_is_refused(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    with pytest.raises(TypeError, match='contains itself'):
        cache.get('k', _cycle)


def _write_entry(path, header, blobs=()):
    data = json.dumps(header).encode()
    path.write_bytes(MAGIC + len(data).to_bytes(8, 'little') + data + b''.join(blobs))


def _object_npy_that_would_run_code(marker):
    """A .npy file of dtype object whose pickle payload creates ``marker`` when unpickled."""
    class Trap:
        def __reduce__(self):
            return (open, (str(marker), 'w'))

    buffer = io.BytesIO()
    np.save(buffer, np.array([Trap()], dtype=object), allow_pickle=True)
    return buffer.getvalue()


@pytest.mark.parametrize('damage', ['unknown tag', 'object npy', 'truncated', 'bad blob index', 'bad decimal',
                                    'not json', 'wrong magic'])
def test_damaged_or_crafted_value_entries_are_read_again_and_run_nothing(tmp_path, damage, caplog):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    cache.get('key', lambda: {'a': np.arange(3)})
    [entry] = (tmp_path / 'c' / 'entries').rglob('*.value')
    marker = tmp_path / 'code_ran'
    if damage == 'unknown tag':
        _write_entry(entry, {'value': {'pickle': 0}, 'blobs': []})
    elif damage == 'object npy':
        blob = _object_npy_that_would_run_code(marker)
        _write_entry(entry, {'value': {'ndarray': 0}, 'blobs': [len(blob)]}, [blob])
    elif damage == 'truncated':
        entry.write_bytes(entry.read_bytes()[:-20])
    elif damage == 'bad blob index':
        _write_entry(entry, {'value': {'bytes': 3}, 'blobs': []})
    elif damage == 'bad decimal':
        _write_entry(entry, {'value': {'decimal': 'twelve'}, 'blobs': []})
    elif damage == 'not json':
        entry.write_bytes(MAGIC + (5).to_bytes(8, 'little') + b'{{{{{')
    else:
        entry.write_bytes(b'\x80\x04K*.')  # a pickle of 42
    with caplog.at_level(logging.WARNING, logger='petastorm.cache'):
        assert cache.get('key', lambda: 'again') == 'again'
    assert 'unreadable local disk cache entry' in caplog.text
    assert not marker.exists()
    assert cache.get('key', lambda: pytest.fail('should hit')) == 'again'


def test_an_unreadable_entry_is_read_again(tmp_path, caplog):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    cache.get('key', lambda: small_table(1))
    [entry] = (tmp_path / 'c' / 'entries').rglob('*.arrow')
    entry.write_bytes(b'not arrow')
    with caplog.at_level(logging.WARNING, logger='petastorm.cache'):
        assert cache.get('key', lambda: small_table(2)).equals(small_table(2))
    assert 'unreadable local disk cache entry' in caplog.text
    assert cache.get('key', lambda: pytest.fail('should hit')).equals(small_table(2))
