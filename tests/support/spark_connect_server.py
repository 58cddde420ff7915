"""A real Spark Connect server on loopback for the tests, in a process of its own.

``SparkSession.builder.remote('local[2]')`` would start the server inside the test process, which already holds
the classic session of the other Spark tests (pyspark allows one SparkContext per process). So the server runs as
``python tests/support/spark_connect_server.py``: a classic local[2] session with the Spark Connect plugin of the
installed pyspark, listening on a free loopback port. It prints ``ready <port>`` once clients can connect, and stops
(Spark first) when its stdin closes, so it also goes away when the test process dies.

:func:`running_connect_server` starts one, yields its ``sc://`` URL and stops it; a server that does not come up
raises with the reason and the end of its log, so the tests using it fail rather than skip.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

_START_TIMEOUT_SECS = 180
_STOP_TIMEOUT_SECS = 60

@dataclass
class ConnectServer:
    """A running server: its ``sc://`` URL and its process (the JVM is a child of it)."""

    url: str
    process: subprocess.Popen
    log_path: pathlib.Path


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def _log_tail(log_path: pathlib.Path, lines: int = 30) -> str:
    try:
        return '\n'.join(log_path.read_text(errors='replace').splitlines()[-lines:])
    except OSError as err:
        return f'(no log: {err})'


@contextlib.contextmanager
def running_connect_server(work_dir: pathlib.Path, jvm_options: str = '') -> Iterator[ConnectServer]:
    """Start a Spark Connect server on loopback, yield it, and stop it (its JVM and Python workers with it).

    Raises:
        RuntimeError: the server exited or did not listen within the start timeout (the message holds its log).
    """
    from support.spark_settings import LOG4J2_PROPERTIES  # the errors-only logging of the other Spark tests

    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / 'connect-server.log'
    log4j = work_dir / 'log4j2.properties'
    log4j.write_text(LOG4J2_PROPERTIES)
    environment = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                       SPARK_LOCAL_IP='127.0.0.1')
    for key in ('SPARK_REMOTE', 'SPARK_CONNECT_MODE_ENABLED'):
        environment.pop(key, None)
    command = [sys.executable, __file__, str(_free_loopback_port()),
               f'{jvm_options} -Dlog4j2.configurationFile=file:{log4j}'.strip()]
    with log_path.open('wb') as log:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                   env=environment, cwd=work_dir, start_new_session=True)
    try:
        url = _wait_ready(process, log_path)
        yield ConnectServer(url, process, log_path)
    finally:
        _stop(process)


def _wait_ready(process: subprocess.Popen, log_path: pathlib.Path) -> str:
    deadline = time.monotonic() + _START_TIMEOUT_SECS
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    pending = b''
    while time.monotonic() < deadline:
        chunk = process.stdout.read()
        if chunk:
            pending += chunk
            for line in pending.decode(errors='replace').splitlines():
                if line.startswith('ready '):
                    return f'sc://127.0.0.1:{int(line.split()[1])}'
        if process.poll() is not None:
            raise RuntimeError(f'the Spark Connect server exited with code {process.returncode} before listening; '
                               f'its log ends with:\n{_log_tail(log_path)}')
        time.sleep(0.2)
    raise RuntimeError(f'the Spark Connect server did not listen within {_START_TIMEOUT_SECS} s; its log ends '
                       f'with:\n{_log_tail(log_path)}')


def _stop(process: subprocess.Popen) -> None:
    """Close the server's stdin (it stops Spark and exits); kill its process group if it does not."""
    with contextlib.suppress(OSError):
        assert process.stdin is not None
        process.stdin.close()
    try:
        process.wait(timeout=_STOP_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        process.wait(timeout=10)
    # The JVM and the Python workers are in the server's process group: none may outlive it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 0)
        time.sleep(2)  # the JVM notices its parent's exit through its stdin; give it a moment
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
    if process.stdout is not None:
        process.stdout.close()


def _serve(port: int, java_options: str) -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master('local[2]').appName('petastorm-connect-tests')
             .config('spark.plugins', 'org.apache.spark.sql.connect.SparkConnectPlugin')
             .config('spark.connect.grpc.binding.address', '127.0.0.1')
             .config('spark.connect.grpc.binding.port', str(port))
             .config('spark.connect.grpc.port.maxRetries', '0')
             .config('spark.connect.progress.reportInterval', '200ms')  # progress reports even for short jobs
             .config('spark.driver.host', '127.0.0.1').config('spark.driver.bindAddress', '127.0.0.1')
             .config('spark.driver.memory', '1g').config('spark.driver.extraJavaOptions', java_options)
             .config('spark.ui.enabled', 'false').config('spark.ui.showConsoleProgress', 'false')
             .config('spark.sql.shuffle.partitions', '2').config('spark.default.parallelism', '2')
             .config('spark.sql.session.timeZone', 'UTC').config('spark.python.worker.reuse', 'true')
             .getOrCreate())
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=30):
            pass  # the plugin is listening
        sys.stdout.write(f'ready {port}\n')
        sys.stdout.flush()
        sys.stdin.read()  # until the test process closes the pipe (or dies)
    finally:
        spark.stop()


if __name__ == '__main__':
    _serve(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else '')
