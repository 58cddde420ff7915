"""The parent's side of the shared memory slots of :mod:`petastorm.pools._shm`.

The parent maps each slot once and keeps the mapping while the slot exists, so the page tables built when the
consumer first reads a slot serve every later result written to it: reading a result costs no page faults in the
steady state. Each result gets its own exporter over the mapping, a flat uint8 array; the result's arrays (and every
view of them) keep it alive through their ``base`` (NumPy does not collapse a view's base past an array whose own
base is not an array), and its garbage collection releases the slot.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections import deque

import numpy as np

from petastorm.pools._shm import open_slot


def _count_fork(slots: weakref.ref[ParentSlots]) -> None:
    target = slots()
    if target is not None:
        target.forks += 1


class ParentSlots:
    """The parent's mappings of every worker's slots, and the releases waiting to be sent to the workers.

    Threads: the collector calls :meth:`wrap` and :meth:`forget`; :meth:`take` is called by the consumer with the
    pool's lock; garbage collection (in any thread) and :meth:`release_now` only append to a deque, which needs
    no lock.
    """

    def __init__(self, workers_count: int) -> None:
        self.forks = 0
        self._mappings: list[dict[int, mmap.mmap]] = [{} for _ in range(workers_count)]
        self._queue: deque[tuple[int, int, int]] = deque()  # (worker index, slot id, forks when wrapped)
        self._pending: list[list[tuple[int, bool]]] = [[] for _ in range(workers_count)]
        if hasattr(os, 'register_at_fork'):
            # A child forked while a result exists may keep using it: the slot must never be rewritten. (Each pool
            # adds one callback; it holds only a weak reference.)
            ref = weakref.ref(self)
            os.register_at_fork(after_in_parent=lambda: _count_fork(ref))

    def wrap(self, worker_index: int, slot_id: int, name: str, size: int) -> np.ndarray:
        """A writable uint8 array over (at least) the first ``size`` bytes of a slot.

        The slot is released when this array and every array made from it by :func:`array_over` are garbage
        collected.
        """
        mappings = self._mappings[worker_index]
        mapped = mappings.get(slot_id)
        if mapped is None or len(mapped) < size:
            mapped = mappings[slot_id] = open_slot(name)
        exporter = np.frombuffer(mapped, np.uint8)
        finalizer = weakref.finalize(exporter, self._queue.append, (worker_index, slot_id, self.forks))
        finalizer.atexit = False
        return exporter

    def forget(self, worker_index: int, slot_ids: list[int] | None = None) -> None:
        """Drop the mappings of slots the worker destroyed (all of them: None); arrays still over them stay valid."""
        mappings = self._mappings[worker_index]
        if slot_ids is None:
            mappings.clear()
        for slot_id in slot_ids or ():
            mappings.pop(slot_id, None)

    def release_now(self, worker_index: int, slot_id: int, reuse: bool = True) -> None:
        """Release a slot whose result was never wrapped (not wanted, or wrapping failed)."""
        self._queue.append((worker_index, slot_id, self.forks if reuse else -1))

    def take(self, worker_index: int) -> list[tuple[int, bool]]:
        """The ``(slot_id, reusable)`` releases to send to worker ``worker_index`` (call with the pool's lock)."""
        while self._queue:
            index, slot_id, forks = self._queue.popleft()
            self._pending[index].append((slot_id, forks == self.forks))
        taken, self._pending[worker_index] = self._pending[worker_index], []
        return taken


def array_over(exporter: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A writable array viewing ``exporter`` (from :meth:`ParentSlots.wrap`) at ``offset``.

    Its ``base`` is the exporter, which it keeps alive.
    """
    return np.ndarray(shape, dtype=dtype, buffer=exporter, offset=offset)
