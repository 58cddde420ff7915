"""Starting the worker processes of a process pool as fresh interpreters.

A worker is ``python -c <bootstrap>``: the bootstrap copies the parent's ``sys.path`` and runs
:func:`petastorm.pools._worker.main`. Unlike multiprocessing's ``spawn`` and ``forkserver``, nothing re-imports
the user's ``__main__`` module, so a plain script that creates a process pool without an
``if __name__ == '__main__':`` guard works. And unlike ``fork``, no thread of the parent (Arrow's, the
framework's) leaves a held lock behind in the child.

Each worker gets three pipes, passed as inherited file descriptors: tasks (parent to worker), results (worker to
parent) and a sentinel whose write end the worker never closes, so its read end reaches end of file exactly when
the worker process is gone (however it died).

Why not ``multiprocessing`` with a ``spawn`` or ``forkserver`` start (``benchmarks/pool_bench.py`` measures both
next to this launch): both run the user's ``__main__`` module again in the workers (``forkserver`` preloads it in
its server), so a script without the guard never finishes: a six-line unguarded script that maps over a ``Pool``
of 2 was still running after 60 s, its body re-run 874 times under ``spawn`` and 2,955 times under ``forkserver``,
each child failing with "the current process has finished its bootstrapping phase". At start-up this launch is
as fast as ``spawn`` (1.03x-1.21x in two runs, from creating a pool of 2 workers to its first result, both
running the same worker set-up) and slower only than a ``forkserver`` whose server is already running
(0.84x-0.85x), which skips the imports precisely by forking a server that imported ``__main__``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from petastorm.pools._transport import PICKLE_PROTOCOL

# Ctrl-C reaches the whole process group; the parent decides how to shut its workers down, so the worker
# ignores SIGINT from its very first statement. The arguments are removed from sys.argv, where libraries that
# parse the command line at import time would trip over them.
_BOOTSTRAP = ('import json, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); '
              'args = sys.argv[1:]; del sys.argv[1:]; sys.path[:] = json.loads(args[0]); '
              'from petastorm.pools._worker import main; main(args[1:])')


def _interpreter_flags() -> list[str]:
    # The same -O, -X ... options as the parent, as multiprocessing does for its spawned children.
    flags = getattr(subprocess, '_args_from_interpreter_flags', None)
    return list(flags()) if flags is not None else []


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker receives first on its task pipe."""

    block_prefix: str
    index: int
    parent_pid: int
    # pickle of (worker_fn, context): unpickled once per worker, after sys.path is set up.
    function_and_context: bytes


@dataclass
class WorkerProcess:
    """The parent's handles on one worker process."""

    index: int
    popen: subprocess.Popen
    task_conn: Connection
    result_conn: Connection
    sentinel: int

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.popen.pid

    def send_setup(self, setup: WorkerSetup) -> None:
        """Send the start-up message; a worker that already died is reported later by its sentinel."""
        try:
            self.task_conn.send_bytes(pickle.dumps(setup, protocol=PICKLE_PROTOCOL))
        except OSError:
            pass

    def reap(self, timeout: float = 5.0) -> int | None:
        """Wait for the process to end and return its exit code (negative: the signal that killed it)."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Close the parent's ends of the pipes (idempotent)."""
        self.task_conn.close()
        self.result_conn.close()
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def launch_worker(index: int) -> WorkerProcess:
    """Start worker process ``index``; it waits for its :class:`WorkerSetup` on the task pipe."""
    if not sys.executable:
        raise RuntimeError('process pool: cannot start worker processes (sys.executable is not set)')
    task_read, task_write = os.pipe()
    result_read, result_write = os.pipe()
    sentinel_read, sentinel_write = os.pipe()
    child_fds = (task_read, result_write, sentinel_write)
    argv = [sys.executable, *_interpreter_flags(), '-c', _BOOTSTRAP, json.dumps(sys.path),
            *(str(fd) for fd in child_fds)]
    try:
        popen = subprocess.Popen(argv, pass_fds=child_fds, stdin=subprocess.DEVNULL)
    except BaseException:
        for fd in (task_write, result_read, sentinel_read):
            os.close(fd)
        raise
    finally:
        # The parent keeps only its own ends, so a dead worker shows up as end of file.
        for fd in child_fds:
            os.close(fd)
    return WorkerProcess(index, popen, Connection(task_write, readable=False), Connection(result_read,
                         writable=False), sentinel_read)


def running(workers: list[WorkerProcess]) -> list[WorkerProcess]:
    """The workers whose process has not ended yet."""
    live = [worker for worker in workers if worker.sentinel >= 0]
    ready = set(wait([worker.sentinel for worker in live], timeout=0))
    return [worker for worker in live if worker.sentinel not in ready]
