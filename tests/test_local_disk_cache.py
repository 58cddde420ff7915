"""The local disk cache: hits and misses, values other than tables, stale files, eviction, cleanup, sharing between
processes, reader integration."""

import collections
import decimal
import enum
import io
import json
import logging
import math
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.cache import CacheBase, FileStamp, NullCache, RowGroupCache, make_cache
from petastorm.cache._values import MAGIC
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.local_disk_cache import CacheLocationError, LocalDiskCache, UncacheableValueError
from petastorm.ngram import NGram
from petastorm.predicates import in_lambda
from petastorm.test_util.latency_fs import SlowLocalHandler
from petastorm.unischema import Unischema, UnischemaField
from support.node_ranks import run_ranks_together

ROWS = 120
LIMIT = 100 << 20
POOLS = ['dummy', 'thread', 'process']
READERS = {'rows': make_reader, 'batches': make_batch_reader}
BENCH = Path(__file__).resolve().parent.parent / 'benchmarks' / 'cache_bench.py'
Schema = Unischema('CacheSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('vec', np.float32, (4,), NdarrayCodec(), False),
])
# make_batch_reader on a Petastorm dataset warns as Petastorm does.
pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')


def _row(i):
    return {'id': i, 'name': f'row{i}', 'vec': np.full(4, i, dtype=np.float32)}


def _write(path, rows=ROWS):
    url = 'file://' + str(path)
    write_dataset(url, Schema, (_row(i) for i in range(rows)), row_group_size_mb=0.001, file_size_mb=0.004)
    return url


def _row_group_count(url):
    root = Path(url[len('file://'):])
    return sum(pq.ParquetFile(p).num_row_groups for p in root.rglob('*.parquet'))


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    target = _write(tmp_path_factory.mktemp('cache') / 'ds')
    assert _row_group_count(target) >= 10, 'these tests need many row groups'
    return target


@pytest.fixture
def row_group_reads(monkeypatch):
    """Counts row-group reads from Parquet files in this process (dummy and thread pools)."""
    calls = []
    original = pq.ParquetFile.read_row_group

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, 'read_row_group', counting)
    return calls


def _cache_args(location, **extra):
    # Most tests read through one cache with several readers, so it must outlive each of them.
    return {'cache_type': 'local-disk', 'cache_location': str(location), 'cache_size_limit': LIMIT,
            'cache_row_size_estimate': 1000, 'cache_extra_settings': {'cleanup': False}, **extra}


def _ids(reader):
    with reader:
        if reader.batched_output:
            return [int(i) for batch in reader for i in batch.id]
        return [int(row.id) for row in reader]


def _table(value, size=200):
    return pa.table({'value': [value] * size, 'payload': [b'x' * 8] * size})


# -- the cache on its own ---------------------------------------------------------------------------------------


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
        return _table(1)

    first = cache.get('key', fill)
    second = cache.get('key', fill)
    assert len(fills) == 1
    assert second.equals(first)
    assert second.equals(_table(1))
    entries = list((tmp_path / 'c' / 'entries').rglob('*.arrow'))
    assert len(entries) == 1
    assert entries[0].read_bytes()[:6] == b'ARROW1'  # the Arrow IPC file format, not a pickle
    assert cache.volume() == entries[0].stat().st_size
    assert cache.get('other key', lambda: _table(2)).equals(_table(2))
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
    cache.get('key', lambda: _table(1))
    copy = pickle.loads(pickle.dumps(cache))
    assert repr(copy) == repr(cache)
    assert copy.get('key', lambda: pytest.fail('should hit')).equals(_table(1))


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
    (np.ma.masked_array([1, 2], mask=[0, 1]), 'the value', 'numpy.ma.MaskedArray'),
    (np.zeros(2, dtype=[('o', object)]), 'the value', 'numpy.ndarray of dtype'),
    ({'rows': [1, {'bad': lambda: 0}]}, "the value['rows'][1]['bad']", 'builtins.function'),
    ({pa.scalar(1): 1}, 'a key of the value', 'pyarrow.'),
    (np.array([{1}], dtype=object), 'the value.flat[0]', 'builtins.set'),
    (pa.record_batch({'a': [1]}), 'the value', 'pyarrow.lib.RecordBatch'),
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


def test_numpy_records_respect_the_size_limit_and_policy_none(tmp_path):
    record = np.random.default_rng(1).integers(0, 255, 50 << 10, dtype=np.uint8)
    cache = LocalDiskCache(tmp_path / 'lru', 1 << 20, len(record), shards=1)
    for i in range(60):
        cache.get(f'k{i}', lambda: record)
    assert 0 < cache.volume() <= 1 << 20
    full = LocalDiskCache(tmp_path / 'none', 300 << 10, len(record), shards=1, eviction_policy='none')
    for i in range(20):
        assert full.get(f'k{i}', lambda: record) is record
    assert full.volume() <= 300 << 10
    assert len(list((tmp_path / 'none' / 'entries').rglob('*.value'))) == 5  # the first five fit, never evicted
    full.get('k0', lambda: pytest.fail('k0 stays'))
    assert len(list((tmp_path / 'none' / 'locks').iterdir())) <= 5  # refused keys leave no lock file


def test_an_unreadable_entry_is_read_again(tmp_path, caplog):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    cache.get('key', lambda: _table(1))
    [entry] = (tmp_path / 'c' / 'entries').rglob('*.arrow')
    entry.write_bytes(b'not arrow')
    with caplog.at_level(logging.WARNING, logger='petastorm.cache'):
        assert cache.get('key', lambda: _table(2)).equals(_table(2))
    assert 'unreadable local disk cache entry' in caplog.text
    assert cache.get('key', lambda: pytest.fail('should hit')).equals(_table(2))


def test_constructor_validation(tmp_path, caplog):
    with pytest.raises(ValueError, match=r"^Condition 'size_limit_bytes / shards < 5 \* expected_row_size_bytes' "
                                         r'needs to hold'):
        LocalDiskCache(tmp_path / 'c', 6000, 1000, shards=6)
    LocalDiskCache(tmp_path / 'c', 6000, 1000, shards=6, eviction_policy='none')  # the condition is for eviction
    with pytest.raises(ValueError, match='size_limit_bytes'):
        LocalDiskCache(tmp_path / 'c', None, 1000)
    with pytest.raises(ValueError, match='expected_row_size_bytes'):
        LocalDiskCache(tmp_path / 'c', LIMIT, -1)
    with pytest.raises(ValueError, match='eviction_policy'):
        LocalDiskCache(tmp_path / 'c', LIMIT, 1000, eviction_policy='random')
    with pytest.raises(ValueError, match='cache_location'):
        LocalDiskCache(None, LIMIT, 1000)
    with caplog.at_level(logging.WARNING, logger='petastorm.cache'):
        LocalDiskCache(tmp_path / 'c', LIMIT, 1000, timeout=60)
    assert "ignores the settings ['timeout']" in caplog.text


def test_eviction_removes_least_recently_used_entries(tmp_path):
    probe = LocalDiskCache(tmp_path / 'probe', LIMIT, None)
    probe.get('k', lambda: _table(0))
    entry_size = probe.volume()
    limit = entry_size * 8 + entry_size // 2  # room for 8 entries
    cache = LocalDiskCache(tmp_path / 'c', limit, None, shards=2)
    for i in range(8):
        cache.get(f'k{i}', lambda i=i: _table(i))
        time.sleep(0.002)  # distinct modification times on coarse clocks
    assert cache.volume() == 8 * entry_size
    cache.get('k0', lambda: pytest.fail('k0 should be cached'))  # a hit makes k0 the most recently used
    time.sleep(0.002)
    for i in range(8, 12):
        cache.get(f'k{i}', lambda i=i: _table(i))
        time.sleep(0.002)
    assert cache.volume() <= limit
    fills = []
    cache.get('k0', lambda: fills.append('k0') or _table(0))
    cache.get('k1', lambda: fills.append('k1') or _table(1))
    assert fills == ['k1']  # k1 was the least recently used; k0 survived thanks to its hit
    lock_files = list((tmp_path / 'c' / 'locks').iterdir())
    assert len(lock_files) <= len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) + 1


def test_least_recently_stored_ignores_hits(tmp_path):
    probe = LocalDiskCache(tmp_path / 'probe', LIMIT, None)
    probe.get('k', lambda: _table(0))
    entry_size = probe.volume()
    cache = LocalDiskCache(tmp_path / 'c', entry_size * 4 + 10, None, eviction_policy='least-recently-stored')
    for i in range(4):
        cache.get(f'k{i}', lambda i=i: _table(i))
        time.sleep(0.002)
    cache.get('k0', lambda: pytest.fail('k0 should be cached'))
    cache.get('k4', lambda: _table(4))
    fills = []
    cache.get('k0', lambda: fills.append('k0') or _table(0))
    assert fills == ['k0']


def test_policy_none_stores_until_full_and_never_evicts(tmp_path):
    probe = LocalDiskCache(tmp_path / 'probe', LIMIT, None)
    probe.get('k', lambda: _table(0))
    entry_size = probe.volume()
    cache = LocalDiskCache(tmp_path / 'c', entry_size * 3 + 10, None, eviction_policy='none')
    for i in range(6):
        assert cache.get(f'k{i}', lambda i=i: _table(i)).equals(_table(i))
    assert cache.volume() == 3 * entry_size
    for i in range(3):
        cache.get(f'k{i}', lambda: pytest.fail('the first entries stay'))


def test_threads_filling_one_key_fill_it_once(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    fills = []

    def fill():
        fills.append(1)
        time.sleep(0.1)
        return _table(7)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get('key', fill))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fills) == 1
    assert len(results) == 4
    assert all(result.equals(_table(7)) for result in results)


def _fill_keys_in_process(cache_dir, counter_path, keys, go):
    cache = LocalDiskCache(cache_dir, LIMIT, None)
    go.wait(30)
    for key in keys:
        def fill(key=key):
            with open(counter_path, 'a') as counter:
                counter.write(key + '\n')
            time.sleep(0.02)
            return pa.table({'key': [key] * 10})

        table = cache.get(key, fill)
        if table.column('key')[0].as_py() != key:
            raise AssertionError(f'{key}: got {table.column("key")[0]}')


def test_processes_sharing_a_directory_fill_each_entry_once(tmp_path):
    counter = tmp_path / 'fills.txt'
    keys = [f'key{i}' for i in range(30)]
    context = mp.get_context('spawn')
    go = context.Event()
    orders = [keys, keys[::-1], keys[10:] + keys[:10]]
    processes = [context.Process(target=_fill_keys_in_process, args=(str(tmp_path / 'c'), str(counter), order, go))
                 for order in orders]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    filled = counter.read_text().split()
    assert sorted(filled) == sorted(keys)  # each key filled by exactly one process


# -- the cache in the reader ------------------------------------------------------------------------------------


def test_options_validation(url, tmp_path):
    with pytest.raises(ValueError, match='needs cache_location'):
        make_reader(url, cache_type='local-disk', cache_size_limit=LIMIT)
    with pytest.raises(ValueError, match='cache_size_limit must be a positive integer'):
        make_reader(url, cache_type='local-disk', cache_location=str(tmp_path))
    with pytest.raises(ValueError, match='cache_row_size_estimate'):
        make_reader(url, **_cache_args(tmp_path, cache_row_size_estimate=0))
    with pytest.raises(ValueError, match='cache_extra_settings must be a dict'):
        make_reader(url, **_cache_args(tmp_path, cache_extra_settings=['cleanup']))
    with pytest.raises(ValueError, match='Unknown cache_type'):
        make_reader(url, cache_type='memory')


def test_unwritable_location_fails_at_construction_naming_the_path(url, tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a directory')
    location = blocker / 'cache'
    with pytest.raises(CacheLocationError, match=f'{location}.*cannot be created or written to') as raised:
        make_reader(url, **_cache_args(location))
    assert isinstance(raised.value, OSError)


@pytest.mark.skipif(os.geteuid() == 0, reason='root may write to read-only directories')
def test_read_only_location_fails_at_construction(url, tmp_path):
    location = tmp_path / 'ro'
    location.mkdir()
    location.chmod(0o500)
    try:
        with pytest.raises(CacheLocationError, match=str(location)):
            make_batch_reader(url, **_cache_args(location))
    finally:
        location.chmod(0o700)


@pytest.mark.parametrize('reader_kind', list(READERS))
def test_second_reader_reads_nothing_from_the_files(url, tmp_path, row_group_reads, reader_kind):
    make = READERS[reader_kind]
    plain = _ids(make(url, reader_pool_type='dummy', shuffle_row_groups=False))
    row_group_reads.clear()
    first = _ids(make(url, reader_pool_type='dummy', shuffle_row_groups=False, **_cache_args(tmp_path / 'c')))
    assert len(row_group_reads) == _row_group_count(url)
    row_group_reads.clear()
    second = _ids(make(url, reader_pool_type='thread', workers_count=3, shuffle_row_groups=False,
                       **_cache_args(tmp_path / 'c')))
    assert row_group_reads == []
    assert first == second == plain
    assert sorted(plain) == list(range(ROWS))


def test_epochs_of_one_reader_hit_the_cache(url, tmp_path, row_group_reads):
    ids = _ids(make_reader(url, reader_pool_type='dummy', num_epochs=3, **_cache_args(tmp_path / 'c')))
    assert sorted(ids) == sorted(list(range(ROWS)) * 3)
    assert len(row_group_reads) == _row_group_count(url)


def test_a_rewritten_file_is_read_again(tmp_path, row_group_reads):
    url = _write(tmp_path / 'ds')
    args = _cache_args(tmp_path / 'c')
    assert sorted(_ids(make_reader(url, reader_pool_type='dummy', **args))) == list(range(ROWS))
    path = sorted((tmp_path / 'ds').rglob('*.parquet'))[0]
    parquet = pq.ParquetFile(path)
    changed = parquet.read_row_groups(range(parquet.num_row_groups))
    changed_ids = set(changed.column('id').to_pylist())
    rewritten_groups = parquet.num_row_groups
    stat = path.stat()
    with pq.ParquetWriter(str(path) + '.new', parquet.schema_arrow) as writer:
        for i in range(parquet.num_row_groups):
            group = parquet.read_row_group(i)
            ids = pc.add(group.column('id'), 1000)
            writer.write_table(group.set_column(group.schema.get_field_index('id'), group.schema.field('id'), ids))
    os.replace(str(path) + '.new', path)
    # Same size or not, a rewrite moves the modification time; make it visible on coarse-clock filesystems too.
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    row_group_reads.clear()
    ids = set(_ids(make_reader(url, reader_pool_type='dummy', **args)))
    assert ids == (set(range(ROWS)) - changed_ids) | {i + 1000 for i in changed_ids}
    assert len(row_group_reads) == rewritten_groups  # only the changed file was read again


def test_cache_with_a_worker_predicate(url, tmp_path, row_group_reads):
    predicate = in_lambda(['id'], lambda i: i % 3 == 0)
    plain = _ids(make_reader(url, reader_pool_type='dummy', predicate=predicate, shuffle_row_groups=False))
    args = _cache_args(tmp_path / 'c')
    cold = _ids(make_reader(url, reader_pool_type='dummy', predicate=predicate, shuffle_row_groups=False, **args))
    row_group_reads.clear()
    warm = _ids(make_reader(url, reader_pool_type='thread', predicate=predicate, shuffle_row_groups=False, **args))
    assert row_group_reads == []
    assert plain == cold == warm == [i for i in range(ROWS) if i % 3 == 0]
    batches = _ids(make_batch_reader(url, reader_pool_type='dummy', predicate=predicate, shuffle_row_groups=False,
                                     **args))
    assert batches == plain


@pytest.mark.parametrize('reader_kind', list(READERS))
def test_cache_with_drop_partitions(url, tmp_path, row_group_reads, reader_kind):
    make = READERS[reader_kind]
    options = {'shuffle_row_drop_partitions': 3, 'seed': 5, 'shuffle_rows': True}
    plain = _ids(make(url, reader_pool_type='dummy', **options))
    row_group_reads.clear()
    cold = _ids(make(url, reader_pool_type='dummy', **options, **_cache_args(tmp_path / 'c')))
    # Three work items per row group, one read: the cache holds whole row groups.
    assert len(row_group_reads) == _row_group_count(url)
    warm = _ids(make(url, reader_pool_type='thread', workers_count=3, **options, **_cache_args(tmp_path / 'c')))
    assert plain == cold == warm
    assert sorted(plain) == list(range(ROWS))


def test_cache_with_ngram_windows(url, tmp_path, row_group_reads):
    def windows(**extra):
        ngram = NGram({0: ['id', 'name'], 1: ['id']}, delta_threshold=1, timestamp_field='id')
        with make_reader(url, schema_fields=ngram, reader_pool_type='dummy', shuffle_row_groups=False,
                         **extra) as reader:
            return [(int(w[0].id), w[0].name, int(w[1].id)) for w in reader]

    plain = windows()
    assert windows(**_cache_args(tmp_path / 'c')) == plain
    row_group_reads.clear()
    assert windows(**_cache_args(tmp_path / 'c')) == plain
    assert row_group_reads == []
    assert plain


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('reader_kind', list(READERS))
def test_every_pool_kind_delivers_the_same_items_with_and_without_cache(url, tmp_path, pool, reader_kind):
    make = READERS[reader_kind]
    options = {'reader_pool_type': pool, 'workers_count': 2, 'seed': 11, 'shuffle_rows': True}

    def items(**extra):
        with make(url, **options, **extra) as reader:
            return [tuple(np.asarray(value).tolist() for value in item) for item in reader]

    plain = items()
    cold = items(**_cache_args(tmp_path / 'c'))
    warm = items(**_cache_args(tmp_path / 'c'))
    assert plain == cold == warm
    assert len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) == _row_group_count(url)


def test_reader_eviction_keeps_the_size_limit(url, tmp_path):
    limit = 6000
    ids = _ids(make_reader(url, reader_pool_type='dummy', **_cache_args(tmp_path / 'c', cache_size_limit=limit,
                                                                       cache_row_size_estimate=None)))
    assert sorted(ids) == list(range(ROWS))
    left = LocalDiskCache(tmp_path / 'c', limit, None).volume()
    assert 0 < left <= limit


def test_cleanup_is_the_default_and_removes_only_what_the_cache_made(tmp_path):
    alone = tmp_path / 'alone'
    cache = LocalDiskCache(alone, LIMIT, None)
    cache.get('table', lambda: _table(1))
    cache.get('value', lambda: 'text')
    cache.cleanup()
    assert not alone.exists()
    cache.cleanup()  # again: nothing left, no error
    # A cleaned-up cache only computes values: it reads and writes nothing, and makes no directory again.
    fills = []
    assert cache.get('value', lambda: fills.append(1) or 'computed') == 'computed'
    assert fills == [1]
    assert not alone.exists()

    shared = tmp_path / 'shared'
    shared.mkdir()
    (shared / 'user_file.txt').write_text('not ours')
    cache = LocalDiskCache(shared, LIMIT, None)
    cache.get('value', lambda: 1)
    cache.cleanup()
    assert sorted(p.name for p in shared.iterdir()) == ['user_file.txt']

    kept = LocalDiskCache(tmp_path / 'kept', LIMIT, None, cleanup=False)
    kept.get('value', lambda: 1)
    kept.cleanup()
    assert LocalDiskCache(tmp_path / 'kept', LIMIT, None).get('value', lambda: pytest.fail('kept')) == 1


def test_cleanup_errors_are_printed_in_petastorm_words(tmp_path, capsys, monkeypatch):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    cache.get('value', lambda: 1)

    def refuse(path, *args, **kwargs):
        raise PermissionError(f'cannot remove {path}')

    with monkeypatch.context() as patched:
        patched.setattr(shutil, 'rmtree', refuse)
        cache.cleanup()  # does not raise
    assert capsys.readouterr().out == f"Error during rmtree: cannot remove {tmp_path / 'c' / 'entries'}\n"
    assert (tmp_path / 'c').exists()

    cache = LocalDiskCache(tmp_path / 'd', LIMIT, None)
    monkeypatch.setattr(cache._cache, 'close', lambda: (_ for _ in ()).throw(OSError('still busy')))
    cache.cleanup()
    assert capsys.readouterr().out == 'Error closing cache: still busy\n'
    assert not (tmp_path / 'd').exists()  # removed all the same


def test_a_cache_whose_directory_another_process_removed_carries_on(tmp_path):
    mine = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    theirs = LocalDiskCache(tmp_path / 'c', LIMIT, None)  # another process's view of the same directory
    mine.get('old', lambda: _table(1))
    theirs.cleanup()
    assert not (tmp_path / 'c').exists()
    assert mine.get('new', lambda: _table(2)).equals(_table(2))  # stored: the layout is made again
    assert len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) == 1
    fills = []
    for _ in range(2):
        assert mine.get('old', lambda: fills.append(1) or _table(1)).equals(_table(1))
    assert fills == [1]  # filled again once, then a hit


@pytest.mark.parametrize('removed_at', ['entries/1', 'tmp/probe'])
def test_a_cache_made_while_another_process_cleans_up_makes_its_layout_again(tmp_path, monkeypatch, removed_at):
    # Another process's cleanup removes the tree between the creation of a directory and of what goes in it: the
    # creation in the removed parent fails as mkdir and open fail then.
    location = tmp_path / 'c'
    real_makedirs, real_open, removed = os.makedirs, open, []

    def racing(real):
        def call(path, *args, **kwargs):
            if not removed and str(path).startswith(str(location / removed_at)):
                removed.append(path)
                shutil.rmtree(location)
                raise FileNotFoundError(2, 'No such file or directory', str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, 'makedirs', racing(real_makedirs))
    monkeypatch.setattr('builtins.open', racing(real_open))
    cache = LocalDiskCache(location, LIMIT, None, cleanup=False)
    monkeypatch.undo()
    assert removed  # the race happened
    assert cache.get('k', lambda: _table(3)).equals(_table(3))
    assert len(list((location / 'entries').rglob('*.arrow'))) == 1


def test_a_reader_removes_its_cache_on_exit_by_default_and_quietly(url, tmp_path, capsys):
    location = tmp_path / 'c'
    args = {**_cache_args(location), 'cache_extra_settings': None}
    with make_reader(url, reader_pool_type='thread', workers_count=2, **args) as reader:
        assert isinstance(reader.cache, LocalDiskCache)
        assert sorted(int(row.id) for row in reader) == list(range(ROWS))
        assert list((location / 'entries').rglob('*.arrow'))
    assert not location.exists()
    assert capsys.readouterr().out == ''  # only an explicit cleanup_cache() prints
    _ids(make_batch_reader(url, reader_pool_type='dummy', **_cache_args(location)))  # cleanup=False
    assert list((location / 'entries').rglob('*.arrow'))


def _read_epochs_in_process(url, cache_dir, epochs, go):
    go.wait(30)
    with make_reader(url, reader_pool_type='thread', workers_count=2, num_epochs=epochs, cache_type='local-disk',
                     cache_location=cache_dir, cache_size_limit=LIMIT, cache_row_size_estimate=1000) as reader:
        rows = [(int(row.id), row.name, row.vec.tolist()) for row in reader]
    expected = sorted((i, f'row{i}', [float(i)] * 4) for i in range(ROWS)) * epochs
    if sorted(rows) != sorted(expected):
        raise AssertionError(f'wrong rows after {epochs} epochs: {len(rows)} rows')


def test_processes_that_clean_up_on_exit_do_not_break_the_others(url, tmp_path):
    # The default cleanup=True: the first process to finish removes the directory while the others still read.
    context = mp.get_context('spawn')
    go = context.Event()
    processes = [context.Process(target=_read_epochs_in_process, args=(url, str(tmp_path / 'c'), epochs, go))
                 for epochs in (1, 3, 6)]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert not (tmp_path / 'c').exists()  # the last one out removed it for good


def test_row_group_cache_keys_identify_the_file_content():
    cache = RowGroupCache(NullCache(), 'file:///ds', {'/ds/a.parquet': FileStamp(10, 1)})
    key = cache.key('/ds/a.parquet', 0, ['b', 'a'])
    assert key == cache.key('/ds/a.parquet', 0, ['a', 'b'])  # the column order does not matter
    assert key != cache.key('/ds/a.parquet', 1, ['a', 'b'])
    assert key != cache.key('/ds/a.parquet', 0, ['a'])
    changed = RowGroupCache(NullCache(), 'file:///ds', {'/ds/a.parquet': FileStamp(10, 2)})
    assert key != changed.key('/ds/a.parquet', 0, ['a', 'b'])
    other = RowGroupCache(NullCache(), 'file:///other', {'/ds/a.parquet': FileStamp(10, 1)})
    assert key != other.key('/ds/a.parquet', 0, ['a', 'b'])
    table = cache.read('/ds/a.parquet', 0, ['b', 'a'], lambda: pa.table({'a': [1], 'b': [2]}))
    assert table.column_names == ['b', 'a']


def _read_in_process(url, cache_dir, counter_path, seed, go):
    original = pq.ParquetFile.read_row_group

    def counting(self, *args, **kwargs):
        with open(counter_path, 'a') as counter:
            counter.write('read\n')
        time.sleep(0.02)
        return original(self, *args, **kwargs)

    pq.ParquetFile.read_row_group = counting
    go.wait(30)
    ids = _ids(make_reader(url, reader_pool_type='thread', workers_count=2, seed=seed, **_cache_args(cache_dir)))
    if sorted(ids) != list(range(ROWS)):
        raise AssertionError(f'wrong rows: {sorted(ids)}')


def test_ranks_of_one_node_read_each_row_group_once(url, tmp_path):
    counter = tmp_path / 'reads.txt'
    assert run_ranks_together(_read_in_process, url, tmp_path / 'c', counter) == [0, 0]
    assert len(counter.read_text().split()) == _row_group_count(url)


# -- a slow filesystem ------------------------------------------------------------------------------------------


def test_second_epoch_on_a_slow_filesystem_reads_at_local_speed(url, tmp_path):
    slow = pafs.PyFileSystem(SlowLocalHandler(0.05))

    def timed_epoch():
        with make_reader(url, filesystem=slow, reader_pool_type='thread', workers_count=2,
                         **_cache_args(tmp_path / 'c')) as reader:
            start = time.perf_counter()
            ids = [int(row.id) for row in reader]
            elapsed = time.perf_counter() - start
        assert sorted(ids) == list(range(ROWS))
        return elapsed

    cold = timed_epoch()
    warm = timed_epoch()
    assert cold >= 0.05 * _row_group_count(url) / 2  # sanity: the latency was paid once per row group
    assert warm < cold / 3, (cold, warm)


def test_cache_benchmark_runs(tmp_path):
    completed = subprocess.run([sys.executable, str(BENCH), '--quick', '--data', str(tmp_path)], capture_output=True,
                               text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr
    assert 'epoch 2 / epoch 1' in completed.stdout
