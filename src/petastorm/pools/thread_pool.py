"""A pool of threads: cheap to start and zero-copy, but pure-Python work is serialized by the GIL."""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from petastorm.pools.base import (
    DEFAULT_MAX_BYTES_IN_FLIGHT,
    STOPPED,
    PoolBase,
    PoolOptions,
    SupersededError,
)

__all__ = ['THREAD_NAME_PREFIX', 'ThreadPool']

logger = logging.getLogger(__name__)

THREAD_NAME_PREFIX = 'petastorm-worker'
_STOP_POLL_SECONDS = 0.1


def _stop_executor(executor: ThreadPoolExecutor) -> None:
    """Cancel the queued calls and let the threads end; never blocks.

    Also the finalizer of a pool dropped without being joined, which runs wherever the garbage collector does:
    inside ``threading``'s own bookkeeping too, holding a lock that joining a thread takes (a join there hangs the
    process), so only :meth:`ThreadPool.join` waits for the threads.
    """
    executor.shutdown(wait=False, cancel_futures=True)


class ThreadPool(PoolBase):
    """Runs ``worker_fn`` in ``workers_count`` threads named ``petastorm-worker_N``.

    Results come back in submission order. At most ``max_in_flight`` items (default ``2 * workers_count``) are
    submitted ahead of the consumer, fewer when the results seen so far say that so many would hold more than
    ``max_bytes_in_flight`` bytes. ``stop`` cancels queued calls and refuses new ones; calls already running
    finish in the background, and ``join`` waits for them.
    """

    kind = 'thread'

    def __init__(self, workers_count: int, *, max_in_flight: int | None = None,
                 max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT, initial_in_flight: int | None = None) -> None:
        options = PoolOptions(workers_count, max_in_flight, max_bytes_in_flight, initial_in_flight)
        super().__init__(options.workers_count, options.budget())
        self._executor: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None
        self._call: Callable[[Any], Any] | None = None

    def _start_workers(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        # Threads are started on demand, up to workers_count.
        self._executor = executor = ThreadPoolExecutor(max_workers=self.workers_count,
                                                       thread_name_prefix=THREAD_NAME_PREFIX)
        self._call = functools.partial(worker_fn, context)
        self._finalizer = weakref.finalize(self, _stop_executor, executor)

    def _submit(self, item: Any) -> Any:
        if self._executor is None or self._call is None:  # not reachable: imap checks that the pool was started
            raise RuntimeError('thread pool: imap() called before start()')
        try:
            return self._executor.submit(self._call, item)
        except RuntimeError:
            if self._stopped:  # stop() from another thread shut the executor down
                return STOPPED
            raise

    def _wait(self, handle: Future) -> Any:
        # Short waits so that stop() from another thread ends the iteration promptly even while the awaited call
        # is still running. exception() returns (does not raise) what the call raised, so a worker function that
        # raises TimeoutError is not taken for a wait that timed out, as future.result(timeout=...) would; and it
        # waits on the future's own condition, cheaper per item than concurrent.futures.wait().
        try:
            while True:
                try:
                    handle.exception(timeout=_STOP_POLL_SECONDS)
                    break
                except FutureTimeoutError:
                    if self._stopped:
                        return STOPPED
            return handle.result()
        except CancelledError:
            if self._stopped:
                return STOPPED
            raise SupersededError('thread pool: this imap iterator was superseded by a later imap call') from None

    def _cancel(self, handles: list[Any]) -> None:
        for future in handles:
            future.cancel()

    def _stop_workers(self) -> None:
        if self._executor is not None:
            # Cancels every queued call, whichever imap iterator it belongs to.
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _join_workers(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        if self._executor is not None:
            try:
                self._executor.shutdown(wait=True)
            except RuntimeError:
                # Joined from one of the pool's own threads, which cannot join itself; the threads still end
                # because the executor is shut down.
                logger.debug('thread pool joined from one of its own threads; not waiting for them')
