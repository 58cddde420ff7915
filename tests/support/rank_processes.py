"""Processes started as ``torchrun`` starts the ranks of a job on one node (loopback rendezvous, a free port)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


#: What a rank prints when the rendezvous port it was given was taken by another process in the meantime (the
#: port is found free, then bound by the ranks: on a busy machine something else may bind it in between).
_PORT_TAKEN = ('Address already in use', 'EADDRINUSE', 'address already in use')


def run_ranks(script: str, args: list[str], world: int, timeout: float = 240, tries: int = 3) -> list[str]:
    """Run ``script`` in ``world`` processes with torchrun's environment; their outputs, or a failure naming them.

    A run whose rendezvous port was taken before the ranks bound it is run again on another port (``tries`` runs
    at most); any other failure is reported at once.

    Raises:
        AssertionError: a process failed (its output's end is in the message).
    """
    for _ in range(tries - 1):
        codes, outputs = _run_once(script, args, world, timeout)
        if codes == [0] * world or not any(text in output for output in outputs for text in _PORT_TAKEN):
            break
    else:
        codes, outputs = _run_once(script, args, world, timeout)
    assert codes == [0] * world, '\n'.join(o[-3000:] for o in outputs)
    return outputs


def _run_once(script: str, args: list[str], world: int, timeout: float) -> tuple[list[int | None], list[str]]:
    port = free_port()
    processes = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), NODE_RANK='0',
                   MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), OMP_NUM_THREADS='1',
                   PYTHONPATH=os.pathsep.join(sys.path))
        processes.append(subprocess.Popen([sys.executable, script, *args], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0].decode(errors='replace'))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [p.returncode for p in processes], outputs
