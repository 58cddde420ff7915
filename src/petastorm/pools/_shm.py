"""POSIX shared memory slots that carry results from a worker process to the parent without copies in the parent.

Each worker owns a few *slots*: named shared memory segments that both it and the parent keep mapped. For a
result, the worker takes a free slot (or creates one), copies the result's arrays into it and sends the slot's
id; the parent wraps arrays around its mapping of the slot (see :mod:`petastorm.pools._shm_parent`). When the
consumer no longer references any of those arrays, the parent tells the worker (with its next task) that the slot
is free again. Reusing slots avoids page faults on both sides, which dominate the cost of fresh shared memory:
the kernel must allocate, zero and map every page of a new segment, and map it again in the parent.

Safety rules:

* the worker writes into a slot only while no array of the parent refers to it (a fresh slot, or one released
  by the parent);
* a slot that had arrays when the parent process forked may still be in use by the child: it is destroyed
  instead of reused;
* names are removed by the worker when it exits for whatever reason it notices (stop, or its parent died), and by
  the parent for a worker that died (every slot id up to the worker's announced count). Removing a name never
  invalidates an existing mapping; the memory goes when the last mapping does.

Nothing registers with :mod:`multiprocessing.resource_tracker`: segments are created, opened and unlinked by name
through :mod:`petastorm.pools._posix_shm` (which says why :class:`multiprocessing.shared_memory.SharedMemory` is not
used).

Why slots and not the standard library's way, a new ``SharedMemory`` per result that the parent attaches, unlinks
and closes once its arrays are gone (``benchmarks/pool_bench.py``, 2 workers, the consumer reading every page):
in two runs the slots moved 2.5x-5.2x as many results of 1 MiB per second, 3.3x-5.3x of 8 MiB and 4.8x-6.6x of
64 MiB, because every new segment is page-faulted, zero-filled and mapped anew on both sides.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Iterable
from typing import NoReturn

import numpy as np

from petastorm.pools._posix_shm import create_segment, open_segment, unlink_segment

# write(2) moves at most about 2 GiB per call on Linux.
_MAX_WRITE = 1 << 30
# What write(2) fails with on systems whose shared memory objects support only mapping.
_NO_WRITE_SUPPORT = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ESPIPE, errno.ENODEV)
# Slot capacities are rounded up to a power of two (at least this): pages beyond what was written are never
# allocated, so the headroom costs only address space, and results of varying sizes can share slots.
_MIN_CAPACITY = 1 << 20
# Free slots a worker keeps for reuse; more are destroyed (they would only hold memory).
MAX_FREE_SLOTS = 2


def slot_name(prefix: str, worker_index: int, slot_id: int) -> str:
    """The name of slot ``slot_id`` of worker ``worker_index`` of the pool with this prefix."""
    return f'{prefix}{worker_index:x}_{slot_id:x}'


def _as_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of ``array`` in C order, as a flat uint8 array (no copy when it is C-contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _copy_mapped(slot: _Slot, parts: list[tuple[int, np.ndarray]]) -> None:
    assert slot.mapped is not None
    for offset, array in parts:
        data = _as_bytes(array)
        target = np.frombuffer(slot.mapped, np.uint8, data.size, offset)
        target[...] = data
        del target  # a mapping with views cannot be closed


def _write_fd(slot: _Slot, parts: list[tuple[int, np.ndarray]]) -> None:
    for offset, array in parts:
        data = _as_bytes(array).data
        while len(data):
            written = os.pwrite(slot.fd, data[:_MAX_WRITE], offset)
            data = data[written:]
            offset += written


class _Slot:
    __slots__ = ('capacity', 'fd', 'mapped', 'name', 'populated')

    def __init__(self, name: str) -> None:
        self.name = name
        self.fd = -1
        self.mapped: mmap.mmap | None = None
        self.capacity = 0
        self.populated = 0  # bytes from the start that were written at least once (their pages exist)


class SlotWriter:
    """Worker side: the slots of one worker process."""

    def __init__(self, prefix: str, worker_index: int, max_free: int = MAX_FREE_SLOTS) -> None:
        self._prefix = prefix
        self._worker_index = worker_index
        self._max_free = max_free
        self._lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._free: list[int] = []  # oldest first
        self.created = 0  # slot ids are 0, 1, ... in creation order
        self._destroyed: list[int] = []  # not yet reported to the parent (which then drops its mapping)
        self.failed = False  # whether writing a slot failed once (reported once)

    def write(self, size: int, parts: list[tuple[int, np.ndarray]]) -> tuple[int, str]:
        """Copy each ``(offset, array)`` of ``parts`` into a slot of at least ``size`` bytes; returns its id and name.

        Raises:
            OSError: e.g. ENOSPC when the shared memory file system is full (the slot is destroyed).
        """
        slot_id, slot = self._acquire(size)
        try:
            if size <= slot.populated:
                _copy_mapped(slot, parts)
            else:
                # New pages: write(2) allocates them without zeroing them first and, unlike a store through the
                # mapping, reports a full file system as an error instead of killing the process with SIGBUS.
                try:
                    _write_fd(slot, parts)
                except OSError as exc:
                    if exc.errno not in _NO_WRITE_SUPPORT:
                        raise
                    _copy_mapped(slot, parts)  # e.g. macOS, whose shared memory objects cannot be written to
                slot.populated = size
        except BaseException:
            self.release([(slot_id, False)])
            raise
        return slot_id, slot.name

    def _acquire(self, size: int) -> tuple[int, _Slot]:
        with self._lock:
            fitting = [slot_id for slot_id in self._free if self._slots[slot_id].capacity >= size]
            if fitting:
                slot_id = min(fitting, key=lambda i: self._slots[i].capacity)
                self._free.remove(slot_id)
                return slot_id, self._slots[slot_id]
            if self._free:
                self._destroy(self._free.pop(0))  # too small: make room for a bigger one
            slot_id = self.created
            self.created += 1
            # Registered before it exists, so that a concurrent exit also removes a half-made slot.
            slot = self._slots[slot_id] = _Slot(slot_name(self._prefix, self._worker_index, slot_id))
            try:
                slot.fd = create_segment(slot.name)
                slot.capacity = max(_MIN_CAPACITY, 1 << (size - 1).bit_length())
                os.ftruncate(slot.fd, slot.capacity)
                slot.mapped = mmap.mmap(slot.fd, slot.capacity)
            except BaseException:
                self._destroy(slot_id)
                raise
            return slot_id, slot

    def release(self, releases: Iterable[tuple[int, bool]]) -> None:
        """Return slots to the free list (``(slot_id, True)``) or destroy them (``(slot_id, False)``)."""
        with self._lock:
            for slot_id, reuse in releases:
                if slot_id not in self._slots or slot_id in self._free:
                    continue
                if reuse:
                    self._free.append(slot_id)
                else:
                    self._destroy(slot_id)
            while len(self._free) > self._max_free:
                self._destroy(self._free.pop(0))

    @property
    def has_destroyed(self) -> bool:
        """Whether slots were destroyed since the last :meth:`take_destroyed`."""
        return bool(self._destroyed)

    def take_destroyed(self) -> list[int]:
        """The ids of the slots destroyed since the last call (to report to the parent)."""
        with self._lock:
            destroyed, self._destroyed = self._destroyed, []
        return destroyed

    def _destroy(self, slot_id: int) -> None:
        slot = self._slots.pop(slot_id)
        self._destroyed.append(slot_id)
        unlink_segment(slot.name)
        if slot.mapped is not None:
            try:
                slot.mapped.close()
            except BufferError:
                pass  # a view is still referenced (e.g. by a traceback); the mapping goes away with it
        if slot.fd >= 0:
            os.close(slot.fd)

    def remove_all(self) -> None:
        """Unlink every slot (at exit; mappings the parent holds stay valid)."""
        with self._lock:
            for slot_id in list(self._slots):
                self._destroy(slot_id)
            self._free.clear()

    def remove_all_and_exit(self, exit_code: int) -> NoReturn:
        """Unlink every slot's name, then end the process at once.

        The lock is never released: a thread about to create another slot waits until the process is gone.
        """
        self._lock.acquire()
        for slot in self._slots.values():
            unlink_segment(slot.name)
        os._exit(exit_code)


def open_slot(name: str) -> mmap.mmap:
    """Parent side: map the whole of slot ``name`` read-write (shared with its worker)."""
    fd = open_segment(name)
    try:
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
