"""The machinery behind :class:`~petastorm.pools.process_pool.ProcessPool`.

:class:`ProcessCore` owns the worker processes, their pipes and a collector thread; it never refers to the pool
object, so a pool dropped without ``join`` can be finalized. Its finalizer (:meth:`ProcessCore.release`) only marks
the core as dropped: the garbage collector runs wherever memory is allocated, in a thread that may hold this
core's locks or threading's own, where stopping (sending on a pipe) or joining could hang the process. The
collector sees the mark within its poll interval and stops the workers itself, terminating those still running
after ``join_timeout``; once they have exited it closes their pipes. At interpreter exit a dropped pool's
collector is joined (:meth:`ProcessCore.shutdown` is an exit hook until the core is closed).

Threads of the parent:

* the consumer (inside ``imap``) pickles items and sends each one to the least loaded worker;
* the collector waits on every result pipe and process sentinel; it maps results' shared memory slots (see
  :mod:`petastorm.pools._transport`), files results by sequence number and notices dead workers.

Slots whose results the consumer has dropped are handed back to their worker with its next task (see
:class:`~petastorm.pools._shm_parent.ParentSlots`).

Every item gets a pool-wide sequence number. ``valid_from`` is the first sequence number of the current imap
call (:meth:`ProcessCore.abandon` moves it past every item submitted so far): replies for older items belong to an
abandoned iterator and are dropped (their slots handed back). The ordered window loop itself, and which imap call
is current, belong to :class:`~petastorm.pools.base.PoolBase`; this class only submits, waits and cancels.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from petastorm.pools._launch import WorkerProcess, WorkerSetup, launch_worker, running
from petastorm.pools._posix_shm import unlink_segment
from petastorm.pools._shm import slot_name
from petastorm.pools._shm_parent import ParentSlots
from petastorm.pools._transport import (
    PICKLE_PROTOCOL,
    REPLY_CANCELLED,
    REPLY_OK,
    REPLY_SLOTS,
    ReplyHeader,
    ShmResult,
    decode_exception,
    decode_reply_header,
    decode_reply_payload,
    new_block_prefix,
    unpack_result,
)
from petastorm.pools._worker import EXIT_PARENT_GONE
from petastorm.pools.base import SupersededError, WorkerDiedError

logger = logging.getLogger(__name__)

_NOTHING_VALID = 1 << 62
_COLLECTOR_POLL_SECONDS = 0.5


class ProcessCore:
    """Worker processes, pipes, the collector thread and the bookkeeping they share (see the module doc)."""

    def __init__(self, label: str, workers_count: int, worker_fn: Callable[[Any, Any], Any], context: Any,
                 join_timeout: float) -> None:
        self.label = label
        self.join_timeout = join_timeout
        self.cond = threading.Condition(threading.RLock())  # re-entrant: generator finalizers may run anywhere
        self.block_prefix = new_block_prefix()
        self.workers: list[WorkerProcess] = []
        self.send_locks = [threading.Lock() for _ in range(workers_count)]
        self.load = [0] * workers_count
        self.alive = [True] * workers_count
        self.slots_created = [0] * workers_count  # as last announced by each worker
        self.slots = ParentSlots(workers_count)
        self.outstanding: dict[int, int] = {}  # seq -> index of the worker computing it
        self.done: dict[int, tuple[bool, Any]] = {}  # seq -> (ok, result or exception to raise)
        self.valid_from = 0
        self.next_seq = 0
        self.failure: str | None = None
        self.stopping = False
        self.joined = False
        self._join_lock = threading.Lock()
        #: set by :meth:`release` (a dropped pool's finalizer); the collector then stops and closes the core.
        self.dropped = False
        self._collector_ended = False
        self._closing = threading.Lock()  # taken once, without waiting, by whoever closes the pipes
        self.collector: threading.Thread | None = None
        self._start_processes(workers_count, worker_fn, context)
        atexit.register(self.shutdown)

    def _start_processes(self, workers_count: int, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        # Pickled before any process exists: an unpicklable function or context fails fast.
        function_and_context = pickle.dumps((worker_fn, context), protocol=PICKLE_PROTOCOL)
        started = time.perf_counter()
        try:
            for index in range(workers_count):
                self.workers.append(launch_worker(index))
            # The interpreters boot in parallel; each reads its setup once it is up.
            for worker in self.workers:
                worker.send_setup(WorkerSetup(self.block_prefix, worker.index, os.getpid(), function_and_context))
        except BaseException:
            self.shutdown()
            raise
        logger.debug('%s: started %d workers in %.3f s', self.label, workers_count, time.perf_counter() - started)
        # A daemon thread: non-daemon threads are joined before atexit hooks run, and the finalizer that stops
        # an un-joined pool at interpreter exit is such a hook. join() still joins the collector.
        self.collector = threading.Thread(target=self._collect, name='petastorm-process-pool-collector',
                                          daemon=True)
        self.collector.start()

    # ----------------------------------------------------------------------------------------- consumer side

    def abandon(self) -> None:
        """Cancel every item submitted so far: its imap call was superseded or closed; late replies are dropped."""
        with self.cond:
            if self.stopping:
                return
            self.valid_from = self.next_seq
            self.done.clear()
            busy = bool(self.outstanding)
            below = self.next_seq
        if busy:
            self._broadcast(('cancel', below))

    def submit(self, item: Any) -> int | None:
        """Send ``item`` to the least loaded worker; returns its sequence number, None if the pool stopped."""
        item_bytes = pickle.dumps(item, protocol=PICKLE_PROTOCOL)  # before any bookkeeping: it may fail
        with self.cond:
            self.raise_if_failed()
            if self.stopping:
                return None
            seq = self.next_seq
            self.next_seq += 1
            index = min((i for i in range(len(self.workers)) if self.alive[i]), key=self.load.__getitem__)
            self.load[index] += 1
            self.outstanding[seq] = index
            releases = self.slots.take(index)
        message = pickle.dumps(('task', seq, item_bytes, releases), protocol=PICKLE_PROTOCOL)
        try:
            with self.send_locks[index]:
                self.workers[index].task_conn.send_bytes(message)
        except OSError as exc:
            # The worker is gone; the collector is about to report it with its exit code.
            with self.cond:
                self.cond.wait_for(lambda: self.failure is not None or self.stopping, timeout=5.0)
                self.raise_if_failed()
                if self.stopping:
                    return None
            raise WorkerDiedError(f'{self.label}: could not send work to worker {index}: {exc}') from exc
        return seq

    def wait_result(self, seq: int) -> tuple[bool, Any] | None:
        """Block until the reply for ``seq`` is in; ``None`` if the pool was stopped meanwhile."""
        with self.cond:
            while seq not in self.done:
                self.raise_if_failed()
                if self.stopping:
                    return None
                if seq < self.valid_from:
                    raise SupersededError(f'{self.label}: this imap iterator was superseded by a later imap call')
                self.cond.wait(timeout=1.0)
            return self.done.pop(seq)

    def raise_if_failed(self) -> None:
        """Raise :class:`WorkerDiedError` if a worker died (a new instance each time: tracebacks stay short)."""
        if self.failure is not None:
            raise WorkerDiedError(self.failure)

    def _broadcast(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=PICKLE_PROTOCOL)
        for index, worker in enumerate(self.workers):
            if not self.alive[index]:
                continue
            try:
                with self.send_locks[index]:
                    worker.task_conn.send_bytes(data)
            except OSError:
                pass  # a dead worker is reported by the collector

    # ---------------------------------------------------------------------------------------- collector side

    def _collect(self) -> None:
        try:
            self._collect_until_all_exited()
        except BaseException as exc:
            # Without the collector nothing would wake the consumer: fail the pool loudly instead of hanging.
            logger.exception('%s: result collector failed', self.label)
            with self.cond:
                if self.failure is None:
                    self.failure = f'{self.label}: the result collector failed: {exc!r}'
                self.cond.notify_all()
            self.stop()
        finally:
            # Whichever of this and release() comes second sees the other's mark and closes the core.
            self._collector_ended = True
            if self.dropped:
                self._close_exited()

    def _collect_until_all_exited(self) -> None:
        open_conns = {worker.index: worker.result_conn for worker in self.workers}
        index_of = {conn: index for index, conn in open_conns.items()}
        sentinels = {worker.sentinel: worker.index for worker in self.workers}
        ending: _DroppedEnd | None = None
        while sentinels or open_conns:
            ready = wait([*open_conns.values(), *sentinels], timeout=_COLLECTOR_POLL_SECONDS)
            if self.dropped:
                ending = ending or _DroppedEnd(self, time.monotonic() + self.join_timeout)
                ending.step([self.workers[index] for index in sentinels.values()])
            if not ready:
                self._send_idle_releases()
            for obj in ready:
                if isinstance(obj, Connection):
                    index = index_of[obj]
                    if not self._receive(index):
                        del open_conns[index]
            for obj in ready:
                if not isinstance(obj, Connection) and obj in sentinels:
                    index = sentinels.pop(obj)
                    if index in open_conns:
                        # Replies sent before the exit are still in the pipe.
                        while open_conns[index].poll() and self._receive(index):
                            pass
                        del open_conns[index]
                    self._on_exit(index)
        logger.debug('%s: collector finished', self.label)

    def _receive(self, index: int) -> bool:
        """Handle one reply from worker ``index``; False at end of file."""
        try:
            data = self.workers[index].result_conn.recv_bytes()
        except (EOFError, OSError):
            return False
        header = decode_reply_header(data)
        wanted = self._note_reply(index, header)
        if header.kind in (REPLY_CANCELLED, REPLY_SLOTS):
            return True
        payload, error = self._decoded_payload(data, header)
        del data
        if header.slot >= 0 and (error is not None or not wanted):
            self.slots.release_now(index, header.slot)
        if not wanted:
            return True
        entry = (False, error) if error is not None else self._result_entry(index, header, payload)
        with self.cond:
            if header.seq >= self.valid_from and not self.stopping:
                self.done[header.seq] = entry
                self.cond.notify_all()
        return True

    def _note_reply(self, index: int, header: ReplyHeader) -> bool:
        """Count a reply of worker ``index`` as answered and note its slots; whether its result is still wanted."""
        with self.cond:
            if self.outstanding.pop(header.seq, None) is not None:
                self.load[index] -= 1
            self.slots_created[index] = max(self.slots_created[index], header.slots_created)
            wanted = header.seq >= self.valid_from and not self.stopping
        if header.destroyed:
            self.slots.forget(index, list(header.destroyed))
        return wanted

    def _decoded_payload(self, data: bytes, header: ReplyHeader) -> tuple[Any, BaseException | None]:
        """The reply's payload, or the error that it could not be unpickled in the parent."""
        try:
            return decode_reply_payload(data, header), None
        except BaseException as exc:  # e.g. a class of the result that the parent cannot import
            error = RuntimeError(f'{self.label}: the result of item {header.seq} could not be unpickled in the '
                                 f'parent: {exc!r}')
            error.__cause__ = exc
            return None, error

    def _result_entry(self, index: int, header: ReplyHeader, payload: Any) -> tuple[bool, Any]:
        """``(True, result)`` with its arrays mapped from the worker's slot, or ``(False, exception)``."""
        if header.kind != REPLY_OK:
            return False, decode_exception(payload)
        wrapped: list[bool] = []

        def wrap(shm: ShmResult) -> np.ndarray:
            buffer = self.slots.wrap(index, shm.slot, shm.name, shm.size)
            wrapped.append(True)  # from now on garbage collection releases the slot
            return buffer

        try:
            return True, unpack_result(payload, wrap)
        except BaseException as exc:  # e.g. out of address space
            if header.slot >= 0 and not wrapped:
                self.slots.release_now(index, header.slot, reuse=False)
            return False, exc

    def _send_idle_releases(self) -> None:
        # Releases normally travel with tasks; when none are being sent (the consumer finished an iteration, or
        # holds on to its results for a while) they are sent on their own, so that workers trim their free slots.
        for index, worker in enumerate(self.workers):
            with self.cond:
                if not self.alive[index] or self.stopping:
                    continue
                releases = self.slots.take(index)
            if releases:
                try:
                    with self.send_locks[index]:
                        worker.task_conn.send_bytes(pickle.dumps(('release', releases), protocol=PICKLE_PROTOCOL))
                except OSError:
                    pass  # a dead worker is reported by the collector

    def _on_exit(self, index: int) -> None:
        worker = self.workers[index]
        exitcode = worker.reap()
        with self.cond:
            self.alive[index] = False
            orphans = [seq for seq, owner in self.outstanding.items() if owner == index]
            for seq in orphans:
                del self.outstanding[seq]
            self.load[index] = 0
            if not self.stopping and self.failure is None:
                how = 'noticed that the parent is gone' if exitcode == EXIT_PARENT_GONE else 'died'
                self.failure = (f'{self.label}: worker process {index} (pid {worker.pid}) {how} with exit code '
                                f'{exitcode} while {len(orphans)} item(s) were assigned to it (a negative code is '
                                f'the signal that killed it, e.g. -9 from the out-of-memory killer; see stderr for '
                                f'a traceback)')
                logger.error('%s', self.failure)
            self.cond.notify_all()
        # A worker that dies without noticing cannot remove the names of its slots; mappings stay valid.
        self._unlink_slot_names(index)
        self.slots.forget(index)

    def _unlink_slot_names(self, index: int) -> None:
        # Slot ids are handed out in order; the one after the last announced may exist (created for the item that
        # was in progress).
        for slot_id in range(self.slots_created[index] + 1):
            unlink_segment(slot_name(self.block_prefix, index, slot_id))

    # ------------------------------------------------------------------------------------------- shutdown

    def stop(self) -> None:
        """Cancel everything and ask the workers to exit; does not wait."""
        with self.cond:
            if self.stopping:
                return
            self.stopping = True
            self.valid_from = _NOTHING_VALID
            self.done.clear()
            self.cond.notify_all()
        self._broadcast(('stop',))

    def release(self) -> None:
        """The finalizer of a pool dropped without ``join``: mark the core dropped, and nothing that could wait.

        The collector stops the workers and closes the core (see the module docstring); if it has ended already
        (every worker exited), the pipes are closed here.
        """
        self.dropped = True
        if self._collector_ended:
            self._close_exited()

    def shutdown(self) -> None:
        """Stop, then wait for every worker (terminating laggards after ``join_timeout``) and the collector."""
        if self.dropped:
            # At interpreter exit: the collector is ending the workers of the dropped pool and closes the core.
            if self.collector is not None and threading.current_thread() is not self.collector:
                self.collector.join()
            return
        self.stop()
        if threading.current_thread() is self.collector:
            return  # the collector ends when the workers have, which they do after stop
        with self._join_lock:
            if self.joined:
                return
            self._end_workers()
            if self.collector is not None:
                self.collector.join()
            else:  # start() failed before the collector existed
                for worker in self.workers:
                    worker.reap()
            for worker in self.workers:  # terminated workers could not clean up
                self._unlink_slot_names(worker.index)
                self.slots.forget(worker.index)
            self._close_exited()

    def _close_exited(self) -> None:
        """Close the pipes of the workers, which have all exited; once, by whoever comes first, never waiting."""
        if not self._closing.acquire(blocking=False):
            return
        for worker in self.workers:
            worker.close()
        self.outstanding.clear()
        self.joined = True
        atexit.unregister(self.shutdown)

    def _end_workers(self) -> None:
        """Wait for every worker to exit, terminating (then killing) those still running after ``join_timeout``."""
        # Exit is observed through the sentinels only: reaping is left to the collector.
        if _wait_exited(self.workers, self.join_timeout):
            return
        for worker in running(self.workers):
            logger.warning('%s: worker pid %s did not exit within %.1f s; terminating it', self.label, worker.pid,
                           self.join_timeout)
            worker.popen.terminate()
        if not _wait_exited(self.workers, 2.0):
            for worker in running(self.workers):
                worker.popen.kill()
            _wait_exited(self.workers, None)

    def worker_pids(self) -> list[int]:
        """The process ids of the workers (as started; some may have exited)."""
        return [worker.pid for worker in self.workers] if not self.joined else []

    def workers_alive(self) -> int:
        """How many workers have not exited."""
        with self.cond:
            return sum(self.alive) if not self.joined else 0


class _DroppedEnd:
    """How the collector ends the workers of a dropped pool: stop them, terminate those still running after
    ``join_timeout``, kill those still running two seconds later (as :meth:`ProcessCore.shutdown` does, but
    without waiting: the collector goes on collecting their exits)."""

    def __init__(self, core: ProcessCore, deadline: float) -> None:
        self.core = core
        self.deadline = deadline
        self.terminated = False
        core.stop()

    def step(self, running_workers: list[WorkerProcess]) -> None:
        """Called at each poll with the workers whose exit was not seen yet."""
        now = time.monotonic()
        if not running_workers or now < self.deadline:
            return
        for worker in running_workers:
            if self.terminated:
                worker.popen.kill()
            else:
                logger.warning('%s: worker pid %s did not exit within %.1f s of its pool being dropped; terminating '
                               'it', self.core.label, worker.pid, self.core.join_timeout)
                worker.popen.terminate()
        self.terminated = True
        self.deadline = now + 2.0


def _wait_exited(workers: list[WorkerProcess], timeout: float | None) -> bool:
    """Wait until every worker process has exited (its sentinel is ready); False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        still_running = running(workers)
        if not still_running:
            return True
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        wait([worker.sentinel for worker in still_running], timeout=remaining)
