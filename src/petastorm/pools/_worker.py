"""The main function of a worker process of :class:`~petastorm.pools.process_pool.ProcessPool`.

The process is started by :func:`petastorm.pools._launch.launch_worker`; its first message is a
:class:`~petastorm.pools._launch.WorkerSetup`. Then, from the parent (pickled tuples on the task pipe):

* ``('task', seq, item_bytes, releases)``: run the worker function on the pickled item ``seq``; ``releases``
  lists the slots the parent no longer maps, as ``(slot_id, reusable)``;
* ``('release', releases)``: the same releases, sent when no task is coming; destroyed slots are reported;
* ``('cancel', below)``: skip queued items whose ``seq`` is below ``below`` (their imap was abandoned);
* ``('stop',)``: skip everything queued and exit.

Replies (on the result pipe, see :func:`~petastorm.pools._transport.encode_reply`): ok with the packed result,
error with a ``RemoteException``, or cancelled; exactly one per task, so the parent always knows what is still
outstanding. Every reply also lists the slots destroyed since the previous one, and a slots-only reply reports
them after a ``release`` message.

A receiver thread reads the task pipe continuously, so the parent can always send without blocking however big
the result the main thread is writing, and a cancel or stop takes effect while an item is being computed. When
the parent dies (end of file on the task pipe, or a new parent process id) the worker removes the names of its
shared memory slots and exits at once.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from petastorm.pools._launch import WorkerSetup
from petastorm.pools._shm import SlotWriter
from petastorm.pools._transport import (
    REPLY_CANCELLED,
    REPLY_ERROR,
    REPLY_OK,
    REPLY_SLOTS,
    ShmResult,
    encode_exception,
    encode_reply,
    pack_result,
)

logger = logging.getLogger(__name__)

# Exit status of a worker that noticed that its parent is gone.
EXIT_PARENT_GONE = 3
PARENT_POLL_SECONDS = 0.5
_STOP_ALL = sys.maxsize
_REPORT_SLOTS = ('report slots',)  # an inbox entry: the parent waits to hear about destroyed slots


class _Worker:
    """The state of a worker process, shared by its threads (plain attribute writes are atomic)."""

    def __init__(self, setup: WorkerSetup, worker_fn: Callable[[Any, Any], Any], context: Any) -> None:
        self.setup = setup
        self.worker_fn = worker_fn
        self.context = context
        self.slots = SlotWriter(setup.block_prefix, setup.index)
        self.cancel_below = 0

    def parent_gone(self) -> None:
        """Remove the names of this worker's slots and end the process."""
        self.slots.remove_all_and_exit(EXIT_PARENT_GONE)


# glibc's mallopt parameters and the values set in workers (see _keep_freed_memory).
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3
_TOP_PAD_BYTES = 64 << 20
_MMAP_THRESHOLD_BYTES = 32 << 20  # the largest value glibc accepts on 64-bit platforms


def _keep_freed_memory() -> None:
    """Make glibc's allocator keep freed memory for reuse instead of returning it to the kernel at once.

    A worker frees every result right after copying it to shared memory, so by default glibc trims the heap
    after each item and the next item's buffers are fresh pages that the kernel must fault in and zero one by one
    (thousands of page faults per item of tens of MB). In a thread pool the consumer still holds the previous
    result, which prevents the trim; this restores that behaviour for workers. Other C libraries are left alone.
    """
    try:
        if not (os.confstr('CS_GNU_LIBC_VERSION') or '').startswith('glibc'):
            return
    except (AttributeError, ValueError, OSError):  # no confstr, or not a glibc system
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)  # blocks below this come from the (reused) heap
    mallopt(_M_TOP_PAD, _TOP_PAD_BYTES)  # grow the heap in big steps and keep this much free when trimming


def main(argv: list[str]) -> None:
    """Entry point of a worker process: ``argv`` holds the task, result and sentinel file descriptors."""
    _keep_freed_memory()
    task_fd, result_fd, sentinel_fd = (int(arg) for arg in argv)
    for fd in (task_fd, result_fd, sentinel_fd):
        # The sentinel stays open until the process ends; none of the pipes leaks into processes it starts.
        os.set_inheritable(fd, False)
    task_conn = Connection(task_fd, writable=False)
    result_conn = Connection(result_fd, readable=False)
    try:
        setup = pickle.loads(task_conn.recv_bytes())
    except (EOFError, OSError):
        os._exit(EXIT_PARENT_GONE)
    if not isinstance(setup, WorkerSetup):
        os._exit(0)  # the pool failed to start and stopped before sending the setup
    if os.getppid() != setup.parent_pid:
        os._exit(EXIT_PARENT_GONE)  # the pool's process died before this worker got going
    try:
        worker_fn, context = pickle.loads(setup.function_and_context)
    except BaseException:
        logger.critical('petastorm worker %d: could not unpickle the worker function and its context (the function '
                        'must be importable by name in a fresh interpreter)', setup.index)
        raise
    run_worker(_Worker(setup, worker_fn, context), task_conn, result_conn)


def run_worker(worker: _Worker, task_conn: Connection, result_conn: Connection) -> None:
    """Serve tasks until told to stop; exit at once if the parent process goes away."""
    threading.Thread(target=_watch_parent, args=(worker,), name='petastorm-parent-watch', daemon=True).start()
    inbox: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(worker, task_conn, inbox), name='petastorm-task-receiver',
                     daemon=True).start()
    try:
        _serve(worker, inbox, result_conn)
    finally:
        worker.slots.remove_all()
        result_conn.close()


def _watch_parent(worker: _Worker) -> None:
    # A parent killed by SIGKILL cannot tell its workers; once it is gone the worker is re-parented, and
    # polling notices that even when a forked grandchild keeps the task pipe open.
    while True:
        time.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != worker.setup.parent_pid:
            worker.parent_gone()


def _receive(worker: _Worker, task_conn: Connection, inbox: queue.SimpleQueue) -> None:
    while True:
        try:
            message = pickle.loads(task_conn.recv_bytes())
        except (EOFError, OSError):
            # The parent closes the task pipe only after sending 'stop'; end of file without it means it died.
            worker.parent_gone()
        kind = message[0]
        if kind == 'task':
            if message[3]:
                worker.slots.release(message[3])
            inbox.put((message[1], message[2]))
        elif kind == 'release':
            worker.slots.release(message[1])
            inbox.put(_REPORT_SLOTS)
        elif kind == 'cancel':
            worker.cancel_below = max(worker.cancel_below, message[1])
        elif kind == 'stop':
            worker.cancel_below = _STOP_ALL
            inbox.put(None)
            return


def _serve(worker: _Worker, inbox: queue.SimpleQueue, result_conn: Connection) -> None:
    while True:
        task = inbox.get()
        if task is None:
            return
        if task is _REPORT_SLOTS:
            if worker.slots.has_destroyed:
                _send(worker, result_conn, encode_reply(REPLY_SLOTS, -1, worker.slots))
            continue
        seq, item_bytes = task
        if seq < worker.cancel_below:
            if worker.cancel_below != _STOP_ALL:
                _send(worker, result_conn, encode_reply(REPLY_CANCELLED, seq, worker.slots))
            continue
        _send(worker, result_conn, _run_one(worker, seq, item_bytes))


def _run_one(worker: _Worker, seq: int, item_bytes: bytes) -> memoryview:
    """Run the worker function on one item and return the encoded reply (never raises for item errors)."""
    slots = worker.slots
    try:
        result = worker.worker_fn(worker.context, pickle.loads(item_bytes))
        payload = pack_result(result, slots)
        del result
    except BaseException as exc:
        return encode_reply(REPLY_ERROR, seq, slots, encode_exception(exc))
    try:
        return encode_reply(REPLY_OK, seq, slots, payload)
    except BaseException as exc:
        if type(payload) is ShmResult:
            slots.release([(payload.slot, True)])
        error = TypeError(f'the result of item {seq} cannot be pickled to the parent process: {exc!r}')
        error.__cause__ = exc
        return encode_reply(REPLY_ERROR, seq, slots, encode_exception(error))


def _send(worker: _Worker, result_conn: Connection, data: memoryview) -> None:
    try:
        result_conn.send_bytes(data)
    except OSError:
        worker.parent_gone()  # broken pipe
