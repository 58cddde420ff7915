"""A size-limited cache of Arrow tables in a local directory, shared safely by the processes of one node.

Each entry is one Arrow IPC file, read back memory-mapped (no copy, no pickle). The directory layout::

    <path>/entries/<shard>/<sha256 of key>.arrow   the entries, spread over ``shards`` directories
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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from petastorm.cache import CacheBase
from petastorm.errors import PetastormError

logger = logging.getLogger(__name__)

__all__ = ['EVICTION_POLICIES', 'CacheLocationError', 'LocalDiskCache']

EVICTION_POLICIES = ('least-recently-used', 'least-recently-stored', 'none')

# Eviction frees down to this fraction of the limit, so that a full directory scan is not needed on every write.
_EVICT_TO_FRACTION = 0.9
# Files in tmp/ older than this are left over from a process that died while writing; eviction removes them.
_STALE_TMP_SECONDS = 3600.0
_ENTRY_SUFFIX = '.arrow'
_LOCK_SUFFIX = '.lock'


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


class LocalDiskCache(CacheBase):
    """Caches Arrow tables as memory-mapped IPC files in a local directory, with LRU eviction by size.

    Args:
        path: the cache directory (created if needed); may be shared by several processes of one node.
        size_limit_bytes: the total size of the entries is kept under this (see the module doc).
        expected_row_size_bytes: the expected size of one entry; ``size_limit_bytes / shards`` must be at least
            5 times this, so the cache can hold enough entries to be useful. None skips the check.
        shards: number of subdirectories the entries are spread over.
        cleanup: when True, :meth:`cleanup` (called by ``Reader.cleanup_cache`` and a reader's ``with`` exit)
            removes the cache directory; by default the cache survives for the next reader or epoch.
        **settings: ``eviction_policy``: ``'least-recently-used'`` (default), ``'least-recently-stored'`` (hits
            do not refresh an entry) or ``'none'`` (never evict; store only while under the limit). Other names
            (settings of Petastorm's former diskcache backend) are ignored with a warning.

    Raises:
        ValueError: a bad argument.
        CacheLocationError: ``path`` cannot be created or written to.
    """

    def __init__(self, path: Any, size_limit_bytes: int | None, expected_row_size_bytes: int | None,
                 shards: int = 6, cleanup: bool = False, **settings: Any) -> None:
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
        self._cleanup = bool(cleanup)
        self._prepare_directory()

    # -- public ---------------------------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The cache directory."""
        return self._path

    @property
    def size_limit_bytes(self) -> int:
        """The size limit of the entries, in bytes."""
        return self._size_limit

    def get(self, key: str, fill_cache_func: Callable[[], pa.Table]) -> pa.Table:
        """The table stored under ``key``; on a miss, ``fill_cache_func()`` is called once per node and stored.

        Raises:
            TypeError: ``fill_cache_func`` returned something other than a ``pyarrow.Table``.
        """
        digest = hashlib.sha256(key.encode('utf-8')).hexdigest()
        entry = self._entry_path(digest)
        table = self._load(entry)
        if table is not None:
            return table
        with self._key_lock(digest):
            # Another process may have filled the entry while this one waited for the lock.
            table = self._load(entry, remove_unreadable=True)
            if table is not None:
                return table
            table = fill_cache_func()
            if not isinstance(table, pa.Table):
                raise TypeError(f'LocalDiskCache stores pyarrow Tables; fill_cache_func returned '
                                f'{type(table).__name__} for key {key!r}')
            self._store(entry, table)
        return table

    def volume(self) -> int:
        """Bytes held by the entries now (a directory scan)."""
        return sum(size for _, size, _ in self._scan_entries())

    def cleanup(self) -> None:
        """Remove the cache directory if the cache was created with ``cleanup=True``; otherwise do nothing.

        Only what the cache created is removed (the directory itself only if nothing else is left in it).
        Errors are logged, not raised: cleanup runs on the way out of a ``with`` block.
        """
        if not self._cleanup:
            logger.debug('local disk cache %s kept (cleanup was not requested)', self._path)
            return
        try:
            for name in ('entries', 'locks', 'tmp'):
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(os.path.join(self._path, name))
            for name in ('state.lock', 'size'):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._path, name))
        except OSError as err:
            logger.warning('could not remove the local disk cache %s: %s', self._path, err)
            return
        with contextlib.suppress(OSError):  # not empty: the user keeps other files there
            os.rmdir(self._path)
        logger.info('removed the local disk cache %s', self._path)

    def __repr__(self) -> str:
        return (f'LocalDiskCache({self._path!r}, size_limit_bytes={self._size_limit}, shards={self._shards}, '
                f'cleanup={self._cleanup}, eviction_policy={self._policy!r})')

    # -- layout -------------------------------------------------------------------------------------------------

    def _prepare_directory(self) -> None:
        try:
            for shard in range(self._shards):
                os.makedirs(os.path.join(self._path, 'entries', str(shard)), exist_ok=True)
            os.makedirs(os.path.join(self._path, 'locks'), exist_ok=True)
            os.makedirs(os.path.join(self._path, 'tmp'), exist_ok=True)
            # Creating the directories may succeed on an existing read-only tree: prove a write works.
            probe = os.path.join(self._path, 'tmp', f'probe-{uuid.uuid4().hex}')
            with open(probe, 'wb'):
                pass
            os.unlink(probe)
        except OSError as err:
            raise CacheLocationError(
                err.errno or errno.EACCES,
                f'the local disk cache directory {self._path!r} (cache_location) cannot be created or written to: '
                f'{err.strerror or err}. Pass a writable local directory as cache_location.') from err

    def _entry_path(self, digest: str) -> str:
        shard = int(digest[:8], 16) % self._shards
        return os.path.join(self._path, 'entries', str(shard), digest + _ENTRY_SUFFIX)

    def _lock_path(self, digest: str) -> str:
        return os.path.join(self._path, 'locks', digest + _LOCK_SUFFIX)

    # -- entries ------------------------------------------------------------------------------------------------

    def _load(self, entry: str, remove_unreadable: bool = False) -> pa.Table | None:
        """The entry's table, memory-mapped; None when it is absent or unreadable."""
        try:
            source = pa.memory_map(entry, 'r')
        except FileNotFoundError:
            return None
        try:
            table = pa.ipc.open_file(source).read_all()
        except (pa.ArrowInvalid, OSError) as err:
            # Entries appear only by rename, so this is damage from outside (a full disk, an edited file). Only
            # the caller holding the key lock may remove it (and says so once).
            if remove_unreadable:
                logger.warning('unreadable local disk cache entry %s (%s); reading the data again', entry, err)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry)
            return None
        finally:
            # The table's buffers keep the mapping alive; the file handle is no longer needed.
            source.close()
        if self._policy == 'least-recently-used':
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: the mapping stays valid
                os.utime(entry)
        logger.debug('local disk cache hit %s', entry)
        return table

    def _store(self, entry: str, table: pa.Table) -> None:
        tmp = os.path.join(self._path, 'tmp', f'{os.path.basename(entry)}.{os.getpid()}.{uuid.uuid4().hex}')
        try:
            with pa.OSFile(tmp, 'wb') as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            size = os.path.getsize(tmp)
            with self._state_lock():
                total = self._read_ledger()
                if self._policy == 'none' and total + size > self._size_limit:
                    logger.debug('local disk cache %s is full; not storing %s', self._path, entry)
                    return
                os.replace(tmp, entry)
                logger.debug('local disk cache stored %s (%d bytes)', entry, size)
                total += size
                if total > self._size_limit and self._policy != 'none':
                    total = self._evict()
                self._write_ledger(total)
        except OSError as err:
            # A cache that cannot store (disk full) must not fail the read: the caller has the table already.
            logger.warning('could not store local disk cache entry %s: %s', entry, err)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

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
                    if not item.name.endswith(_ENTRY_SUFFIX):
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
            digest = os.path.basename(entry)[:-len(_ENTRY_SUFFIX)]
            if self._remove_if_idle(digest, entry):
                total -= size
                removed += 1
        self._remove_stale_tmp()
        logger.debug('local disk cache %s: evicted %d entries, %d bytes left', self._path, removed, total)
        return total

    def _remove_if_idle(self, digest: str, entry: str) -> bool:
        """Remove an entry and its lock file unless its key lock is held (never waits)."""
        lock_path = self._lock_path(digest)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry)
            # Processes waiting on this lock file notice it was unlinked and retry on a new one (_key_lock).
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
    def _key_lock(self, digest: str) -> Iterator[None]:
        path = self._lock_path(digest)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # the locks directory was removed (another reader's cleanup)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                # Eviction may have unlinked the lock file while this process waited: a lock on an unlinked
                # file excludes nobody, so start again on the current one.
                held = os.fstat(fd)
                current = os.stat(path)
                if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
                    break
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)
