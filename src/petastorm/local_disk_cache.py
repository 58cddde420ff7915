"""A size-limited cache in a local directory, shared safely by the processes of one node.

Entries: a ``pyarrow.Table`` (what the reader caches: the raw columns of a row group) is one Arrow IPC file, read
back memory-mapped (no copy). Any other value -- numbers, strings, bytes, ``decimal.Decimal``, NumPy arrays and
scalars, and lists, tuples and dicts of these -- is one file of the typed format of :mod:`petastorm._cache_values`
(JSON for the structure, ``.npy`` for arrays). A value of any other type is refused with a ``TypeError``.

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

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from petastorm._cache_values import UncacheableValueError, encode_value, read_value
from petastorm.cache import CacheBase
from petastorm.errors import PetastormError

logger = logging.getLogger(__name__)

__all__ = ['EVICTION_POLICIES', 'CacheLocationError', 'LocalDiskCache', 'UncacheableValueError']

EVICTION_POLICIES = ('least-recently-used', 'least-recently-stored', 'none')

# Eviction frees down to this fraction of the limit, so that a full directory scan is not needed on every write.
_EVICT_TO_FRACTION = 0.9
# Files in tmp/ older than this are left over from a process that died while writing; eviction removes them.
_STALE_TMP_SECONDS = 3600.0
_TABLE_SUFFIX = '.arrow'
_VALUE_SUFFIX = '.value'
_ENTRY_SUFFIXES = (_TABLE_SUFFIX, _VALUE_SUFFIX)
_LOCK_SUFFIX = '.lock'
_SUBDIRECTORIES = ('entries', 'locks', 'tmp')
_STATE_FILES = ('state.lock', 'size')


class CacheLocationError(PetastormError, OSError):
    """The cache directory cannot be created or written to (the message names the path)."""


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive integer (bytes), got {value!r}')
    return value


def _local_path(path: Any) -> str:
    if isinstance(path, str) and path.startswith('file://'):
        path = path[len('file://'):]
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f'the local disk cache needs a directory path (cache_location), got {path!r}')
    return os.path.abspath(os.fspath(path))


def _restore(path: str, size_limit_bytes: int, expected_row_size_bytes: int | None, shards: int, cleanup: bool,
             eviction_policy: str) -> LocalDiskCache:
    return LocalDiskCache(path, size_limit_bytes, expected_row_size_bytes, shards=shards, cleanup=cleanup,
                          eviction_policy=eviction_policy)


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
            do not refresh an entry) or ``'none'`` (never evict; store only while under the limit). Other names
            (settings of Petastorm's former diskcache backend) are ignored with a warning.

    Raises:
        ValueError: a bad argument.
        CacheLocationError: ``path`` cannot be created or written to.

    Example::

        cache = LocalDiskCache('/tmp/my-cache', 1 << 30, 1 << 20, cleanup=False)
        value = cache.get('answer', lambda: {'rows': 42, 'ids': np.arange(3)})  # computed once, then read back
    """

    def __init__(self, path: Any, size_limit_bytes: int | None, expected_row_size_bytes: int | None,
                 shards: int = 6, cleanup: bool = True, **settings: Any) -> None:
        self._path = _local_path(path)
        self._size_limit = _positive_int('size_limit_bytes (cache_size_limit)', size_limit_bytes)
        self._shards = _positive_int('shards', shards)
        policy = settings.pop('eviction_policy', 'least-recently-used')
        if policy not in EVICTION_POLICIES:
            raise ValueError(f'eviction_policy must be one of {EVICTION_POLICIES}, got {policy!r}')
        self._policy = policy
        if settings:
            logger.warning('LocalDiskCache ignores the settings %s (they configured the former diskcache backend)',
                           sorted(settings))
        if expected_row_size_bytes is not None:
            expected_row_size_bytes = _positive_int('expected_row_size_bytes (cache_row_size_estimate)',
                                                    expected_row_size_bytes)
            if policy != 'none' and self._size_limit / self._shards < 5 * expected_row_size_bytes:
                raise ValueError(
                    f"Condition 'size_limit_bytes / shards < 5 * expected_row_size_bytes' needs to hold, but "
                    f'size_limit_bytes={self._size_limit}, shards={self._shards}, expected_row_size_bytes='
                    f'{expected_row_size_bytes}: the cache could hold too few entries. Increase cache_size_limit '
                    f'or decrease shards.')
        self._expected_row_size = expected_row_size_bytes
        self._cleanup = bool(cleanup)
        self._cache = _DiskStore(self._path, self._shards, self._size_limit, self._policy)
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
                          self._policy)

    def __repr__(self) -> str:
        return (f'LocalDiskCache({self._path!r}, size_limit_bytes={self._size_limit}, shards={self._shards}, '
                f'cleanup={self._cleanup}, eviction_policy={self._policy!r})')


class _DiskStore:
    """The entry files, locks and size ledger of one :class:`LocalDiskCache` directory.

    :meth:`close` ends its use of the directory: afterwards nothing is written there (nor re-created), so that a
    cleanup that follows removes everything for good.
    """

    def __init__(self, path: str, shards: int, size_limit: int, policy: str) -> None:
        self._path = path
        self._shards = shards
        self._size_limit = size_limit
        self._policy = policy
        self._closed = False
        # Commits, re-creating the layout and close() exclude each other within the process.
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def prepare(self) -> None:
        """Create the layout and prove that files can be written in it (raises OSError)."""
        self._make_layout()
        # Creating the directories may succeed on an existing read-only tree: prove a write works.
        probe = os.path.join(self._path, 'tmp', f'probe-{uuid.uuid4().hex}')
        with open(probe, 'wb'):
            pass
        os.unlink(probe)

    def close(self) -> None:
        """Stop reading and writing entries (idempotent); waits for a commit in progress in another thread."""
        with self._lock:
            self._closed = True

    def remove_files(self) -> None:
        """Remove the layout (absent parts are skipped), then the directory if it is empty; raises OSError."""
        for name in _SUBDIRECTORIES:
            target = os.path.join(self._path, name)
            try:
                shutil.rmtree(target)
            except FileNotFoundError:
                continue
            except OSError:
                # Another process may have added a file while the tree was being removed: try once more.
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(target)
        for name in _STATE_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._path, name))
        with contextlib.suppress(OSError):  # gone already, or not empty: the user keeps other files there
            os.rmdir(self._path)

    def volume(self) -> int:
        """Bytes held by the entries now (a directory scan)."""
        return sum(size for _, size, _ in self._scan_entries())

    # -- layout -------------------------------------------------------------------------------------------------

    def _make_layout(self) -> None:
        for shard in range(self._shards):
            os.makedirs(os.path.join(self._path, 'entries', str(shard)), exist_ok=True)
        os.makedirs(os.path.join(self._path, 'locks'), exist_ok=True)
        os.makedirs(os.path.join(self._path, 'tmp'), exist_ok=True)

    def _remake_layout(self) -> bool:
        """Re-create the layout removed by another process's cleanup; False (and nothing made) once closed."""
        with self._lock:
            if self._closed:
                return False
            try:
                self._make_layout()
            except OSError as err:
                logger.warning('could not re-create the local disk cache directory %s: %s', self._path, err)
                return False
            logger.debug('re-created the local disk cache directory %s', self._path)
            return True

    def _entry_path(self, digest: str, suffix: str) -> str:
        shard = int(digest[:8], 16) % self._shards
        return os.path.join(self._path, 'entries', str(shard), digest + suffix)

    def _lock_path(self, digest: str) -> str:
        return os.path.join(self._path, 'locks', digest + _LOCK_SUFFIX)

    # -- entries ------------------------------------------------------------------------------------------------

    def load(self, digest: str, remove_unreadable: bool = False) -> Any:
        """The entry's value (a table memory-mapped); None when it is absent or unreadable."""
        for suffix, read in ((_TABLE_SUFFIX, _read_table), (_VALUE_SUFFIX, _read_value_file)):
            entry = self._entry_path(digest, suffix)
            try:
                value = read(entry)
            except FileNotFoundError:
                continue
            except (ValueError, EOFError, OSError) as err:  # pa.ArrowInvalid is a ValueError
                # Entries appear only by rename, so this is damage from outside (a full disk, an edited file). Only
                # the caller holding the key lock may remove it (and says so once).
                if remove_unreadable:
                    logger.warning('unreadable local disk cache entry %s (%s); reading the data again', entry, err)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry)
                return None
            if self._policy == 'least-recently-used':
                with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: the value was read already
                    os.utime(entry)
            logger.debug('local disk cache hit %s', entry)
            return value
        return None

    def store(self, digest: str, value: Any, key: str) -> bool:
        """Write the entry of ``value``; False when it was not stored (full, closed, or a disk error, logged).

        Raises:
            UncacheableValueError: ``value`` has no safe encoding.
        """
        if isinstance(value, pa.Table):
            entry, chunks = self._entry_path(digest, _TABLE_SUFFIX), None
        else:
            try:
                chunks = encode_value(value)
            except UncacheableValueError as err:
                raise UncacheableValueError(f'{err} (key {key!r})') from None
            entry = self._entry_path(digest, _VALUE_SUFFIX)
        for attempt in (1, 2):
            tmp = os.path.join(self._path, 'tmp', f'{os.path.basename(entry)}.{os.getpid()}.{uuid.uuid4().hex}')
            try:
                if chunks is None:
                    with pa.OSFile(tmp, 'wb') as sink, pa.ipc.new_file(sink, value.schema) as writer:
                        writer.write_table(value)
                else:
                    with open(tmp, 'wb') as sink:
                        sink.writelines(chunks)
                return self._commit(tmp, entry)
            except FileNotFoundError as err:
                # Another process's cleanup removed the directory: make it again, once.
                if attempt == 1 and self._remake_layout():
                    continue
                logger.debug('local disk cache entry %s not stored: %s', entry, err)
                return False
            except OSError as err:
                # A cache that cannot store (disk full) must not fail the read: the caller has the value already.
                logger.warning('could not store local disk cache entry %s: %s', entry, err)
                return False
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return False  # pragma: no cover - the loop always returns

    def _commit(self, tmp: str, entry: str) -> bool:
        size = os.path.getsize(tmp)
        with self._lock:
            if self._closed:
                return False
            with self._state_lock():
                total = self._read_ledger()
                if self._policy == 'none' and total + size > self._size_limit:
                    logger.debug('local disk cache %s is full; not storing %s', self._path, entry)
                    return False
                os.replace(tmp, entry)
                logger.debug('local disk cache stored %s (%d bytes)', entry, size)
                total += size
                if total > self._size_limit and self._policy != 'none':
                    total = self._evict()
                self._write_ledger(total)
        return True

    # -- eviction -----------------------------------------------------------------------------------------------

    def _scan_entries(self) -> Iterator[tuple[int, int, str]]:
        """``(mtime_ns, size, path)`` of every entry."""
        for shard in range(self._shards):
            try:
                listing = os.scandir(os.path.join(self._path, 'entries', str(shard)))
            except FileNotFoundError:
                continue
            with listing:
                for item in listing:
                    if not item.name.endswith(_ENTRY_SUFFIXES):
                        continue
                    try:
                        stat = item.stat()
                    except FileNotFoundError:
                        continue
                    yield stat.st_mtime_ns, stat.st_size, item.path

    def _evict(self) -> int:
        """Remove least recently used entries until 90% of the limit is left; returns the bytes left."""
        entries = sorted(self._scan_entries())
        total = sum(size for _, size, _ in entries)
        target = int(self._size_limit * _EVICT_TO_FRACTION)
        removed = 0
        for _, size, entry in entries:
            if total <= target:
                break
            digest = os.path.splitext(os.path.basename(entry))[0]
            if self._remove_if_idle(digest, entry):
                total -= size
                removed += 1
        self._remove_stale_tmp()
        logger.debug('local disk cache %s: evicted %d entries, %d bytes left', self._path, removed, total)
        return total

    def _remove_if_idle(self, digest: str, entry: str) -> bool:
        """Remove an entry and its lock file unless its key lock is held (never waits)."""
        lock_path = self._lock_path(digest)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # the locks directory was removed by another process's cleanup
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry)
            # Processes waiting on this lock file notice it was unlinked and retry on a new one (key_lock).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)
            return True
        finally:
            os.close(fd)

    def _remove_stale_tmp(self) -> None:
        deadline = time.time() - _STALE_TMP_SECONDS
        with contextlib.suppress(FileNotFoundError), os.scandir(os.path.join(self._path, 'tmp')) as listing:
            for item in listing:
                with contextlib.suppress(FileNotFoundError):
                    if item.stat().st_mtime < deadline:
                        os.unlink(item.path)

    # -- ledger and locks ---------------------------------------------------------------------------------------

    def _read_ledger(self) -> int:
        """The recorded total size of the entries; a scan when the ledger is missing or damaged."""
        try:
            with open(os.path.join(self._path, 'size'), encoding='ascii') as f:
                return int(f.read())
        except (FileNotFoundError, ValueError):
            return self.volume()

    def _write_ledger(self, total: int) -> None:
        with open(os.path.join(self._path, 'size'), 'w', encoding='ascii') as f:
            f.write(str(total))

    @contextlib.contextmanager
    def _state_lock(self) -> Iterator[None]:
        fd = os.open(os.path.join(self._path, 'state.lock'), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    @contextlib.contextmanager
    def key_lock(self, digest: str) -> Iterator[bool]:
        """Hold the key's lock; yields False (holding nothing) when the store is closed or has no directory."""
        fd = self._acquire_key_lock(digest)
        if fd is None:
            yield False
            return
        try:
            yield True
        finally:
            os.close(fd)

    def _acquire_key_lock(self, digest: str) -> int | None:
        path = self._lock_path(digest)
        while True:
            if self._closed:
                return None
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # the locks directory was removed (another process's cleanup)
                if not self._remake_layout():
                    return None
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                # Eviction may have unlinked the lock file while this process waited: a lock on an unlinked
                # file excludes nobody, so start again on the current one.
                held = os.fstat(fd)
                current = os.stat(path)
                if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
                    return fd
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def drop_lock(self, digest: str) -> None:
        """Unlink the key's lock file (call while holding it); waiters notice and lock a new one."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lock_path(digest))


def _read_table(entry: str) -> pa.Table:
    source = pa.memory_map(entry, 'r')
    try:
        return pa.ipc.open_file(source).read_all()
    finally:
        # The table's buffers keep the mapping alive; the file handle is no longer needed.
        source.close()


def _read_value_file(entry: str) -> Any:
    with open(entry, 'rb') as file:
        return read_value(file)
