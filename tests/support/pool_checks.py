"""What the pool tests share: finding shared memory, child processes and threads left behind, and started pools."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import psutil
import pytest

from petastorm.pools import WorkerPool, make_pool
from petastorm.pools._transport import process_block_prefix

SHM_DIR = '/dev/shm'
needs_dev_shm = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason='needs /dev/shm')


def shm_entries(pid: int | None = None) -> set[str]:
    """The slot names of the pools of process ``pid`` (default: this one).

    Other programs, and process pools of other processes (tests run at the same time), come and go in /dev/shm.
    """
    if not os.path.isdir(SHM_DIR):
        return set()
    start = process_block_prefix(pid)
    return {name for name in os.listdir(SHM_DIR) if name.startswith(start)}


def child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)
            if child.status() != psutil.STATUS_ZOMBIE}


def make_leak_check():
    """A function asserting that no thread, child process or shared memory name appeared since this call."""
    threads_before = set(threading.enumerate())
    children_before = child_pids()
    shm_before = shm_entries()

    def assert_clean() -> None:
        deadline = time.monotonic() + 3.0
        while True:
            extra_threads = set(threading.enumerate()) - threads_before
            extra_children = child_pids() - children_before
            extra_shm = shm_entries() - shm_before
            if not (extra_threads or extra_children or extra_shm) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not extra_threads
        assert not extra_children
        assert not extra_shm

    return assert_clean


def started_pool(kind: str, workers: int, fn, ctx, **options) -> WorkerPool:
    pool = make_pool(kind, workers, **options)
    pool.start(fn, ctx)
    return pool


def assert_same_result(actual, expected) -> None:
    """``actual`` is ``expected``: the same types, keys, dtypes, shapes and values, all the way down."""
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_result(actual[key], expected[key])
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        if expected.dtype.hasobject:
            assert actual.tolist() == expected.tolist()
        else:
            assert np.array_equal(actual, expected)
    else:
        assert actual == expected
