"""The reference pool: the worker function runs inline in the consumer's thread, one item at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from petastorm._checks import check_positive_int
from petastorm.pools.base import InFlightBudget, PoolBase

__all__ = ['DummyPool']


class DummyPool(PoolBase):
    """Runs ``worker_fn`` inside ``imap`` in the calling thread; no threads or processes are started.

    It defines the expected output of the other pools and is the easiest one to debug (breakpoints and
    profilers see the worker function directly). ``workers_count`` is always 1. It runs the same ordered window
    loop as the other kinds with a window of one item: the item is pulled when the consumer asks for the next
    result, and the function runs while the consumer waits for it. ``stop`` (from any thread) makes every running
    ``imap`` iterator end before its next item.

    Args:
        workers_count: accepted for symmetry with the other kinds (must be a positive int) and ignored.
        max_in_flight: ignored: exactly one item is in flight.
        max_bytes_in_flight: ignored.
        initial_in_flight: ignored.
    """

    kind = 'dummy'

    def __init__(self, workers_count: int = 1, *, max_in_flight: int | None = None,
                 max_bytes_in_flight: int = 1 << 30, initial_in_flight: int | None = None) -> None:
        check_positive_int('workers_count', workers_count)
        for name, value in (('max_in_flight', max_in_flight), ('initial_in_flight', initial_in_flight)):
            if value is not None:
                check_positive_int(name, value)
        check_positive_int('max_bytes_in_flight', max_bytes_in_flight)
        super().__init__(1, InFlightBudget(1, max_bytes_in_flight, initial_limit=1, workers_count=1),
                         reports_budget=False)
        self._worker_fn: Callable[[Any, Any], Any] | None = None
        self._context: Any = None

    def _start_workers(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        self._worker_fn = worker_fn
        self._context = context

    def _submit(self, item: Any) -> Any:
        return item  # the work happens in _wait, when the consumer asks for the result

    def _wait(self, handle: Any) -> Any:
        if self._worker_fn is None:  # not reachable: imap checks that the pool was started
            raise RuntimeError('dummy pool: imap() called before start()')
        return self._worker_fn(self._context, handle)

    def _cancel(self, handles: list[Any]) -> None:
        pass  # nothing runs ahead of the consumer

    def _stop_workers(self) -> None:
        pass

    def _join_workers(self) -> None:
        pass
