"""The reference pool: the worker function runs inline in the consumer's thread, one item at a time."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from petastorm.pools.base import PoolBase, check_positive_int

logger = logging.getLogger(__name__)


class DummyPool(PoolBase):
    """Runs ``worker_fn`` inside ``imap`` in the calling thread; no threads or processes are started.

    It defines the expected output of the other pools and is the easiest one to debug (breakpoints and
    profilers see the worker function directly). ``workers_count`` is always 1.

    Args:
        workers_count: accepted for symmetry with the other kinds (must be a positive int) and ignored.
        max_in_flight: ignored: exactly one item is in flight.
        max_bytes_in_flight: ignored.
    """

    kind = 'dummy'

    def __init__(self, workers_count: int = 1, *, max_in_flight: int | None = None,
                 max_bytes_in_flight: int = 1 << 30) -> None:
        super().__init__()
        check_positive_int('workers_count', workers_count)
        if max_in_flight is not None:
            check_positive_int('max_in_flight', max_in_flight)
        check_positive_int('max_bytes_in_flight', max_bytes_in_flight)
        self.workers_count = 1
        self._worker_fn: Callable[[Any, Any], Any] | None = None
        self._context: Any = None
        self._stopped = False
        self._in_flight = 0

    def start(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        """Remember the worker function and its context."""
        if self._worker_fn is not None or self._stopped:
            raise RuntimeError('dummy pool: start() may be called only once')
        self._worker_fn = worker_fn
        self._context = context

    def imap(self, items: Iterable[Any]) -> Iterator[Any]:
        """Yield ``worker_fn(context, item)`` for each item, computing each one when the consumer asks for it."""
        if self._worker_fn is None:
            raise RuntimeError('dummy pool: imap() called before start()')
        if self._stopped:
            raise RuntimeError('dummy pool: imap() called on a stopped pool')
        return self._iterate(iter(items), self._new_run())

    def _iterate(self, items: Iterator[Any], run_id: int) -> Iterator[Any]:
        worker_fn = self._worker_fn
        assert worker_fn is not None
        while True:
            if self._stopped:
                return
            self._check_run(run_id)
            try:
                item = next(items)
            except StopIteration:
                return
            self._items_submitted += 1
            self._in_flight = 1
            try:
                result = worker_fn(self._context, item)
            except BaseException:
                self.stop()
                raise
            finally:
                self._in_flight = 0
            self._items_completed += 1
            yield result

    def stop(self) -> None:
        """Make every running imap iterator end before its next item."""
        self._stopped = True

    def join(self) -> None:
        """Stop the pool; there is nothing to wait for."""
        self.stop()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Counters: kind, workers_count, items_submitted, items_completed, in_flight."""
        return self._base_diagnostics(self._in_flight, None)
