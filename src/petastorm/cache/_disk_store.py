"""The files of a local disk cache directory: entries, their atomic writes, the size ledger and eviction.

See :mod:`petastorm.cache._local_disk` for the layout of the directory and the rules of sharing it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from petastorm.cache._disk_locks import acquire_key_lock, exclusive_lock, remove_if_unlocked
from petastorm.cache._mapped import read_mapped_table
from petastorm.cache._values import UncacheableValueError, encode_value, read_value

logger = logging.getLogger(__name__)

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
# How often the layout is made again when a concurrent cleanup removes a part of it midway.
_LAYOUT_ATTEMPTS = 5
_STATE_FILES = ('state.lock', 'size')


class DiskStore:
    """The entry files, locks and size ledger of one local disk cache directory.

    :meth:`close` ends its use of the directory: afterwards nothing is written there (nor re-created), so that a
    cleanup that follows removes everything for good.
    """

    def __init__(self, path: str, shards: int, size_limit: int, policy: str, writable_tables: bool = False) -> None:
        self._path = path
        self._read_table = read_mapped_table if writable_tables else _read_table
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
        for attempt in range(_LAYOUT_ATTEMPTS):
            self._make_layout()
            # Creating the directories may succeed on an existing read-only tree: prove a write works.
            probe = os.path.join(self._path, 'tmp', f'probe-{uuid.uuid4().hex}')
            try:
                with open(probe, 'wb'):
                    pass
            except FileNotFoundError:  # removed meanwhile by another process's cleanup
                if attempt == _LAYOUT_ATTEMPTS - 1:
                    raise
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(probe)
            return

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
        # Another process's cleanup may remove a parent between the creation of a directory and of its child
        # (FileNotFoundError). Each process cleans up once, so making the whole layout again soon succeeds.
        for attempt in range(_LAYOUT_ATTEMPTS):
            try:
                for shard in range(self._shards):
                    os.makedirs(os.path.join(self._path, 'entries', str(shard)), exist_ok=True)
                os.makedirs(os.path.join(self._path, 'locks'), exist_ok=True)
                os.makedirs(os.path.join(self._path, 'tmp'), exist_ok=True)
                return
            except FileNotFoundError:
                if attempt == _LAYOUT_ATTEMPTS - 1:
                    raise

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
        """The entry's value (a table viewing its memory-mapped file); None if absent or unreadable."""
        for suffix, read in ((_TABLE_SUFFIX, self._read_table), (_VALUE_SUFFIX, _read_value_file)):
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
            with exclusive_lock(os.path.join(self._path, 'state.lock')):
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
            if remove_if_unlocked(self._lock_path(digest), entry):
                total -= size
                removed += 1
        self._remove_stale_tmp()
        logger.debug('local disk cache %s: evicted %d entries, %d bytes left', self._path, removed, total)
        return total

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
    def key_lock(self, digest: str) -> Iterator[bool]:
        """Hold the key's lock; yields False (holding nothing) when the store is closed or has no directory."""
        fd = acquire_key_lock(self._lock_path(digest), lambda: self._closed, self._remake_layout)
        if fd is None:
            yield False
            return
        try:
            yield True
        finally:
            os.close(fd)

    def drop_lock(self, digest: str) -> None:
        """Unlink the key's lock file (call while holding it); waiters notice and lock a new one."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lock_path(digest))


def _read_table(entry: str) -> pa.Table:
    """The table of an IPC entry file, viewing a read-only memory map of it (the reading happens in Arrow)."""
    source = pa.memory_map(entry, 'r')
    try:
        return pa.ipc.open_file(source).read_all()
    finally:
        # The table's buffers keep the mapping alive; the file handle is no longer needed.
        source.close()


def _read_value_file(entry: str) -> Any:
    with open(entry, 'rb') as file:
        return read_value(file)
