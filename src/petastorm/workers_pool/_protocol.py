"""The ``ventilate`` / ``get_results`` protocol of Petastorm's pools, written once over three ways to run an item.

A kind supplies how an item runs (:meth:`LegacyPool._submit` returns a handle, :meth:`LegacyPool._wait` the
item's published results or raises its error) and how its workers stop; the base keeps the ventilated items in
order, hands their results out one by one and decides when no result is left.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from petastorm._checks import check_positive_int
from petastorm.workers_pool import EmptyResultError

# How often a consumer waiting for the ventilator to hand in an item looks again (it is also woken by ventilate).
_WAIT_FOR_ITEMS_SECONDS = 0.1


class LegacyPool:
    """Base of the ``petastorm.workers_pool`` pools (see the package docstring for the protocol)."""

    def __init__(self, workers_count: int) -> None:
        self.workers_count = check_positive_int('workers_count', workers_count)
        self._cond = threading.Condition()
        self._pending: deque[Any] = deque()  # handles of the ventilated items not handed out yet, in order
        self._ready: deque[Any] = deque()  # results of the first item, not taken yet
        self._ventilator: Any = None
        self._started = False
        self._stopped = False
        self._ventilated = 0
        self._processed = 0

    # -- what a kind supplies ----------------------------------------------------------------------------------

    def _start_workers(self, worker_class: type, worker_args: Any) -> None:
        raise NotImplementedError

    def _submit(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _wait(self, handle: Any) -> list[Any]:
        raise NotImplementedError

    def _stop_workers(self) -> None:
        """Stop taking items (does not wait)."""

    def _join_workers(self) -> None:
        """Wait until every worker has ended."""

    # -- the protocol ------------------------------------------------------------------------------------------

    def start(self, worker_class: type, worker_args: Any = None, ventilator: Any = None) -> None:
        """Make the workers (``worker_class(worker_id, publish_func, worker_args)``) and start ``ventilator``.

        Raises:
            RuntimeError: the pool was started before (a pool cannot be reused).
        """
        if self._started or self._stopped:
            raise RuntimeError(f'{type(self).__name__}({self.workers_count}) cannot be reused! start() was called '
                               f'before; make a new pool')
        self._started = True
        self._start_workers(worker_class, worker_args)
        if ventilator is not None:
            self._ventilator = ventilator
            ventilator.start()

    def ventilate(self, *args: Any, **kwargs: Any) -> None:
        """Hand one item to the workers: ``worker.process(*args, **kwargs)``."""
        if not self._started:
            raise RuntimeError(f'{type(self).__name__}: ventilate() before start()')
        handle = self._submit(args, kwargs)
        with self._cond:
            self._pending.append(handle)
            self._ventilated += 1
            self._cond.notify_all()

    def get_results(self) -> Any:
        """The next published result, in the order of the items ventilated.

        Raises:
            EmptyResultError: every item ventilated so far is done and its results were taken, and the ventilator
                (if any) has completed.
            Exception: what a worker raised (the pool is stopped and joined first).
        """
        while True:
            if self._ready:
                return self._ready.popleft()
            # Asked before looking at the items: once completed, every item it ventilated is in _pending.
            ventilator_done = self._ventilator is None or self._ventilator.completed()
            with self._cond:
                if not self._pending:
                    if ventilator_done or self._stopped:
                        raise EmptyResultError()
                    self._cond.wait(_WAIT_FOR_ITEMS_SECONDS)
                    continue
                handle = self._pending[0]
            try:
                results = self._wait(handle)
            except BaseException:
                self.stop()
                self.join()
                raise
            with self._cond:
                self._pending.popleft()
                self._processed += 1
            if self._ventilator is not None:
                self._ventilator.processed_item()
            self._ready.extend(results)

    def stop(self) -> None:
        """Stop the ventilator and the workers (does not wait)."""
        if self._ventilator is not None:
            self._ventilator.stop()
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._stop_workers()

    def join(self) -> None:
        """Wait until every worker has ended (call after :meth:`stop`)."""
        self._join_workers()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Items ventilated (``items_consumed``), done (``items_produced``) and in between, and results waiting."""
        with self._cond:
            return {'items_consumed': self._ventilated, 'items_produced': self._processed,
                    'items_inprocess': self._ventilated - self._processed, 'output_queue_size': len(self._ready)}

    def __enter__(self) -> LegacyPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
        self.join()


def collecting_worker(worker_class: type, worker_id: int, worker_args: Any) -> tuple[Any, Callable[[], list[Any]]]:
    """A worker whose ``publish_func`` collects results, and a function taking the results collected so far."""
    collected: list[Any] = []

    def take() -> list[Any]:
        results = collected[:]
        collected.clear()
        return results

    return worker_class(worker_id, collected.append, worker_args), take
