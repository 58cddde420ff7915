"""The fault-injecting proxy of :mod:`support.s3_loopback` in a process of its own, for clients that hold the GIL.

A proxy served by threads of the test process answers only when that process's Python runs. pyarrow's GCS client
sends a request while holding the GIL: ``NativeFile.closed``, which every method of a ``NativeFile`` asks first,
makes ``GcsRandomAccessFile`` start its download of the object, and that property does not release the GIL. An
in-process proxy then cannot answer the request the test is waiting for, and the client waits out its 120 s
download stall timeout. In a child process the proxy answers whatever the test process does.

:class:`FaultProxyProcess` has the interface the tests use of :class:`support.s3_loopback.FaultProxy`
(``endpoint``, ``reset``, ``requests``, ``plan``, a context manager); ``requests`` and ``plan`` are snapshots taken
from the child when asked.
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

from support.s3_loopback import FaultPlan, FaultProxy, Request

#: seconds to wait for the child to listen, and to answer a command.
_START_TIMEOUT = 60.0
_ANSWER_TIMEOUT = 30.0


def _serve(upstream_port: int, connection: Any) -> None:
    """The child: a :class:`FaultProxy`, driven by commands from ``connection`` until ``stop`` or EOF."""
    with FaultProxy(upstream_port) as proxy:
        connection.send(proxy.endpoint)
        while True:
            try:
                command, argument = connection.recv()
            except EOFError:
                return
            if command == 'reset':
                proxy.reset(argument)
                connection.send(None)
            elif command == 'state':
                with proxy._lock:
                    connection.send((list(proxy.requests), proxy.plan))
            else:  # 'stop'
                connection.send(None)
                return


class FaultProxyProcess:
    """A :class:`FaultProxy` in front of ``upstream_port``, served by a child process; stopped and joined on exit."""

    def __init__(self, upstream_port: int) -> None:
        context = multiprocessing.get_context('spawn')  # the test process has threads: no fork
        self._connection, child_end = context.Pipe()
        self._lock = threading.Lock()
        self._process = context.Process(target=_serve, args=(upstream_port, child_end), name='fault-proxy',
                                        daemon=True)
        self._process.start()
        child_end.close()
        try:
            if not self._connection.poll(_START_TIMEOUT):
                raise RuntimeError(f'the fault proxy in front of port {upstream_port} did not start within '
                                   f'{_START_TIMEOUT:.0f} s')
            self.endpoint: str = self._connection.recv()
        except BaseException:
            self._end_process()
            raise

    def _ask(self, command: str, argument: object = None) -> Any:
        with self._lock:
            self._connection.send((command, argument))
            if not self._connection.poll(_ANSWER_TIMEOUT):
                raise RuntimeError(f'the fault proxy process did not answer {command!r} within {_ANSWER_TIMEOUT} s')
            return self._connection.recv()

    def reset(self, plan: FaultPlan | None = None) -> None:
        """Forget the request log and use ``plan`` from now on."""
        self._ask('reset', plan)

    @property
    def requests(self) -> list[Request]:
        """Every request served (or failed on purpose) since the last reset, in order."""
        return self._ask('state')[0]

    @property
    def plan(self) -> FaultPlan | None:
        """The plan in force, with what it injected so far."""
        return self._ask('state')[1]

    def stop(self) -> None:
        if self._process.is_alive():
            try:
                self._ask('stop')
            except (OSError, EOFError, RuntimeError):
                pass
        self._end_process()

    def _end_process(self) -> None:
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()

    def __enter__(self) -> FaultProxyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
