"""The local disk cache's limits: its settings are checked when it is made, and the size limit holds under each
eviction policy (least recently used, least recently stored, none), for tables, arrays and a reader's entries."""

import logging
import time

import numpy as np
import pytest

from petastorm import make_reader
from petastorm.local_disk_cache import LocalDiskCache
from support.cache_stores import LIMIT, ROWS, disk_cache_args, reader_ids, small_table


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
    probe.get('k', lambda: small_table(0))
    entry_size = probe.volume()
    limit = entry_size * 8 + entry_size // 2  # room for 8 entries
    cache = LocalDiskCache(tmp_path / 'c', limit, None, shards=2)
    for i in range(8):
        cache.get(f'k{i}', lambda i=i: small_table(i))
        time.sleep(0.002)  # distinct modification times on coarse clocks
    assert cache.volume() == 8 * entry_size
    cache.get('k0', lambda: pytest.fail('k0 should be cached'))  # a hit makes k0 the most recently used
    time.sleep(0.002)
    for i in range(8, 12):
        cache.get(f'k{i}', lambda i=i: small_table(i))
        time.sleep(0.002)
    assert cache.volume() <= limit
    fills = []
    cache.get('k0', lambda: fills.append('k0') or small_table(0))
    cache.get('k1', lambda: fills.append('k1') or small_table(1))
    assert fills == ['k1']  # k1 was the least recently used; k0 survived thanks to its hit
    lock_files = list((tmp_path / 'c' / 'locks').iterdir())
    assert len(lock_files) <= len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) + 1


def test_least_recently_stored_ignores_hits(tmp_path):
    probe = LocalDiskCache(tmp_path / 'probe', LIMIT, None)
    probe.get('k', lambda: small_table(0))
    entry_size = probe.volume()
    cache = LocalDiskCache(tmp_path / 'c', entry_size * 4 + 10, None, eviction_policy='least-recently-stored')
    for i in range(4):
        cache.get(f'k{i}', lambda i=i: small_table(i))
        time.sleep(0.002)
    cache.get('k0', lambda: pytest.fail('k0 should be cached'))
    cache.get('k4', lambda: small_table(4))
    fills = []
    cache.get('k0', lambda: fills.append('k0') or small_table(0))
    assert fills == ['k0']


def test_policy_none_stores_until_full_and_never_evicts(tmp_path):
    probe = LocalDiskCache(tmp_path / 'probe', LIMIT, None)
    probe.get('k', lambda: small_table(0))
    entry_size = probe.volume()
    cache = LocalDiskCache(tmp_path / 'c', entry_size * 3 + 10, None, eviction_policy='none')
    for i in range(6):
        assert cache.get(f'k{i}', lambda i=i: small_table(i)).equals(small_table(i))
    assert cache.volume() == 3 * entry_size
    for i in range(3):
        cache.get(f'k{i}', lambda: pytest.fail('the first entries stay'))


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


def test_reader_eviction_keeps_the_size_limit(cache_dataset_url, tmp_path):
    limit = 6000
    args = disk_cache_args(tmp_path / 'c', cache_size_limit=limit, cache_row_size_estimate=None)
    ids = reader_ids(make_reader(cache_dataset_url, reader_pool_type='dummy', **args))
    assert sorted(ids) == list(range(ROWS))
    left = LocalDiskCache(tmp_path / 'c', limit, None).volume()
    assert 0 < left <= limit
