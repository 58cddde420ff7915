"""Keeps Petastorm's ``petastorm.workers_pool.thread_pool``: a legacy pool of worker threads."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from petastorm._warnings import warn_user
from petastorm.workers_pool._protocol import LegacyPool, collecting_worker

__all__ = ['ThreadPool']


class ThreadPool(LegacyPool):
    """``workers_count`` threads, each with its own worker instance; results in the order items were ventilated.

    As ``reader_pool=`` of the legacy ``Reader(...)`` construction: ``reader_pool_type='thread'`` with this
    ``workers_count`` and ``results_queue_size``.

    Args:
        workers_count: number of threads.
        results_queue_size: kept for the readers (``make_reader(results_queue_size=...)``); the items in flight
            bound the results held here.
        profiling_enabled: accepted; has no effect (profile a :class:`~petastorm.workers_pool.dummy_pool.DummyPool`,
            whose work runs in the calling thread).
        shuffle_rows: kept for the readers; results keep the items' order.
        seed: kept for the readers.
    """

    kind = 'thread'

    def __init__(self, workers_count: int, results_queue_size: int = 50, profiling_enabled: bool = False,
                 shuffle_rows: bool = False, seed: int | None = None) -> None:
        super().__init__(workers_count)
        if profiling_enabled:
            warn_user('ThreadPool(profiling_enabled=True) has no effect; profile a DummyPool instead, whose '
                          'work runs in the thread that calls get_results', UserWarning)
        self._results_queue_size = results_queue_size
        self._shuffle_rows = shuffle_rows
        self._seed = seed
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._ids = itertools.count()
        self._workers: list[Any] = []
        self._workers_lock = threading.Lock()
        self._factory: tuple[type, Any] | None = None

    def _start_workers(self, worker_class: type, worker_args: Any) -> None:
        self._factory = (worker_class, worker_args)
        self._executor = ThreadPoolExecutor(max_workers=self.workers_count,
                                            thread_name_prefix='petastorm-workers-pool')

    def _run(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        own = getattr(self._local, 'worker', None)
        if own is None:  # the first item this thread runs: make its worker
            assert self._factory is not None
            worker_class, worker_args = self._factory
            with self._workers_lock:
                own = collecting_worker(worker_class, next(self._ids), worker_args)
                self._workers.append(own[0])
            self._local.worker = own
        worker, take = own
        worker.process(*args, **kwargs)
        return take()

    def _submit(self, args: tuple, kwargs: dict[str, Any]) -> Future:
        if self._executor is None:
            raise RuntimeError('ThreadPool: ventilate() before start()')
        return self._executor.submit(self._run, args, kwargs)

    def _wait(self, handle: Future) -> list[Any]:
        try:
            return handle.result()
        except CancelledError:
            return []  # cancelled by stop()

    def _stop_workers(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _join_workers(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        with self._workers_lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.shutdown()

    def results_qsize(self) -> int:
        """Results published and not taken yet."""
        return len(self._ready)
