"""A pool of threads: cheap to start and zero-copy, but pure-Python work is serialized by the GIL."""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from petastorm.pools.base import DEFAULT_MAX_BYTES_IN_FLIGHT, PoolBase, PoolOptions

logger = logging.getLogger(__name__)

THREAD_NAME_PREFIX = 'petastorm-worker'
_STOP_POLL_SECONDS = 0.1


def _shutdown_executor(executor: ThreadPoolExecutor) -> None:
    # Runs from join() or from the finalizer of a pool that was dropped without being joined.
    executor.shutdown(wait=False, cancel_futures=True)
    try:
        executor.shutdown(wait=True)
    except RuntimeError:
        # The finalizer ran in one of the pool's own threads, which cannot join itself; the threads still exit
        # because the executor is shut down.
        logger.debug('thread pool finalized from one of its own threads; not waiting for them')


class ThreadPool(PoolBase):
    """Runs ``worker_fn`` in ``workers_count`` threads named ``petastorm-worker_N``.

    Results come back in submission order. At most ``max_in_flight`` items (default ``2 * workers_count``) are
    submitted ahead of the consumer, fewer when the results seen so far say that so many would hold more than
    ``max_bytes_in_flight`` bytes.
    """

    kind = 'thread'

    def __init__(self, workers_count: int, *, max_in_flight: int | None = None,
                 max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT) -> None:
        super().__init__()
        self._options = PoolOptions(workers_count, max_in_flight, max_bytes_in_flight)
        self.workers_count = self._options.workers_count
        self._budget = self._options.budget()
        self._executor: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None
        self._worker_fn: Callable[[Any, Any], Any] | None = None
        self._context: Any = None
        self._stopped = False
        # The futures of the current imap call, shared with its generator so that a later imap can cancel them.
        self._pending: deque[Future] = deque()
        self._lock = threading.Lock()

    def start(self, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        """Create the threads' executor (threads are started on demand, up to ``workers_count``)."""
        if self._executor is not None or self._stopped:
            raise RuntimeError('thread pool: start() may be called only once')
        self._worker_fn = worker_fn
        self._context = context
        self._executor = ThreadPoolExecutor(max_workers=self.workers_count, thread_name_prefix=THREAD_NAME_PREFIX)
        self._finalizer = weakref.finalize(self, _shutdown_executor, self._executor)

    def imap(self, items: Iterable[Any]) -> Iterator[Any]:
        """Yield ``worker_fn(context, item)`` for each item in order; an unfinished earlier imap is cancelled."""
        if self._executor is None:
            raise RuntimeError('thread pool: imap() called before start()')
        if self._stopped:
            raise RuntimeError('thread pool: imap() called on a stopped pool')
        with self._lock:
            self._cancel_pending()
            self._pending = deque()
            run_id = self._new_run()
        return self._iterate(iter(items), run_id, self._pending)

    def _cancel_pending(self) -> None:
        for future in list(self._pending):
            future.cancel()
        self._pending.clear()

    def _iterate(self, items: Iterator[Any], run_id: int, pending: deque[Future]) -> Iterator[Any]:
        executor = self._executor
        assert executor is not None
        exhausted = False
        try:
            while True:
                if self._stopped:
                    return
                self._check_run(run_id)
                while not exhausted and len(pending) < self._budget.limit:
                    try:
                        item = next(items)
                    except StopIteration:
                        exhausted = True
                        break
                    try:
                        future = executor.submit(self._worker_fn, self._context, item)
                    except RuntimeError:
                        if self._stopped:  # stop() from another thread shut the executor down
                            return
                        raise
                    pending.append(future)
                    self._items_submitted += 1
                if not pending:
                    return
                try:
                    result = self._wait(pending[0])
                except CancelledError:
                    if self._stopped:
                        return
                    raise
                except BaseException:
                    self.stop()
                    raise
                if self._stopped:
                    return
                pending.popleft()
                self._items_completed += 1
                self._budget.observe(result)
                yield result
        finally:
            # Closing an unfinished iterator must not leave its queued work running for nobody.
            for future in pending:
                future.cancel()
            pending.clear()

    def _wait(self, future: Future) -> Any:
        # Short timeouts so that stop() from another thread ends the iteration promptly even while the
        # awaited call is still running.
        while True:
            try:
                return future.result(timeout=_STOP_POLL_SECONDS)
            except FutureTimeoutError:
                if self._stopped:
                    raise CancelledError() from None

    def stop(self) -> None:
        """Cancel queued work and refuse new work; running calls finish in the background."""
        self._stopped = True
        if self._executor is not None:
            # Cancels every queued call, whichever imap iterator it belongs to.
            self._executor.shutdown(wait=False, cancel_futures=True)

    def join(self) -> None:
        """Stop the pool and wait until all its threads have exited."""
        self.stop()
        if self._finalizer is not None:
            self._finalizer()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Counters: kind, workers_count, items_submitted, items_completed, in_flight and the budget."""
        return self._base_diagnostics(len(self._pending), self._budget)
