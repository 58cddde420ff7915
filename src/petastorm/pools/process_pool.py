"""A pool of worker processes: true parallelism for Python-heavy decoding, with results moved by shared memory.

Each worker is a fresh interpreter running petastorm's worker loop (see :mod:`petastorm.pools._launch`), never
a fork: forking a process that runs threads (Arrow's, the reader's, the framework's) can deadlock the child. The
user's ``__main__`` module is not re-imported in the workers, so scripts need no ``if __name__ == '__main__':``
guard. The worker function and its context are sent once per worker at start-up; items are pickled (they are
small); big arrays of dict results come back through POSIX shared memory without being copied in the parent
(see :mod:`petastorm.pools._transport`).

Arrays of results received this way are ordinary writable, C-contiguous NumPy arrays whose memory is a shared
memory slot of the worker: the worker rewrites the slot only after every array (and every view of one, e.g. a
row sliced from a batch column) of that result has been garbage collected, so holding on to one small row holds
the memory of its whole batch. Code that keeps raw pointers (``arr.ctypes.data``) must keep the array alive too,
as with any NumPy array. A child forked while such arrays exist keeps valid copies of them (their slots are not
reused). Besides the slots of results in flight or still referenced, each worker keeps up to two free slots
(about one result each) for reuse; slots live in ``/dev/shm``, and when it is full (small in some containers)
results fall back to being pickled through the pipe.

Starting costs a fresh interpreter per worker (imports of NumPy and of the worker function's module), so a
process pool is worth it for long runs of CPU-bound work; the worker function must be importable by name in a
fresh interpreter (defined at module level of an importable module: a function of ``__main__`` is not found).

Why not ``multiprocessing.Pool``: besides re-running ``__main__`` in its workers (see
:mod:`petastorm.pools._launch`) and moving big results slower (see :mod:`petastorm.pools._shm`), it waits forever
for the result of a worker that was killed (CPython bpo-22393), cannot cancel queued work, and its ``imap``
submits every item at once. On tiny results it is only a little faster: in two runs of ``benchmarks/pool_bench.py``
this pool moved 0.82x-0.97x its items/s with 2 items per worker in flight in both, and 0.86x-1.46x with 64 in
flight against ``Pool.imap`` (a reader's items are row groups, which take milliseconds each).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from petastorm.pools._posix_shm import missing_reason
from petastorm.pools._process_core import ProcessCore
from petastorm.pools.base import DEFAULT_MAX_BYTES_IN_FLIGHT, STOPPED, PoolBase, PoolOptions

__all__ = ['START_METHODS', 'ProcessPool', 'oversubscribed', 'usable_cores', 'warn_if_oversubscribed']

logger = logging.getLogger(__name__)

# Kept for compatibility: every worker is a fresh interpreter, whatever the name.
START_METHODS = ('spawn',)

_oversubscription_warned = False
_oversubscription_lock = threading.Lock()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def oversubscribed(workers_count: int, cores: int) -> bool:
    """Whether ``workers_count`` processes are far more than ``cores`` can run.

    True for over twice as many, and more than two beyond them.
    """
    return workers_count > max(2 * cores, cores + 2)


def warn_if_oversubscribed(workers_count: int) -> None:
    """Log a warning, once per process, when a process pool gets far more workers than the machine has cores.

    ``workers_count=10`` stays the readers' default, as in Petastorm; on a small machine ten interpreters compete
    for a few cores and each holds its own memory.
    """
    global _oversubscription_warned
    cores = usable_cores()
    if not oversubscribed(workers_count, cores):
        return
    with _oversubscription_lock:
        if _oversubscription_warned:
            return
        _oversubscription_warned = True
    logger.warning("reader_pool_type='process' with workers_count=%d starts %d worker processes, but this machine "
                   'has %d CPU cores for them: they compete for the cores and each holds its own interpreter and '
                   'memory. Pass workers_count=%d (about the number of cores) unless the work waits on storage.',
                   workers_count, workers_count, cores, cores)


class ProcessPool(PoolBase):
    """Runs ``worker_fn`` in ``workers_count`` worker processes; results come back in submission order.

    Args:
        workers_count: number of worker processes.
        max_in_flight: items submitted ahead of the consumer (default ``2 * workers_count``); fewer when the
            results seen so far say that so many would hold more than ``max_bytes_in_flight`` bytes.
        max_bytes_in_flight: budget for the results held in flight.
        start_method: only ``'spawn'`` (a fresh interpreter per worker) is supported.
        join_timeout: seconds ``join`` waits for workers to finish their current item before terminating them.

    ``start`` needs ``worker_fn`` and ``context`` to be picklable (the function by name). Errors raised by
    ``worker_fn`` are re-raised by ``imap`` as the original exception type when it can be pickled (else
    :class:`~petastorm.pools.base.WorkerFunctionError`), with the worker's traceback chained as a
    :class:`~petastorm.pools.base.RemoteTraceback`. A worker process that dies makes ``imap`` raise
    :class:`~petastorm.pools.base.WorkerDiedError`. Either way the pool is stopped. ``stop`` cancels pending work
    and asks the workers to exit without waiting; ``join`` waits for them and for the pool's helper thread.
    """

    kind = 'process'

    def __init__(self, workers_count: int, *, max_in_flight: int | None = None,
                 max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT, initial_in_flight: int | None = None,
                 start_method: str = 'spawn',
                 join_timeout: float = 5.0) -> None:
        options = PoolOptions(workers_count, max_in_flight, max_bytes_in_flight, initial_in_flight)
        if start_method not in START_METHODS:
            raise ValueError(f'start_method must be one of {START_METHODS} (fork is unsafe with threads; every '
                             f'worker is a fresh interpreter), got {start_method!r}')
        if not join_timeout >= 0:
            raise ValueError(f'join_timeout must be a non-negative number, got {join_timeout!r}')
        super().__init__(options.workers_count, options.budget())
        self.start_method = start_method
        self._join_timeout = float(join_timeout)
        self._core: ProcessCore | None = None
        self._finalizer: weakref.finalize | None = None

    def _start_workers(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        missing = missing_reason()
        if missing is not None:
            raise RuntimeError(missing)
        warn_if_oversubscribed(self.workers_count)
        label = f'process pool {id(self):#x}'
        self._core = core = ProcessCore(label, self.workers_count, worker_fn, context, self._join_timeout)
        # Runs at garbage collection if join() was never called, and only marks the core dropped: its collector
        # then ends the workers (see petastorm.pools._process_core). At interpreter exit the core's own exit hook
        # shuts it down.
        self._finalizer = weakref.finalize(self, core.release)
        self._finalizer.atexit = False

    def _started_core(self) -> ProcessCore:
        if self._core is None:  # not reachable: imap checks that the pool was started
            raise RuntimeError('process pool: imap() called before start()')
        return self._core

    def _raise_if_failed(self) -> None:
        if self._core is not None:
            self._core.raise_if_failed()

    def _submit(self, item: Any) -> Any:
        seq = self._started_core().submit(item)
        return STOPPED if seq is None else seq

    def _wait(self, handle: int) -> Any:
        entry = self._started_core().wait_result(handle)
        if entry is None:
            return STOPPED
        ok, value = entry
        if not ok:
            raise value
        return value

    def _cancel(self, handles: list[Any]) -> None:
        # Everything submitted so far belongs to the abandoned run (runs never overlap).
        self._started_core().abandon()

    def _stop_workers(self) -> None:
        if self._core is not None:
            self._core.stop()

    def _join_workers(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._core is not None:
            self._core.shutdown()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """The counters of every pool kind plus ``start_method``, ``worker_pids`` and ``workers_alive``."""
        info = super().diagnostics
        info['start_method'] = self.start_method
        core = self._core
        info['worker_pids'] = core.worker_pids() if core is not None else []
        info['workers_alive'] = core.workers_alive() if core is not None else 0
        return info
