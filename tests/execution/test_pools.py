"""Tests of petastorm.pools: ordering, round-trips, errors, cancellation, bounds and clean shutdown."""

from __future__ import annotations

import gc
import mmap
import threading
import time
import traceback
import weakref

import numpy as np
import pytest

from petastorm.pools import (
    POOL_KINDS,
    DummyPool,
    ProcessPool,
    ThreadPool,
    WorkerFunctionError,
    WorkerPool,
    make_pool,
)
from petastorm.pools.base import ArrayCarrier, result_nbytes
from support.pool_checks import assert_same_result, needs_dev_shm, started_pool

try:  # tests/ on sys.path (rootdir-relative imports, no tests/__init__.py)
    from support import pool_workers as pw
except ImportError:  # tests/ is a package
    from tests.support import pool_workers as pw

# ------------------------------------------------------------------------------------------- construction


def test_kinds_and_classes():
    assert POOL_KINDS == ('dummy', 'thread', 'process')
    classes = {'dummy': DummyPool, 'thread': ThreadPool, 'process': ProcessPool}
    for kind in POOL_KINDS:
        pool = make_pool(kind, 2)
        assert type(pool) is classes[kind]
        assert isinstance(pool, WorkerPool)
        pool.join()  # never started: a no-op


def test_unknown_kind_names_the_valid_ones():
    with pytest.raises(ValueError, match='Unknown reader_pool_type') as excinfo:
        make_pool('gpu', 2)
    assert all(kind in str(excinfo.value) for kind in POOL_KINDS)


@pytest.mark.parametrize('kind', POOL_KINDS)
@pytest.mark.parametrize('count', [0, -1, 1.5, True, '2', None])
def test_workers_count_must_be_positive_int(kind, count):
    with pytest.raises(ValueError, match='workers_count') as excinfo:
        make_pool(kind, count)
    assert repr(count) in str(excinfo.value)


def test_other_options_are_validated():
    with pytest.raises(ValueError, match='max_in_flight'):
        make_pool('thread', 2, max_in_flight=0)
    with pytest.raises(ValueError, match='max_bytes_in_flight'):
        make_pool('process', 2, max_bytes_in_flight=-5)
    with pytest.raises(ValueError, match='fork'):
        ProcessPool(1, start_method='fork')


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_lifecycle_misuse(kind):
    pool = make_pool(kind, 1)
    with pytest.raises(RuntimeError, match='before start'):
        pool.imap([1])
    pool.start(pw.slow_identity, pw.Ctx())
    with pytest.raises(RuntimeError, match='only once'):
        pool.start(pw.slow_identity, pw.Ctx())
    pool.stop()
    pool.stop()
    pool.join()
    pool.join()
    with pytest.raises(RuntimeError, match='stopped'):
        pool.imap([1])


# ---------------------------------------------------------------------------------------------- results


@pytest.mark.parametrize('kind', POOL_KINDS)
@pytest.mark.parametrize('workers', [1, 2, 3, 4])
@pytest.mark.parametrize('count', [0, 1, 100])
def test_results_in_submission_order(kind, workers, count):
    ctx = pw.Ctx(offset=7)
    with started_pool(kind, workers, pw.jittered_square, ctx) as pool:
        results = list(pool.imap(range(count)))
        assert pool.diagnostics['items_completed'] == count
    assert results == [pw.expected_square(ctx, i) for i in range(count)]


@pytest.mark.parametrize('kind', POOL_KINDS)
@pytest.mark.parametrize('fn', [pw.mixed_columns, pw.non_dict_result])
def test_results_round_trip_exactly(kind, fn):
    with started_pool(kind, 2, fn, pw.Ctx()) as pool:
        results = list(pool.imap(range(8)))
    assert len(results) == 8
    for item, result in enumerate(results):
        assert_same_result(result, fn(pw.Ctx(), item))


def _in_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array`` views a process pool's shared memory slot (rather than memory of its own)."""
    exporter = array.base
    return (isinstance(exporter, np.ndarray) and isinstance(exporter.base, memoryview)
            and isinstance(exporter.base.obj, mmap.mmap))


@pytest.mark.parametrize('kind', POOL_KINDS)
@pytest.mark.parametrize('fn', [pw.columns_result, pw.small_columns_result])
def test_array_carrier_results_round_trip(kind, fn, leak_check):
    with started_pool(kind, 2, fn, pw.Ctx()) as pool:
        results = list(pool.imap(range(6)))
    assert len(results) == 6
    for item, result in enumerate(results):
        expected = fn(pw.Ctx(), item)
        assert type(result) is pw.Columns
        assert isinstance(result, ArrayCarrier)
        assert (result.item, result.note) == (expected.item, expected.note)
        assert_same_result(dict(result.carried_arrays()), dict(expected.carried_arrays()))  # key order included
    if kind == 'process' and fn is pw.columns_result:
        columns = results[0].columns
        assert _in_shared_memory(columns['image'])
        assert _in_shared_memory(columns['matrix'])
        assert not _in_shared_memory(columns['objects'])
        assert columns['image'].flags.writeable
    del results
    gc.collect()
    leak_check()


def test_result_nbytes_counts_the_carried_arrays():
    carrier = pw.Columns({'floats': np.zeros(10), 'bytes': np.array([b'abc', b'de'], dtype=object)}, 0, 'x' * 1000)
    assert result_nbytes(carrier) == 80 + 2 * 8 + 5  # the object array's pointers plus the bytes they hold
    assert result_nbytes(dict(carrier.carried_arrays())) == result_nbytes(carrier)
    assert result_nbytes(('not', 'a', 'carrier')) == 0


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_the_iterator_keeps_no_reference_to_a_yielded_result(kind):
    # A process pool reuses a result's shared memory slot as soon as the consumer drops the result.
    with started_pool(kind, 2, pw.columns_result, pw.Ctx()) as pool:
        results = pool.imap(range(10))
        first = weakref.ref(next(results))
        gc.collect()
        assert first() is None
        assert next(results).item == 1


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_rerun_imap_after_a_complete_one(kind):
    ctx = pw.Ctx(offset=1)
    with started_pool(kind, 2, pw.jittered_square, ctx) as pool:
        assert list(pool.imap(range(10))) == [pw.expected_square(ctx, i) for i in range(10)]
        assert list(pool.imap(range(20, 25))) == [pw.expected_square(ctx, i) for i in range(20, 25)]
        assert list(pool.imap([])) == []
        assert pool.diagnostics['items_completed'] == 15


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_close_unfinished_imap_then_rerun(kind, leak_check):
    ctx = pw.Ctx()
    with started_pool(kind, 2, pw.jittered_square, ctx) as pool:
        first = pool.imap(range(1000))
        assert [next(first) for _ in range(3)] == [0, 1, 4]
        first.close()
        with pytest.raises(StopIteration):
            next(first)
        assert list(pool.imap(range(5, 10))) == [pw.expected_square(ctx, i) for i in range(5, 10)]
        # An iterator that is merely abandoned is superseded by the next imap call.
        abandoned = pool.imap(range(1000))
        next(abandoned)
        assert list(pool.imap(range(3))) == [0, 1, 4]
        with pytest.raises(RuntimeError, match='superseded'):
            next(abandoned)
        never_started = pool.imap(range(3))
        assert list(pool.imap(range(4))) == [0, 1, 4, 9]
        with pytest.raises(RuntimeError, match='superseded'):
            next(never_started)
        assert pool.diagnostics['in_flight'] == 0
    leak_check()


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_error_reaches_consumer_with_type_and_traceback(kind, leak_check):
    pool = started_pool(kind, 2, pw.fail_on_item, pw.Ctx(fail_at=5))
    results = pool.imap(range(50))
    assert [next(results) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match='item 5 is bad') as excinfo:
        next(results)
    text = ''.join(traceback.format_exception(excinfo.value))
    assert 'fail_on_item' in text
    assert "raise ValueError(f'item {item} is bad')" in text
    with pytest.raises(RuntimeError, match='stopped'):  # the pool stopped itself
        pool.imap([1])
    pool.stop()
    pool.join()
    leak_check()


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_a_worker_timeout_error_is_raised_not_mistaken_for_a_wait(kind, leak_check):
    pool = started_pool(kind, 2, pw.raise_timeout, pw.Ctx(fail_at=3))
    results = pool.imap(range(10))
    began = time.monotonic()
    with pytest.raises(TimeoutError, match='reading item 3 timed out'):
        list(results)
    assert time.monotonic() - began < 5.0
    pool.join()
    leak_check()


@needs_dev_shm
def test_a_carrier_that_cannot_be_rebuilt_is_reported(leak_check):
    with started_pool('process', 1, pw.carrier_that_cannot_rebuild, pw.Ctx()) as pool, \
            pytest.raises(ValueError, match='cannot be rebuilt') as excinfo:
        list(pool.imap(range(3)))
    assert 'with_carried_arrays' in ''.join(traceback.format_exception(excinfo.value))
    leak_check()


def test_unpicklable_remote_exception_is_wrapped(leak_check):
    with started_pool('process', 1, pw.raise_unpicklable, pw.Ctx()) as pool, \
            pytest.raises(WorkerFunctionError, match='UnpicklableError: code 3') as excinfo:
        list(pool.imap([3]))
    assert 'raise_unpicklable' in str(excinfo.value.__cause__)
    leak_check()


@needs_dev_shm
def test_unpicklable_result_is_reported(leak_check):
    with started_pool('process', 1, pw.unpicklable_result, pw.Ctx()) as pool, \
            pytest.raises(TypeError, match='result of item 0 cannot be pickled'):
        list(pool.imap(range(3)))
    leak_check()  # the result's block was created before pickling failed


@needs_dev_shm
def test_result_the_parent_cannot_unpickle_is_reported(leak_check):
    with started_pool('process', 1, pw.result_only_the_worker_can_load, pw.Ctx()) as pool, \
            pytest.raises(RuntimeError, match='could not be unpickled in the parent') as excinfo:
        list(pool.imap(range(3)))
    assert isinstance(excinfo.value.__cause__, ImportError)
    leak_check()


# --------------------------------------------------------------------------------------------- shutdown


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_stop_mid_iteration_is_quick_and_join_leaves_nothing(kind, leak_check):
    pool = started_pool(kind, 2, pw.slow_identity, pw.Ctx(delay=0.05))
    results = pool.imap(range(1000))
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    began = time.monotonic()
    pool.stop()
    assert time.monotonic() - began < 0.5
    assert list(results) == []  # the iterator ends instead of hanging
    pool.join()
    assert time.monotonic() - began < 5.0
    leak_check()


@pytest.mark.parametrize('kind', ['thread', 'process'])
def test_stop_from_another_thread_wakes_the_consumer(kind, leak_check):
    pool = started_pool(kind, 1, pw.slow_identity, pw.Ctx(delay=0.3))
    results = pool.imap(range(100))
    assert next(results) == 0
    timer = threading.Timer(0.05, pool.stop)
    timer.start()
    began = time.monotonic()
    assert list(results) == []
    assert time.monotonic() - began < 1.5
    timer.join()
    pool.join()
    leak_check()


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_garbage_collected_pool_cleans_up(kind, leak_check):
    pool = started_pool(kind, 2, pw.slow_identity, pw.Ctx(delay=0.01))
    results = pool.imap(range(100))
    next(results)
    del pool, results
    gc.collect()
    leak_check()


@pytest.mark.parametrize('kind', ['thread', 'process'])
def test_garbage_collecting_a_pool_never_waits_for_its_workers(kind, leak_check):
    # The collector runs anywhere, inside threading's own bookkeeping or a pool's locks too, where joining a thread
    # or sending on a pipe hangs the process: a dropped pool is only marked, and its workers end on their own
    # (a process pool's collector thread tells them).
    pool = started_pool(kind, 1, pw.slow_identity, pw.Ctx(delay=1.0))
    results = pool.imap(range(3))
    next(results)
    time.sleep(0.1)  # the worker is inside its next one-second call
    gc.disable()  # a collection of the whole suite's heap would take part of the time measured
    try:
        started = time.monotonic()
        del pool, results  # the last references: the finalizer runs here
        elapsed = time.monotonic() - started
    finally:
        gc.enable()
    assert elapsed < 0.5  # not the rest of the worker's call
    gc.collect()
    leak_check()


_EXIT_WITHOUT_JOIN = """
import json, os, sys
sys.path[:0] = json.loads(sys.argv[1])
from petastorm.pools import make_pool
from support import pool_workers as pw
pool = make_pool('process', 2)
pool.start(pw.slow_identity, pw.Ctx(delay=0.01))
results = pool.imap(range(100))
next(results)
print(json.dumps({'pid': os.getpid(), 'workers': pool.diagnostics['worker_pids']}), flush=True)
"""


@needs_dev_shm
def test_a_process_that_exits_without_joining_its_pool_leaves_nothing(tmp_path):
    """At interpreter exit a pool that was never joined is shut down: the process exits, its workers have exited
    and their shared memory names are gone."""
    import json
    import subprocess
    import sys

    from support.pool_checks import shm_entries

    done = subprocess.run([sys.executable, '-c', _EXIT_WITHOUT_JOIN, json.dumps(sys.path)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout.splitlines()[-1])
    assert len(printed['workers']) == 2
    assert not [pid for pid in printed['workers'] if _running(pid)], "a worker outlived its pool's process"
    assert not shm_entries(printed['pid'])  # the names of its slots carry the pool process's pid


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------------------------------ flow control


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_items_are_pulled_lazily_and_bounded(kind):
    workers, max_in_flight = 2, 3
    pulled = [0]

    def items():
        for i in range(40):
            pulled[0] += 1
            yield i

    ahead = []
    with started_pool(kind, workers, pw.slow_identity, pw.Ctx(delay=0.002), max_in_flight=max_in_flight) as pool:
        for consumed, result in enumerate(pool.imap(items()), start=1):
            assert result == consumed - 1
            ahead.append(pulled[0] - consumed)
            time.sleep(0.01)  # a slow consumer
    assert max(ahead) <= max_in_flight + workers
    if kind != 'dummy':
        assert max(ahead) >= 1  # there was read-ahead at all


@pytest.mark.parametrize('kind', ['thread', 'process'])
@pytest.mark.parametrize('fn', [pw.big_uint8, pw.big_columns])
def test_byte_budget_shrinks_the_window(kind, fn):
    pulled = [0]

    def items():
        for i in range(20):
            pulled[0] += 1
            yield i

    ahead = []
    with started_pool(kind, 2, fn, pw.Ctx(delay=0.002), max_in_flight=8, max_bytes_in_flight=1_000_000) as pool:
        for consumed, result in enumerate(pool.imap(items()), start=1):
            data = result['data'] if isinstance(result, dict) else result.columns['data']
            assert data[0, 0] == (consumed - 1) % 256
            ahead.append(pulled[0] - consumed)
            del result, data
            time.sleep(0.005)
        assert pool.diagnostics['max_in_flight'] == 1  # 1 MB budget / 600 kB results
    assert max(ahead) <= 2  # one item per worker until the size of results is known
    assert max(ahead[2:]) <= 1


def test_context_is_sent_once_per_worker():
    with started_pool('process', 2, pw.unpickle_count, pw.CountingContext()) as pool:
        results = list(pool.imap(range(30)))
    assert {count for _, count in results} == {1}


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_diagnostics(kind):
    with started_pool(kind, 2, pw.jittered_square, pw.Ctx()) as pool:
        list(pool.imap(range(5)))
        info = pool.diagnostics
    assert {'kind', 'workers_count', 'items_submitted', 'items_completed', 'in_flight'} <= set(info)
    assert info['kind'] == kind
    assert info['items_submitted'] == info['items_completed'] == 5
    assert info['in_flight'] == 0
    assert info['workers_count'] == (1 if kind == 'dummy' else 2)
