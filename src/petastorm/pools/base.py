"""What every worker pool shares: the protocol, the exceptions and the in-flight budget.

A pool runs one pure function ``worker_fn(context, item) -> result`` over a stream of work items and hands the
results back **in submission order**, so that a seeded reader produces the same sequence whatever the pool kind
and the number of workers. At most a bounded number of items is pulled from the item stream ahead of the
consumer; the bound shrinks when results are big (see :class:`InFlightBudget`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from petastorm.errors import PetastormError

DEFAULT_MAX_BYTES_IN_FLIGHT = 1 << 30
_INITIAL_LIMIT = 2


class WorkerDiedError(PetastormError, RuntimeError):
    """A worker process of a pool exited while the pool was running (killed, crashed or out of memory)."""


class WorkerFunctionError(PetastormError, RuntimeError):
    """The worker function raised an exception that could not be sent back to the consumer as itself.

    The message names the original exception type; the remote traceback is chained as ``__cause__``.
    """


class RemoteTraceback(Exception):
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


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is a positive int (bools are refused), else raise a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return int(value)


def result_nbytes(result: Any) -> int:
    """Estimate the memory held by one result: the bytes of its arrays, including arrays and strings held in
    object arrays (estimated from a sample of their values), for an ndarray or a dict of them (0 otherwise)."""
    if isinstance(result, np.ndarray):
        return _array_nbytes(result)
    if isinstance(result, dict):
        return sum(_array_nbytes(value) for value in result.values() if isinstance(value, np.ndarray))
    return 0


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

    def __init__(self, workers_count: int, max_in_flight: int | None, max_bytes_in_flight: int) -> None:
        self.workers_count = check_positive_int('workers_count', workers_count)
        if max_in_flight is None:
            max_in_flight = 2 * self.workers_count
        self.max_in_flight = check_positive_int('max_in_flight', max_in_flight)
        self.max_bytes_in_flight = check_positive_int('max_bytes_in_flight', max_bytes_in_flight)

    def budget(self) -> InFlightBudget:
        """A fresh in-flight budget for these options."""
        return InFlightBudget(self.max_in_flight, self.max_bytes_in_flight, workers_count=self.workers_count)


class PoolBase:
    """Context-manager plumbing and the superseding rule shared by the pool classes.

    Subclasses provide ``stop``, ``join`` and set ``kind``.
    """

    kind = ''

    def __init__(self) -> None:
        self._run_id = 0
        self._items_submitted = 0
        self._items_completed = 0

    def __enter__(self) -> PoolBase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.join()

    def stop(self) -> None:  # pragma: no cover - always overridden
        raise NotImplementedError

    def join(self) -> None:  # pragma: no cover - always overridden
        raise NotImplementedError

    def _new_run(self) -> int:
        # Each imap call gets a run id; an older iterator resumed after a newer imap call started fails loudly
        # instead of silently interleaving with it.
        self._run_id += 1
        return self._run_id

    def _check_run(self, run_id: int) -> None:
        if run_id != self._run_id:
            raise RuntimeError(f'{self.kind} pool: this imap iterator was superseded by a later imap call')

    def _base_diagnostics(self, in_flight: int, budget: InFlightBudget | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            'kind': self.kind,
            'workers_count': getattr(self, 'workers_count', 0),
            'items_submitted': self._items_submitted,
            'items_completed': self._items_completed,
            'in_flight': in_flight,
        }
        if budget is not None:
            info['max_in_flight'] = budget.limit
            info['max_bytes_in_flight'] = budget.max_bytes_in_flight
            info['mean_result_bytes'] = budget.mean_result_bytes
        return info
