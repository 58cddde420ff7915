"""What every worker pool shares: the protocol, the exceptions, the in-flight budget and the ordered window loop.

A pool runs one pure function ``worker_fn(context, item) -> result`` over a stream of work items and hands the
results back **in submission order**, so that a seeded reader produces the same sequence whatever the pool kind
and the number of workers. At most a bounded number of items is pulled from the item stream ahead of the
consumer; the bound shrinks when results are big (see :class:`InFlightBudget`).

How the pieces fit: :class:`PoolBase` owns everything the kinds have in common: the lifecycle checks, the
counters, the superseding rule and the loop behind ``imap`` (:meth:`PoolBase._ordered_window`), which pulls items
up to the budget's limit, submits them, waits for the oldest and yields it. A kind supplies only small hooks:
``_submit`` an item and get a handle back, ``_wait`` for a handle's result, ``_cancel`` the handles of an
abandoned run, ``_stop_workers`` and ``_join_workers``. The dummy pool's handles are the items themselves (its
``_wait`` runs the function inline), the thread pool's are futures, the process pool's are sequence numbers of
:class:`~petastorm.pools._process_core.ProcessCore`.

Results are usually dicts of numpy arrays; any other result type that implements :class:`ArrayCarrier` is
accounted for (and moved through shared memory by the process pool) the same way.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from petastorm._checks import check_positive_int
from petastorm.errors import PetastormError

__all__ = [
    'DEFAULT_MAX_BYTES_IN_FLIGHT',
    'STOPPED',
    'ArrayCarrier',
    'InFlightBudget',
    'PoolBase',
    'PoolOptions',
    'RemoteTraceback',
    'SupersededError',
    'WorkerDiedError',
    'WorkerFunctionError',
    'WorkerPool',
    'default_max_bytes_in_flight',
    'result_nbytes',
]

DEFAULT_MAX_BYTES_IN_FLIGHT = 1 << 30
_INITIAL_LIMIT = 2


class WorkerDiedError(PetastormError, RuntimeError):
    """A worker process of a pool exited while the pool was running (killed, crashed or out of memory)."""


class WorkerFunctionError(PetastormError, RuntimeError):
    """The worker function raised an exception that could not be sent back to the consumer as itself.

    The message names the original exception type; the remote traceback is chained as ``__cause__``.
    """


class RemoteTraceback(PetastormError):
    """Carries the formatted traceback of an exception raised in a worker process.

    It is attached as ``__cause__`` of the exception re-raised in the consumer, so the usual traceback printout
    shows where the worker function failed.
    """

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text)
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f'\n\nTraceback of the exception in the worker process:\n{self.traceback_text}'


@runtime_checkable
class WorkerPool(Protocol):
    """A pool of workers that maps a pure function over work items, returning results in submission order.

    Lifecycle: ``start`` once, ``imap`` any number of times (one at a time: a new call supersedes an unfinished
    iterator, whose pending work is cancelled), then ``stop`` and ``join``. Pools are context managers whose
    exit stops and joins them.
    """

    workers_count: int

    def start(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        """Start the workers; ``context`` is handed to every call of ``worker_fn`` (sent once per worker)."""
        ...

    def imap(self, items: Iterable[Any]) -> Iterator[Any]:
        """Yield ``worker_fn(context, item)`` for every item, in order, pulling items lazily."""
        ...

    def stop(self) -> None:
        """Stop starting new work and cancel pending work; idempotent and non-blocking."""
        ...

    def join(self) -> None:
        """Stop (if needed) and block until every thread and process of the pool is gone; idempotent."""
        ...

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Counters describing the pool: kind, workers_count, items_submitted, items_completed, in_flight..."""
        ...


@runtime_checkable
class ArrayCarrier(Protocol):
    """A worker result whose big arrays a process pool may move through shared memory."""

    def carried_arrays(self) -> Mapping[str, np.ndarray]:
        """The result's arrays by name, in a stable order (what the byte budget counts)."""
        ...

    def with_carried_arrays(self, arrays: Mapping[str, np.ndarray]) -> ArrayCarrier:
        """A copy of the result whose ``carried_arrays()`` are ``arrays`` (the same keys, in the same order)."""
        ...


class SupersededError(PetastormError, RuntimeError):
    """An ``imap`` iterator was resumed after a later ``imap`` call on the same pool had cancelled its work."""


def result_nbytes(result: Any) -> int:
    """Estimate the memory held by one result.

    Counts the bytes of its arrays, including arrays and strings held in object arrays (estimated from a sample of
    their values), for an ndarray, a dict of them or an :class:`ArrayCarrier` (its ``carried_arrays()``); 0 for
    anything else.
    """
    if isinstance(result, np.ndarray):
        return _array_nbytes(result)
    if isinstance(result, dict):
        arrays: Iterable[Any] = result.values()
    elif isinstance(result, ArrayCarrier):
        arrays = result.carried_arrays().values()
    else:
        return 0
    return sum(_array_nbytes(value) for value in arrays if isinstance(value, np.ndarray))


_SAMPLED_OBJECTS = 32


def _array_nbytes(array: np.ndarray) -> int:
    if not array.dtype.hasobject or not array.size:
        return int(array.nbytes)
    # Variable-shape columns are object arrays of per-row arrays; their pointers are a tiny part of the memory.
    flat = array.reshape(-1)
    step = max(1, len(flat) // _SAMPLED_OBJECTS)
    sample = flat[::step]
    held = sum(int(v.nbytes) if isinstance(v, np.ndarray) else len(v) if isinstance(v, (bytes, str)) else 0
               for v in sample)
    return int(array.nbytes) + held * len(flat) // len(sample)


def default_max_bytes_in_flight() -> int:
    """A reader's default in-flight byte budget: 128 MiB per CPU this process may run on, 256 MiB to 1 GiB.

    More CPUs decode more row groups at once, which needs more of them in flight; small machines keep the
    decoded data of a few row groups only.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(1 << 30, max(256 << 20, cpus * (128 << 20)))


class InFlightBudget:
    """How many items may be in flight (submitted and not yet handed to the consumer).

    The limit is ``max_in_flight``, shrunk so that the estimated memory of the in-flight items stays under
    ``max_bytes_in_flight``. An item's result is estimated by the mean size of the results seen so far, and an
    item a worker is still working on counts twice: its input (the raw columns read) is held until its result
    exists, and is about as big. So with ``workers_count`` workers and results of ``m`` bytes, ``n`` items in
    flight cost about ``(n + min(n, workers_count)) * m``. The limit never goes below 1, so a single result
    bigger than the budget still makes progress. Until the first result is seen the size is unknown, so the
    limit starts at ``initial_limit`` (default 2: a dataset of huge row groups cannot overshoot the budget by a
    whole window of workers, and the first item gets the machine to itself).
    """

    def __init__(self, max_in_flight: int, max_bytes_in_flight: int, initial_limit: int | None = None,
                 workers_count: int | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.max_bytes_in_flight = max_bytes_in_flight
        self.initial_limit = min(max_in_flight, initial_limit or _INITIAL_LIMIT)
        self.workers_count = workers_count or max_in_flight
        self._results_seen = 0
        self._bytes_seen = 0

    def observe(self, result: Any) -> None:
        """Account for one result handed to the consumer."""
        self._results_seen += 1
        self._bytes_seen += result_nbytes(result)

    @property
    def mean_result_bytes(self) -> float:
        """The mean estimated size of the results seen so far (0 before the first)."""
        return self._bytes_seen / self._results_seen if self._results_seen else 0.0

    @property
    def limit(self) -> int:
        """The current in-flight limit."""
        if not self._results_seen:
            return self.initial_limit
        mean = self.mean_result_bytes
        if mean <= 0:
            return self.max_in_flight
        affordable = int(self.max_bytes_in_flight // mean)  # results alone
        # Solve n + min(n, workers) <= affordable for the largest n.
        limit = affordable - self.workers_count if affordable >= 2 * self.workers_count else affordable // 2
        return max(1, min(self.max_in_flight, limit))


class PoolOptions:
    """The validated options shared by every pool kind."""

    def __init__(self, workers_count: int, max_in_flight: int | None, max_bytes_in_flight: int,
                 initial_in_flight: int | None = None) -> None:
        self.workers_count = check_positive_int('workers_count', workers_count)
        if max_in_flight is None:
            max_in_flight = 2 * self.workers_count
        self.max_in_flight = check_positive_int('max_in_flight', max_in_flight)
        self.max_bytes_in_flight = check_positive_int('max_bytes_in_flight', max_bytes_in_flight)
        self.initial_in_flight = None if initial_in_flight is None else \
            check_positive_int('initial_in_flight', initial_in_flight)

    def budget(self) -> InFlightBudget:
        """A fresh in-flight budget for these options."""
        return InFlightBudget(self.max_in_flight, self.max_bytes_in_flight, initial_limit=self.initial_in_flight,
                              workers_count=self.workers_count)


class _Stopped:
    """The type of :data:`STOPPED`."""

    def __repr__(self) -> str:
        return 'STOPPED'


#: What ``_submit`` and ``_wait`` return instead of a handle or a result when the pool was stopped meanwhile.
STOPPED: Any = _Stopped()
_NO_MORE_ITEMS: Any = object()


class PoolBase:
    """The lifecycle, the counters, the superseding rule and the ordered window loop shared by the pool kinds.

    A kind sets ``kind`` and implements the hooks below; the public methods (``start``, ``imap``, ``stop``,
    ``join``, ``diagnostics``) and the loop are written once, here. Handles are whatever the kind needs to find a
    submitted item's result again.

    Args:
        workers_count: the kind's number of workers (as reported by ``diagnostics``).
        budget: the in-flight budget whose ``limit`` bounds the window.
        reports_budget: whether ``diagnostics`` lists the budget (the dummy pool's window is always one item).
    """

    kind = ''

    def __init__(self, workers_count: int, budget: InFlightBudget, *, reports_budget: bool = True) -> None:
        self.workers_count = workers_count
        self._budget = budget
        self._reports_budget = reports_budget
        self._started = False
        self._stopped = False
        # Re-entrant: the finally block of an abandoned imap generator may run during garbage collection anywhere,
        # including inside a section of this pool that holds the lock.
        self._run_lock = threading.RLock()
        self._run_id = 0
        self._pending: deque[Any] = deque()  # handles of the current imap call, oldest first
        self._items_submitted = 0
        self._items_completed = 0

    # ------------------------------------------------------------------------------------------ the kinds' hooks

    def _start_workers(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        raise NotImplementedError

    def _submit(self, item: Any) -> Any:
        """Hand ``item`` to a worker; returns a handle for ``_wait``, or :data:`STOPPED`."""
        raise NotImplementedError

    def _wait(self, handle: Any) -> Any:
        """The result of ``handle``, or :data:`STOPPED` once the pool stops; raises the worker function's error."""
        raise NotImplementedError

    def _cancel(self, handles: list[Any]) -> None:
        """Cancel the queued work of an abandoned run (called with the run lock held)."""
        raise NotImplementedError

    def _stop_workers(self) -> None:
        raise NotImplementedError

    def _join_workers(self) -> None:
        raise NotImplementedError

    def _raise_if_failed(self) -> None:
        """Raise the pool's failure (e.g. a dead worker) if it has one."""

    # ------------------------------------------------------------------------------------------------ the API

    def __enter__(self) -> PoolBase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.join()

    def start(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        """Start the workers; ``context`` is handed to every call of ``worker_fn``.

        Raises:
            RuntimeError: the pool was started or stopped before.
        """
        if self._started or self._stopped:
            raise RuntimeError(f'{self.kind} pool: start() may be called only once')
        self._start_workers(worker_fn, context)
        self._started = True

    def imap(self, items: Iterable[Any]) -> Iterator[Any]:
        """Yield ``worker_fn(context, item)`` for each item in submission order, pulling items lazily.

        A later call cancels the pending work of an unfinished earlier iterator, which raises a RuntimeError
        saying it was superseded if it is resumed.

        Raises:
            RuntimeError: the pool was not started, or was stopped.
            WorkerDiedError: a worker process of the pool died.
        """
        if not self._started:
            raise RuntimeError(f'{self.kind} pool: imap() called before start()')
        self._raise_if_failed()
        if self._stopped:
            raise RuntimeError(f'{self.kind} pool: imap() called on a stopped pool')
        item_iterator = iter(items)
        with self._run_lock:
            if self._pending:
                self._cancel(list(self._pending))
            self._run_id += 1
            run_id = self._run_id
            pending: deque[Any] = deque()
            self._pending = pending
        return self._ordered_window(item_iterator, run_id, pending)

    def stop(self) -> None:
        """Stop starting new work and cancel pending work; idempotent and non-blocking."""
        self._stopped = True
        self._stop_workers()

    def join(self) -> None:
        """Stop the pool and block until every thread and process it started is gone; idempotent."""
        self.stop()
        self._join_workers()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Counters: kind, workers_count, items_submitted, items_completed, in_flight and the budget's state."""
        info: dict[str, Any] = {
            'kind': self.kind,
            'workers_count': self.workers_count,
            'items_submitted': self._items_submitted,
            'items_completed': self._items_completed,
            'in_flight': len(self._pending),
        }
        if self._reports_budget:
            info['max_in_flight'] = self._budget.limit
            info['max_bytes_in_flight'] = self._budget.max_bytes_in_flight
            info['mean_result_bytes'] = self._budget.mean_result_bytes
        return info

    # ------------------------------------------------------------------------------------------------ the loop

    def _check_current(self, run_id: int) -> None:
        # An older iterator resumed after a newer imap call started fails loudly instead of silently interleaving.
        if run_id != self._run_id:
            raise SupersededError(f'{self.kind} pool: this imap iterator was superseded by a later imap call')

    def _fill_window(self, items: Iterator[Any], run_id: int, pending: deque[Any]) -> Any:
        """Submit items until ``budget.limit`` are in flight.

        Returns None then, ``_NO_MORE_ITEMS`` when the items ran out first, ``STOPPED`` when the pool stopped.
        """
        while len(pending) < self._budget.limit:
            item = next(items, _NO_MORE_ITEMS)
            if item is _NO_MORE_ITEMS:
                return _NO_MORE_ITEMS
            with self._run_lock:  # a concurrent imap call cannot slip in between the check and the submit
                self._check_current(run_id)
                handle = self._submit(item)
                if handle is STOPPED:
                    return STOPPED
                pending.append(handle)
                self._items_submitted += 1
            del item
        return None

    def _oldest_result(self, pending: deque[Any], run_id: int) -> Any:
        """The result of the oldest item in flight (waited for), or ``STOPPED``."""
        try:
            return self._wait(pending[0])
        except BaseException:
            # A worker error stops the pool and reaches the caller with the worker's traceback. An iterator
            # superseded meanwhile (SupersededError, or an error of its abandoned work) leaves the pool to
            # the later imap call.
            if run_id == self._run_id:
                self.stop()
            raise

    def _ordered_window(self, items: Iterator[Any], run_id: int, pending: deque[Any]) -> Iterator[Any]:
        """The loop behind ``imap``: keep up to ``budget.limit`` items in flight and yield the oldest result."""
        budget = self._budget
        exhausted = False
        try:
            while True:
                if self._stopped:
                    return
                self._check_current(run_id)
                if not exhausted:
                    filled = self._fill_window(items, run_id, pending)
                    if filled is STOPPED:
                        return
                    exhausted = filled is _NO_MORE_ITEMS
                if not pending:
                    return
                result = self._oldest_result(pending, run_id)
                if result is STOPPED or self._stopped:
                    return
                pending.popleft()
                self._items_completed += 1
                budget.observe(result)
                # Handed over through a list so that this frame keeps no reference while the consumer holds the
                # result: a process pool's shared memory slot is reused as soon as the consumer drops it.
                handoff = [result]
                del result
                yield handoff.pop()
        except WorkerDiedError:
            self.stop()  # raised by _submit: the pool cannot go on without the worker
            raise
        finally:
            # Closing an unfinished iterator must not leave its queued work running for nobody.
            with self._run_lock:
                if pending and run_id == self._run_id and not self._stopped:
                    self._cancel(list(pending))
                pending.clear()
