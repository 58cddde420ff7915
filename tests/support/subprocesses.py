"""The servers the tests and benchmarks start as child processes: each stopped, and waited for."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """Ask ``process`` to stop, kill it after ``timeout`` seconds, and wait for it (nothing if it has exited)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
