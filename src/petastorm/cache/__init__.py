"""Caches of what the reader reads: the key-value cache, the local disk cache, and the row-group caches on them.

A cache maps a key to a value computed on a miss by ``fill_cache_func`` (:class:`CacheBase`; :class:`NullCache`
caches nothing). :class:`LocalDiskCache` keeps values in a local directory that the processes of one node share,
bounded in size with least-recently-used eviction.

A reader with a cache reads each row group through a row-group cache, which keys the row group by the identity of
the file's content (dataset, path, size, modification time, row group, columns) and keeps:

* with ``cache_type='local-disk'`` (:class:`RowGroupCache`), the columns as stored in the file, so a later epoch
  skips the I/O;
* with ``cache_type='local-disk-decoded'`` (:class:`DecodedRowGroupCache`), the columns with their images and
  arrays decoded, so a later epoch skips the I/O and the decoding.

Either way the footers of a remote store's files are kept too (:class:`FooterCache`), so that a later reader
plans without asking the store for them.

Both hold whole row groups before any filtering, shuffling or transform, so every reader option works the same
with or without a cache.

Example::

    cache = make_cache('local-disk', '/tmp/petastorm-cache', 10 << 30, 1 << 20)
    table = cache.get('some key', lambda: expensive_read())
"""

from petastorm.cache._base import CacheBase, NullCache
from petastorm.cache._decoded import DecodedRowGroupCache, cached_decoded_values, decodes_in_cache
from petastorm.cache._disk_store import EVICTION_POLICIES
from petastorm.cache._factory import (
    CACHE_TYPES,
    LOCAL_DISK_CACHE,
    LOCAL_DISK_DECODED_CACHE,
    NULL_CACHE,
    CacheType,
    check_cache_arguments,
    make_cache,
    make_row_group_cache,
)
from petastorm.cache._footers import FooterCache
from petastorm.cache._local_disk import CacheLocationError, LocalDiskCache
from petastorm.cache._row_groups import FileStamp, RowGroupCache, file_stamps
from petastorm.cache._values import UncacheableValueError

__all__ = [
    'CACHE_TYPES',
    'EVICTION_POLICIES',
    'LOCAL_DISK_CACHE',
    'LOCAL_DISK_DECODED_CACHE',
    'NULL_CACHE',
    'CacheBase',
    'CacheLocationError',
    'CacheType',
    'DecodedRowGroupCache',
    'FileStamp',
    'FooterCache',
    'LocalDiskCache',
    'NullCache',
    'RowGroupCache',
    'UncacheableValueError',
    'cached_decoded_values',
    'check_cache_arguments',
    'decodes_in_cache',
    'file_stamps',
    'make_cache',
    'make_row_group_cache',
]
