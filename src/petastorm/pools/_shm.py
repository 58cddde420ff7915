"""POSIX shared memory segments that carry one result each from a worker process to the parent.

Life of a segment:

1. the worker creates it under a name the parent can predict (see :func:`segment_name`), writes the arrays of
   one result into it with ``pwrite`` and closes its descriptor; the worker never maps it;
2. the parent maps it (:func:`map_segment`) and unlinks the name at once. From then on the mapping is the only
   reference to the memory: it is private to the parent, and the kernel frees it when the ``mmap`` object is
   garbage collected (that is, when the last array over it is);
3. a segment whose reply the parent does not want is just unlinked (:func:`unlink_segment`).

Nothing here registers with :mod:`multiprocessing.resource_tracker`: the parent unlinks every name it learns
about, and a worker whose parent died unlinks the names it created that the parent never opened
(:class:`SegmentWriter`). The module uses the same private CPython module as
:mod:`multiprocessing.shared_memory` to open segments by name portably.
"""

from __future__ import annotations

import _posixshmem
import errno
import mmap
import os
import threading
from typing import NoReturn

import numpy as np

# Full pages written with pwrite are not zeroed first by the kernel, and the worker never pays for page faults
# or for unmapping; on platforms where shared memory objects do not support write(), mapping is the fallback.
_NO_WRITE_SUPPORT = (errno.EINVAL, errno.ESPIPE, errno.ENOTSUP, errno.ENODEV)
# write(2) moves at most about 2 GiB per call on Linux.
_MAX_WRITE = 1 << 30


def segment_name(prefix: str, seq: int) -> str:
    """The name of the segment that may hold the result of item ``seq`` of the pool with this prefix."""
    return f'{prefix}{seq:x}'


def _path(name: str) -> str:
    return '/' + name


def _writable_bytes(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` in C order, without a copy when it is C-contiguous."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat.view(np.uint8))


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data[:_MAX_WRITE], offset)
        data = data[written:]
        offset += written


def _write_mapped(fd: int, size: int, parts: list[tuple[int, np.ndarray]]) -> None:
    mapped = mmap.mmap(fd, size)
    try:
        for offset, array in parts:
            target = np.frombuffer(mapped, np.uint8, array.nbytes, offset)
            target[...] = _writable_bytes(array)
            del target  # the mapping cannot be closed while a view of it exists
    finally:
        mapped.close()


class SegmentWriter:
    """Worker side: creates segments and remembers the ones the parent may not have unlinked yet.

    The parent unlinks a segment's name as soon as it receives its descriptor, so a name that still exists is
    one the parent has not handled. When the parent dies, :meth:`remove_all_and_exit` unlinks those.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unacknowledged: list[str] = []

    def write(self, name: str, size: int, parts: list[tuple[int, np.ndarray]]) -> None:
        """Create segment ``name`` of ``size`` bytes holding each ``(offset, array)`` of ``parts``."""
        with self._lock:
            self._prune()
            # Remembered before it exists, so that a concurrent exit also removes a half-made segment.
            self._unacknowledged.append(name)
            fd = _posixshmem.shm_open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            try:
                for offset, array in parts:
                    _write_all(fd, _writable_bytes(array), offset)
            except OSError as exc:
                if exc.errno not in _NO_WRITE_SUPPORT:
                    raise
                _write_mapped(fd, size, parts)
        except BaseException:
            self.discard(name)
            raise
        finally:
            os.close(fd)

    def discard(self, name: str) -> None:
        """Unlink segment ``name`` (whose descriptor will never reach the parent) and forget it."""
        with self._lock:
            unlink_segment(name)
            if name in self._unacknowledged:
                self._unacknowledged.remove(name)

    def remove_all_and_exit(self, exit_code: int) -> NoReturn:
        """Unlink every segment the parent has not unlinked, then end the process at once.

        The lock is never released: a thread about to create another segment waits until the process is gone.
        """
        self._lock.acquire()
        for name in self._unacknowledged:
            unlink_segment(name)
        os._exit(exit_code)

    def _prune(self) -> None:
        # Called with the lock held; the list stays as short as the number of this worker's results in flight.
        still_there = []
        for name in self._unacknowledged:
            try:
                fd = _posixshmem.shm_open(_path(name), os.O_RDONLY, 0)
            except FileNotFoundError:
                continue
            os.close(fd)
            still_there.append(name)
        self._unacknowledged = still_there


def map_segment(name: str, size: int) -> mmap.mmap:
    """Parent side: map segment ``name`` read-write and unlink its name (whether or not mapping succeeds).

    The returned mapping is shared with nobody (the worker closed its descriptor before sending the name); it is
    unmapped when the ``mmap`` object is garbage collected.
    """
    try:
        fd = _posixshmem.shm_open(_path(name), os.O_RDWR, 0)
    except BaseException:
        unlink_segment(name)
        raise
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
        unlink_segment(name)


def array_over(mapped: mmap.mmap, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A writable array viewing ``mapped`` at ``offset``; it keeps the mapping alive through its ``base``."""
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)


def unlink_segment(name: str) -> None:
    """Remove the name of segment ``name`` if it exists; its memory goes when the last mapping or fd does."""
    try:
        _posixshmem.shm_unlink(_path(name))
    except FileNotFoundError:
        pass
