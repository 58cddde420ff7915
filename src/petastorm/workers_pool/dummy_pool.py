"""Keeps Petastorm's ``petastorm.workers_pool.dummy_pool``: a pool that works in the caller of ``get_results``."""

from __future__ import annotations

from typing import Any

from petastorm.workers_pool._protocol import LegacyPool, collecting_worker

__all__ = ['DummyPool']


class DummyPool(LegacyPool):
    """One worker, run inside ``get_results`` in the calling thread (profilers and debuggers see it directly).

    As ``reader_pool=`` of the legacy ``Reader(...)`` construction: ``reader_pool_type='dummy'``.

    Args:
        workers: accepted as the other pools' ``workers_count`` and ignored (``workers_count`` is 1).
    """

    kind = 'dummy'

    def __init__(self, workers: Any = None) -> None:
        super().__init__(1)
        self._worker: Any = None
        self._take: Any = None

    def _start_workers(self, worker_class: type, worker_args: Any) -> None:
        self._worker, self._take = collecting_worker(worker_class, 0, worker_args)

    def _submit(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        return args, kwargs  # run when get_results reaches it

    def _wait(self, handle: Any) -> list[Any]:
        args, kwargs = handle
        self._worker.process(*args, **kwargs)
        return self._take()

    def _join_workers(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None
