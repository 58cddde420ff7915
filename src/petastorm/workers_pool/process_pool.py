"""Keeps Petastorm's ``petastorm.workers_pool.process_pool``: a legacy pool of worker processes.

The workers are the fresh interpreters of :mod:`petastorm.pools` (no fork, no re-import of ``__main__``, gone
when the parent is); the worker class and its ``worker_args`` travel with cloudpickle, as Petastorm's did with
dill (lambdas and closures are fine), and the published results with the pool's ``serializer``.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from petastorm.pools._posix_shm import missing_reason
from petastorm.pools._process_core import ProcessCore
from petastorm.workers_pool._protocol import LegacyPool, collecting_worker

__all__ = ['ProcessPool']

_JOIN_TIMEOUT_SECONDS = 5.0


class _WorkerSpec:
    """What each worker process receives once: how to make its worker, and the serializer of its results."""

    def __init__(self, worker_class: type, worker_args: Any, serializer: Any) -> None:
        self.worker_class = worker_class
        self.worker_args = worker_args
        self.serializer = serializer
        self.worker: Any = None  # made in the worker process, on its first item
        self.take: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        import cloudpickle

        return _spec_from_bytes, (cloudpickle.dumps((self.worker_class, self.worker_args, self.serializer)),)


def _spec_from_bytes(blob: bytes) -> _WorkerSpec:
    import cloudpickle

    return _WorkerSpec(*cloudpickle.loads(blob))


def _run_item(spec: _WorkerSpec, item: tuple[tuple, dict[str, Any]]) -> list[Any]:
    """Run one ventilated item in a worker process; its published results, serialized."""
    if spec.worker is None:
        spec.worker, spec.take = collecting_worker(spec.worker_class, os.getpid(), spec.worker_args)
    args, kwargs = item
    spec.worker.process(*args, **kwargs)
    return [spec.serializer.serialize(result) for result in spec.take()]


class ProcessPool(LegacyPool):
    """``workers_count`` worker processes, each with its own worker instance (its ``worker_id`` is its pid).

    As ``reader_pool=`` of the legacy ``Reader(...)`` construction: ``reader_pool_type='process'`` with this
    ``workers_count``.

    Args:
        workers_count: number of processes.
        serializer: turns each published result into bytes in the worker and back in the parent
            (``serialize``/``deserialize``); default :class:`~petastorm.reader_impl.pickle_serializer.PickleSerializer`.
        zmq_copy_buffers: accepted; has no effect (results do not travel through ZeroMQ).
    """

    kind = 'process'

    def __init__(self, workers_count: int, serializer: Any = None, zmq_copy_buffers: bool = True) -> None:
        super().__init__(workers_count)
        if serializer is None:
            from petastorm.reader_impl.pickle_serializer import PickleSerializer

            serializer = PickleSerializer()
        self._serializer = serializer
        self._zmq_copy_buffers = zmq_copy_buffers
        self._core: ProcessCore | None = None
        self._finalizer: weakref.finalize | None = None

    def _start_workers(self, worker_class: type, worker_args: Any) -> None:
        missing = missing_reason()
        if missing is not None:
            raise RuntimeError(missing)
        self._core = core = ProcessCore(f'workers_pool.ProcessPool {id(self):#x}', self.workers_count, _run_item,
                                        _WorkerSpec(worker_class, worker_args, self._serializer),
                                        _JOIN_TIMEOUT_SECONDS)
        self._finalizer = weakref.finalize(self, core.shutdown)  # stops the workers of a pool never joined

    def _submit(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        if self._core is None:
            raise RuntimeError('ProcessPool: ventilate() before start()')
        return self._core.submit((args, kwargs))

    def _wait(self, handle: Any) -> list[Any]:
        if handle is None or self._core is None:
            return []  # submitted after stop()
        entry = self._core.wait_result(handle)
        if entry is None:
            return []  # stopped meanwhile
        ok, value = entry
        if not ok:
            raise value
        return [self._serializer.deserialize(result) for result in value]

    def _stop_workers(self) -> None:
        if self._core is not None:
            self._core.stop()

    def _join_workers(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Petastorm's counters (``items_consumed``, ``items_produced``, ``items_inprocess``, ``zmq_copy_buffers``)."""
        return {**super().diagnostics, 'zmq_copy_buffers': self._zmq_copy_buffers}
