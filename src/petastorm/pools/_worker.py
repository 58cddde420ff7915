"""The main function of a worker process of :class:`~petastorm.pools.process_pool.ProcessPool`.

Messages from the parent (pickled tuples on the task pipe):

* ``('task', seq, item_bytes)``: run the worker function on the pickled item ``seq``;
* ``('cancel', below)``: skip queued items whose ``seq`` is below ``below`` (their imap was abandoned);
* ``('stop',)``: skip everything queued and exit.

Replies (on the result pipe, see :func:`~petastorm.pools._transport.encode_reply`): ok with the packed result,
error with a ``RemoteException``, or cancelled; exactly one per task, so the parent always knows what is still
outstanding.

A receiver thread reads the task pipe continuously, so the parent can always send without blocking however big
the result the main thread is writing, and a cancel or stop takes effect while an item is being computed.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from petastorm.pools._transport import (
    REPLY_CANCELLED,
    REPLY_ERROR,
    REPLY_OK,
    ShmResult,
    block_name,
    encode_exception,
    encode_reply,
    pack_result,
    unlink_block,
)

logger = logging.getLogger(__name__)

# Exit status of a worker that noticed that its parent is gone.
EXIT_PARENT_GONE = 3
PARENT_POLL_SECONDS = 0.5
_STOP_ALL = sys.maxsize


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker process gets once, at start-up."""

    worker_fn: Callable[[Any, Any], Any]
    context: Any
    block_prefix: str
    index: int
    # The pool's pid when the worker is its direct child (spawn), None when it is not (forkserver).
    parent_pid: int | None


class _Control:
    """State the receiver thread shares with the main thread (plain attribute writes are atomic)."""

    def __init__(self) -> None:
        self.cancel_below = 0


def run_worker(setup: WorkerSetup, task_conn: Connection, result_conn: Connection) -> None:
    """Serve tasks until told to stop; exit at once if the parent process goes away."""
    # Ctrl-C reaches the whole process group; the parent decides how to shut its workers down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_pid = os.getppid()
    if setup.parent_pid is not None and parent_pid != setup.parent_pid:
        os._exit(EXIT_PARENT_GONE)  # the pool's process died before this worker got going
    threading.Thread(target=_watch_parent, args=(parent_pid,), name='petastorm-parent-watch', daemon=True).start()
    inbox: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
    control = _Control()
    threading.Thread(target=_receive, args=(task_conn, inbox, control), name='petastorm-task-receiver',
                     daemon=True).start()
    try:
        _serve(setup, inbox, control, result_conn)
    finally:
        result_conn.close()


def _watch_parent(parent_pid: int) -> None:
    # A parent killed by SIGKILL cannot tell its workers; once it is gone the worker is re-parented, and
    # polling notices that even when a forked grandchild keeps the task pipe open.
    while True:
        time.sleep(PARENT_POLL_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(EXIT_PARENT_GONE)


def _receive(task_conn: Connection, inbox: queue.SimpleQueue, control: _Control) -> None:
    while True:
        try:
            message = pickle.loads(task_conn.recv_bytes())
        except (EOFError, OSError):
            # The parent closes the task pipe only after sending 'stop'; end of file without it means it died.
            os._exit(EXIT_PARENT_GONE)
        kind = message[0]
        if kind == 'task':
            inbox.put((message[1], message[2]))
        elif kind == 'cancel':
            control.cancel_below = max(control.cancel_below, message[1])
        elif kind == 'stop':
            control.cancel_below = _STOP_ALL
            inbox.put(None)
            return


def _serve(setup: WorkerSetup, inbox: queue.SimpleQueue, control: _Control, result_conn: Connection) -> None:
    while True:
        task = inbox.get()
        if task is None:
            return
        seq, item_bytes = task
        if seq < control.cancel_below:
            if control.cancel_below != _STOP_ALL:
                _send(result_conn, encode_reply(REPLY_CANCELLED, seq))
            continue
        _send(result_conn, _run_one(setup, seq, item_bytes))


def _run_one(setup: WorkerSetup, seq: int, item_bytes: bytes) -> memoryview:
    """Run the worker function on one item and return the encoded reply (never raises for item errors)."""
    name = block_name(setup.block_prefix, seq)
    try:
        result = setup.worker_fn(setup.context, pickle.loads(item_bytes))
        payload = pack_result(result, name)
        del result
    except BaseException as exc:
        return encode_reply(REPLY_ERROR, seq, encode_exception(exc))
    try:
        return encode_reply(REPLY_OK, seq, payload)
    except BaseException as exc:
        if type(payload) is ShmResult:
            unlink_block(payload.name)
        error = TypeError(f'the result of item {seq} cannot be pickled to the parent process: {exc!r}')
        error.__cause__ = exc
        return encode_reply(REPLY_ERROR, seq, encode_exception(error))


def _send(result_conn: Connection, data: memoryview) -> None:
    try:
        result_conn.send_bytes(data)
    except OSError:
        # Broken pipe: the parent is gone. Blocks of unsent results are removed by the resource tracker.
        os._exit(EXIT_PARENT_GONE)
