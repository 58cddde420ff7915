"""A size-limited cache in a local directory, shared safely by the processes of one node.

Entries: a ``pyarrow.Table`` (what the readers cache: the raw or the decoded columns of a row group) is one Arrow
IPC file, read back through a copy-on-write memory map (no copy; see :mod:`petastorm.cache._mapped`). Any other
value -- numbers, strings, bytes, ``decimal.Decimal``, NumPy arrays and scalars, and lists, tuples and dicts of
these -- is one file of the typed format of :mod:`petastorm.cache._values` (JSON for the structure, ``.npy`` for
arrays). A value of any other type is refused with a ``TypeError``.

What it trusts: the directory is on a local disk and written only by the user running the readers, like a build
cache. Nothing in it is ever unpickled or executed, so a damaged entry is only read again; but whoever can write
the directory can change the data the readers return, so do not point ``cache_location`` at a directory that
other users can write.

The directory layout::

    <path>/entries/<shard>/<sha256 of key>.arrow   a table (or .value: any other value), spread over ``shards``
    <path>/locks/<sha256 of key>.lock              one lock file per key (fills of a key are serialized)
    <path>/tmp/                                    entries being written (renamed into place when complete)
    <path>/state.lock, <path>/size                 the lock and ledger of the total entry size

Concurrency: a miss takes an exclusive ``flock`` on the key's lock file, checks again, fills and writes the
entry; a process that wants the same key meanwhile waits on the lock and then reads the finished file, so a
node downloads each row group once however many ranks read it. Readers of a present entry take no lock: an
entry appears by an atomic rename, so it is either absent or complete.

Eviction: the ``size`` ledger (updated under ``state.lock``) tracks the bytes stored. When a write takes it past
``size_limit_bytes``, the directory is scanned and the least recently used entries (by modification time, which
a hit refreshes) are removed until 90% of the limit remains. An entry whose key lock is held (being filled or
read right after a fill) is skipped, so eviction never waits for another process.

Cleanup: as in Petastorm, ``cleanup=True`` is the default, so a reader's ``with`` exit and
``Reader.cleanup_cache()`` remove the cache (what it created, then the directory if nothing else is left in it).
Readers that should share the cache -- one after another, or the ranks of one node -- pass
``cache_extra_settings={'cleanup': False}``. A process whose directory is removed by another one's cleanup makes
it again and carries on; after its own cleanup a cache only computes values, it neither reads nor writes entries.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Callable
from typing import Any

from petastorm._checks import check_positive_int
from petastorm.cache._base import CacheBase
from petastorm.cache._disk_store import EVICTION_POLICIES, DiskStore
from petastorm.errors import PetastormError

logger = logging.getLogger(__name__)


class CacheLocationError(PetastormError, OSError):
    """The cache directory cannot be created or written to (the message names the path)."""


def _local_path(path: Any) -> str:
    if isinstance(path, str) and path.startswith('file://'):
        path = path[len('file://'):]
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f'the local disk cache needs a directory path (cache_location), got {path!r}')
    return os.path.abspath(os.fspath(path))


#: Subdirectories the entries are spread over, unless ``shards`` says otherwise.
DEFAULT_SHARDS = 6


def _restore(path: str, size_limit_bytes: int, expected_row_size_bytes: int | None, shards: int, cleanup: bool,
             eviction_policy: str, writable_tables: bool = False) -> LocalDiskCache:
    return LocalDiskCache(path, size_limit_bytes, expected_row_size_bytes, shards=shards, cleanup=cleanup,
                          eviction_policy=eviction_policy, writable_tables=writable_tables)


class LocalDiskCache(CacheBase):
    """Caches values in a local directory (Arrow tables as memory-mapped IPC files), with LRU eviction by size.

    Args:
        path: the cache directory (created if needed); may be shared by several processes of one node.
        size_limit_bytes: the total size of the entries is kept under this (see the module doc).
        expected_row_size_bytes: the expected size of one entry; ``size_limit_bytes / shards`` must be at least
            5 times this, so the cache can hold enough entries to be useful. None skips the check.
        shards: number of subdirectories the entries are spread over.
        cleanup: when True (the default, as in Petastorm), :meth:`cleanup` (called by ``Reader.cleanup_cache`` and
            a reader's ``with`` exit) removes the cache directory; pass False to keep it for later readers.
        **settings: ``eviction_policy``: ``'least-recently-used'`` (default), ``'least-recently-stored'`` (hits
            do not refresh an entry) or ``'none'`` (never evict; store only while under the limit);
            ``writable_tables``: False (default) maps tables read back read-only; True maps them copy-on-write, so
            that their arrays are writable without a copy (the decoded-column cache asks for it; rebuilding the
            columns over that mapping costs Python work per column, which threads reading at once feel). Other
            names (settings of Petastorm's former diskcache backend) are ignored with a warning.

    Raises:
        ValueError: a bad argument.
        CacheLocationError: ``path`` cannot be created or written to.

    Example::

        cache = LocalDiskCache('/tmp/my-cache', 1 << 30, 1 << 20, cleanup=False)
        value = cache.get('answer', lambda: {'rows': 42, 'ids': np.arange(3)})  # computed once, then read back
    """

    def __init__(self, path: Any, size_limit_bytes: int | None, expected_row_size_bytes: int | None,
                 shards: int = DEFAULT_SHARDS, cleanup: bool = True, **settings: Any) -> None:
        self._path = _local_path(path)
        self._size_limit = check_positive_int('size_limit_bytes (cache_size_limit)', size_limit_bytes, unit='bytes')
        # The message of a bad shard count has always said "(bytes)" as the byte sizes do; users match the text.
        self._shards = check_positive_int('shards', shards, unit='bytes')
        policy = settings.pop('eviction_policy', 'least-recently-used')
        if policy not in EVICTION_POLICIES:
            raise ValueError(f'eviction_policy must be one of {EVICTION_POLICIES}, got {policy!r}')
        self._policy = policy
        self._writable_tables = bool(settings.pop('writable_tables', False))
        if settings:
            logger.warning('LocalDiskCache ignores the settings %s (they configured the former diskcache backend)',
                           sorted(settings))
        if expected_row_size_bytes is not None:
            expected_row_size_bytes = check_positive_int('expected_row_size_bytes (cache_row_size_estimate)',
                                                         expected_row_size_bytes, unit='bytes')
            if policy != 'none' and self._size_limit / self._shards < 5 * expected_row_size_bytes:
                raise ValueError(
                    f"Condition 'size_limit_bytes / shards < 5 * expected_row_size_bytes' needs to hold, but "
                    f'size_limit_bytes={self._size_limit}, shards={self._shards}, expected_row_size_bytes='
                    f'{expected_row_size_bytes}: the cache could hold too few entries. Increase cache_size_limit '
                    f'or decrease shards.')
        self._expected_row_size = expected_row_size_bytes
        self._cleanup = bool(cleanup)
        self._cache = DiskStore(self._path, self._shards, self._size_limit, self._policy, self._writable_tables)
        try:
            self._cache.prepare()
        except OSError as err:
            raise CacheLocationError(
                err.errno or errno.EACCES,
                f'the local disk cache directory {self._path!r} (cache_location) cannot be created or written to: '
                f'{err.strerror or err}. Pass a writable local directory as cache_location.') from err

    # -- public ---------------------------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The cache directory."""
        return self._path

    @property
    def size_limit_bytes(self) -> int:
        """The size limit of the entries, in bytes."""
        return self._size_limit

    def get(self, key: str, fill_cache_func: Callable[[], Any]) -> Any:
        """The value stored under ``key``; on a miss, ``fill_cache_func()`` is called once per node and stored.

        A ``None`` from ``fill_cache_func`` is returned but not stored (the next ``get`` calls it again), as in
        Petastorm. After :meth:`cleanup` removed the directory, every ``get`` calls ``fill_cache_func``.

        Raises:
            UncacheableValueError: (a ``TypeError``) ``fill_cache_func`` returned a value holding a type that has
                no safe encoding (see the module doc for the types stored).
        """
        store = self._cache
        if store.closed:
            return fill_cache_func()
        digest = hashlib.sha256(key.encode('utf-8')).hexdigest()
        value = store.load(digest)
        if value is not None:
            return value
        with store.key_lock(digest) as held:
            if held:
                # Another process may have filled the entry while this one waited for the lock.
                value = store.load(digest, remove_unreadable=True)
                if value is not None:
                    return value
            if not held:
                return fill_cache_func()
            stored = False
            try:
                value = fill_cache_func()
                stored = value is not None and store.store(digest, value, key)
            finally:
                if not stored:  # leave no lock file behind for a key that has no entry
                    store.drop_lock(digest)
        return value

    def volume(self) -> int:
        """Bytes held by the entries now (a directory scan)."""
        return self._cache.volume()

    def cleanup(self) -> None:
        """Remove the cache directory if the cache was created with ``cleanup=True`` (the default).

        Only what the cache created is removed (the directory itself only if nothing else is left in it); a
        directory that is already gone is no error. Other errors are printed, not raised (cleanup runs on the way
        out of a ``with`` block), in Petastorm's words: ``Error closing cache: ...``, ``Error during rmtree: ...``.
        """
        if not self._cleanup:
            logger.debug('local disk cache %s kept (cleanup=False)', self._path)
            return
        # print, not logging: Petastorm printed these lines, and scripts may look for them.
        try:
            self._cache.close()
        except (OSError, AttributeError) as err:
            print(f'Error closing cache: {err}', flush=True)
        try:
            self._cache.remove_files()
        except OSError as err:
            print(f'Error during rmtree: {err}', flush=True)
            return
        logger.info('removed the local disk cache %s', self._path)

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to worker processes as its settings: the copy opens the same directory.
        return _restore, (self._path, self._size_limit, self._expected_row_size, self._shards, self._cleanup,
                          self._policy, self._writable_tables)

    def __repr__(self) -> str:
        writable = ', writable_tables=True' if self._writable_tables else ''
        return (f'LocalDiskCache({self._path!r}, size_limit_bytes={self._size_limit}, shards={self._shards}, '
                f'cleanup={self._cleanup}, eviction_policy={self._policy!r}{writable})')
