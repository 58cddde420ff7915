"""Tests of petastorm.pools: ordering, round-trips, errors, cancellation, bounds and clean shutdown."""

from __future__ import annotations

import errno
import gc
import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import weakref
from pathlib import Path

import numpy as np
import psutil
import pytest

from petastorm.pools import (
    POOL_KINDS,
    DummyPool,
    ProcessPool,
    ThreadPool,
    WorkerDiedError,
    WorkerFunctionError,
    WorkerPool,
    make_pool,
)
from petastorm.pools._shm import MAX_FREE_SLOTS
from petastorm.pools._transport import process_block_prefix
from petastorm.pools.base import ArrayCarrier, result_nbytes

try:  # tests/ on sys.path (rootdir-relative imports, no tests/__init__.py)
    from support import pool_workers as pw
except ImportError:  # tests/ is a package
    from tests.support import pool_workers as pw

SHM_DIR = '/dev/shm'
needs_dev_shm = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason='needs /dev/shm')


def _shm_entries(pid: int | None = None) -> set[str]:
    """The slot names of the pools of process ``pid`` (default: this one).

    Other programs, and process pools of other processes (tests run at the same time), come and go in /dev/shm.
    """
    if not os.path.isdir(SHM_DIR):
        return set()
    start = process_block_prefix(pid)
    return {name for name in os.listdir(SHM_DIR) if name.startswith(start)}


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)
            if child.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture
def leak_check():
    """Returns a function asserting that no thread, child process or shared memory name was left behind."""
    threads_before = set(threading.enumerate())
    children_before = _children()
    shm_before = _shm_entries()

    def assert_clean() -> None:
        deadline = time.monotonic() + 3.0
        while True:
            extra_threads = set(threading.enumerate()) - threads_before
            extra_children = _children() - children_before
            extra_shm = _shm_entries() - shm_before
            if not (extra_threads or extra_children or extra_shm) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not extra_threads
        assert not extra_children
        assert not extra_shm

    return assert_clean


def _started(kind: str, workers: int, fn, ctx, **options) -> WorkerPool:
    pool = make_pool(kind, workers, **options)
    pool.start(fn, ctx)
    return pool


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
    with _started(kind, workers, pw.jittered_square, ctx) as pool:
        results = list(pool.imap(range(count)))
        assert pool.diagnostics['items_completed'] == count
    assert results == [pw.expected_square(ctx, i) for i in range(count)]


def _assert_same(actual, expected):
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            _assert_same(actual[key], expected[key])
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        if expected.dtype.hasobject:
            assert actual.tolist() == expected.tolist()
        else:
            assert np.array_equal(actual, expected)
    else:
        assert actual == expected


@pytest.mark.parametrize('kind', POOL_KINDS)
@pytest.mark.parametrize('fn', [pw.mixed_columns, pw.non_dict_result])
def test_results_round_trip_exactly(kind, fn):
    with _started(kind, 2, fn, pw.Ctx()) as pool:
        results = list(pool.imap(range(8)))
    assert len(results) == 8
    for item, result in enumerate(results):
        _assert_same(result, fn(pw.Ctx(), item))


def _in_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array`` views a process pool's shared memory slot (rather than memory of its own)."""
    exporter = array.base
    return (isinstance(exporter, np.ndarray) and isinstance(exporter.base, memoryview)
            and isinstance(exporter.base.obj, mmap.mmap))


@pytest.mark.parametrize('kind', POOL_KINDS)
@pytest.mark.parametrize('fn', [pw.columns_result, pw.small_columns_result])
def test_array_carrier_results_round_trip(kind, fn, leak_check):
    with _started(kind, 2, fn, pw.Ctx()) as pool:
        results = list(pool.imap(range(6)))
    assert len(results) == 6
    for item, result in enumerate(results):
        expected = fn(pw.Ctx(), item)
        assert type(result) is pw.Columns
        assert isinstance(result, ArrayCarrier)
        assert (result.item, result.note) == (expected.item, expected.note)
        _assert_same(dict(result.carried_arrays()), dict(expected.carried_arrays()))  # key order included
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
    with _started(kind, 2, pw.columns_result, pw.Ctx()) as pool:
        results = pool.imap(range(10))
        first = weakref.ref(next(results))
        gc.collect()
        assert first() is None
        assert next(results).item == 1


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_rerun_imap_after_a_complete_one(kind):
    ctx = pw.Ctx(offset=1)
    with _started(kind, 2, pw.jittered_square, ctx) as pool:
        assert list(pool.imap(range(10))) == [pw.expected_square(ctx, i) for i in range(10)]
        assert list(pool.imap(range(20, 25))) == [pw.expected_square(ctx, i) for i in range(20, 25)]
        assert list(pool.imap([])) == []
        assert pool.diagnostics['items_completed'] == 15


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_close_unfinished_imap_then_rerun(kind, leak_check):
    ctx = pw.Ctx()
    with _started(kind, 2, pw.jittered_square, ctx) as pool:
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
    pool = _started(kind, 2, pw.fail_on_item, pw.Ctx(fail_at=5))
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
    pool = _started(kind, 2, pw.raise_timeout, pw.Ctx(fail_at=3))
    results = pool.imap(range(10))
    began = time.monotonic()
    with pytest.raises(TimeoutError, match='reading item 3 timed out'):
        list(results)
    assert time.monotonic() - began < 5.0
    pool.join()
    leak_check()


@needs_dev_shm
def test_a_carrier_that_cannot_be_rebuilt_is_reported(leak_check):
    with _started('process', 1, pw.carrier_that_cannot_rebuild, pw.Ctx()) as pool, \
            pytest.raises(ValueError, match='cannot be rebuilt') as excinfo:
        list(pool.imap(range(3)))
    assert 'with_carried_arrays' in ''.join(traceback.format_exception(excinfo.value))
    leak_check()


def test_unpicklable_remote_exception_is_wrapped(leak_check):
    with _started('process', 1, pw.raise_unpicklable, pw.Ctx()) as pool, \
            pytest.raises(WorkerFunctionError, match='UnpicklableError: code 3') as excinfo:
        list(pool.imap([3]))
    assert 'raise_unpicklable' in str(excinfo.value.__cause__)
    leak_check()


@needs_dev_shm
def test_unpicklable_result_is_reported(leak_check):
    with _started('process', 1, pw.unpicklable_result, pw.Ctx()) as pool, \
            pytest.raises(TypeError, match='result of item 0 cannot be pickled'):
        list(pool.imap(range(3)))
    leak_check()  # the result's block was created before pickling failed


@needs_dev_shm
def test_result_the_parent_cannot_unpickle_is_reported(leak_check):
    with _started('process', 1, pw.result_only_the_worker_can_load, pw.Ctx()) as pool, \
            pytest.raises(RuntimeError, match='could not be unpickled in the parent') as excinfo:
        list(pool.imap(range(3)))
    assert isinstance(excinfo.value.__cause__, ImportError)
    leak_check()


# --------------------------------------------------------------------------------------------- shutdown


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_stop_mid_iteration_is_quick_and_join_leaves_nothing(kind, leak_check):
    pool = _started(kind, 2, pw.slow_identity, pw.Ctx(delay=0.05))
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
    pool = _started(kind, 1, pw.slow_identity, pw.Ctx(delay=0.3))
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
    pool = _started(kind, 2, pw.slow_identity, pw.Ctx(delay=0.01))
    results = pool.imap(range(100))
    next(results)
    del pool, results
    gc.collect()
    leak_check()


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
    with _started(kind, workers, pw.slow_identity, pw.Ctx(delay=0.002), max_in_flight=max_in_flight) as pool:
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
    with _started(kind, 2, fn, pw.Ctx(delay=0.002), max_in_flight=8, max_bytes_in_flight=1_000_000) as pool:
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
    with _started('process', 2, pw.unpickle_count, pw.CountingContext()) as pool:
        results = list(pool.imap(range(30)))
    assert {count for _, count in results} == {1}


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_diagnostics(kind):
    with _started(kind, 2, pw.jittered_square, pw.Ctx()) as pool:
        list(pool.imap(range(5)))
        info = pool.diagnostics
    assert {'kind', 'workers_count', 'items_submitted', 'items_completed', 'in_flight'} <= set(info)
    assert info['kind'] == kind
    assert info['items_submitted'] == info['items_completed'] == 5
    assert info['in_flight'] == 0
    assert info['workers_count'] == (1 if kind == 'dummy' else 2)


# -------------------------------------------------------------------------------------- process specific


@needs_dev_shm
def test_killed_worker_raises_worker_died_error(leak_check):
    pool = _started('process', 2, pw.big_uint8, pw.Ctx(delay=0.05))
    results = pool.imap(range(1000))
    next(results)
    victim = pool.diagnostics['worker_pids'][0]
    os.kill(victim, signal.SIGKILL)
    began = time.monotonic()
    with pytest.raises(WorkerDiedError, match=f'pid {victim}.*exit code -9') as excinfo:
        for _ in results:
            pass
    assert time.monotonic() - began < 5.0
    assert 'process pool' in str(excinfo.value)
    with pytest.raises(WorkerDiedError):
        pool.imap([1])
    pool.join()
    leak_check()


@needs_dev_shm
def test_shared_memory_is_bounded_and_released(leak_check):
    before = _shm_entries()
    with _started('process', 2, pw.big_uint8, pw.Ctx(delay=0.001)) as pool:
        for item, result in enumerate(pool.imap(range(60))):
            assert result['data'][0, 0] == item % 256
            del result
            # Slots are reused once the consumer has dropped their results: besides the 4 results in flight and
            # the one the consumer holds, each worker keeps a few free ones.
            assert len(_shm_entries() - before) <= 4 + 1 + 2 * (MAX_FREE_SLOTS + 1)
        results = pool.imap(range(100))
        next(results)
        time.sleep(0.2)  # let results pile up in flight
        results.close()
        results = pool.imap(range(100))
        next(results)
    leak_check()


@needs_dev_shm
def test_dropped_results_free_their_shared_memory_while_the_pool_idles(leak_check):
    before = _shm_entries()
    with _started('process', 2, pw.big_uint8, pw.Ctx()) as pool:
        results = list(pool.imap(range(20)))  # 20 slots are in use
        assert len(_shm_entries() - before) >= 20
        del results
        gc.collect()
        deadline = time.monotonic() + 5.0
        while len(_shm_entries() - before) > 2 * MAX_FREE_SLOTS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_shm_entries() - before) <= 2 * MAX_FREE_SLOTS  # each worker keeps a few for reuse
    leak_check()


@needs_dev_shm
def test_received_arrays_are_writable_and_outlive_the_pool(leak_check):
    with _started('process', 2, pw.mixed_columns, pw.Ctx()) as pool:
        results = list(pool.imap(range(4)))
    for item, result in enumerate(results):
        image = result['image']
        assert image.flags.writeable
        assert image.flags.c_contiguous
        assert image.ctypes.data % 64 == 0
        expected = pw.mixed_columns(pw.Ctx(), item)
        _assert_same(result, expected)
        image[0, 0, 0, 0] = 255 - image[0, 0, 0, 0]
        assert image[0, 0, 0, 0] != expected['image'][0, 0, 0, 0]
    rows = [result['matrix'][3] for result in results]  # views keep their mapping alive
    del results
    gc.collect()
    for item, row in enumerate(rows):
        np.testing.assert_array_equal(row, pw.mixed_columns(pw.Ctx(), item)['matrix'][3])
    del rows
    leak_check()


@needs_dev_shm
def test_reused_slots_never_overwrite_held_results(leak_check):
    held = {}
    with _started('process', 2, pw.varying_uint8, pw.Ctx(), max_in_flight=3) as pool:
        for item, result in enumerate(pool.imap(range(60))):
            if item % 7 == 0:
                held[item] = result['data'][1:]  # a view of a slot that must not be reused while it lives
            del result
    for item, view in held.items():
        np.testing.assert_array_equal(view, pw.varying_uint8(pw.Ctx(), item)['data'][1:])
    del held, view
    leak_check()


@needs_dev_shm
@pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs fork')
def test_a_forked_child_keeps_its_inherited_results(leak_check):
    with _started('process', 1, pw.big_uint8, pw.Ctx(), max_in_flight=1) as pool:
        results = pool.imap(range(40))
        kept = next(results)['data']
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: wait until the parent has dropped its copy and reused slots, then check
            os.close(write_fd)
            os.read(read_fd, 1)
            os._exit(0 if (kept == 0).all() else 1)
        os.close(read_fd)
        del kept
        gc.collect()
        for item, result in enumerate(results, start=1):
            assert result['data'][0, 0] == item
        os.write(write_fd, b'x')
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    leak_check()


def test_only_one_module_names_the_private_shared_memory_module():
    package = Path(__file__).resolve().parents[2] / 'src' / 'petastorm'
    naming = sorted(str(path.relative_to(package)) for path in package.rglob('*.py')
                    if '_posixshmem' in path.read_text())
    assert naming == [os.path.join('pools', '_posix_shm.py')]


def test_a_python_without_posix_shared_memory_gets_a_clear_error(monkeypatch):
    from petastorm.pools import _posix_shm

    monkeypatch.setitem(sys.modules, '_posixshmem', None)  # what an interpreter without the module has
    assert 'no POSIX shared memory' in _posix_shm.missing_reason()
    pool = ProcessPool(1)
    with pytest.raises(RuntimeError, match='no POSIX shared memory.*thread pool'):
        pool.start(pw.slow_identity, pw.Ctx())
    assert pool.diagnostics['worker_pids'] == []
    pool.join()
    with pytest.raises(RuntimeError, match='no POSIX shared memory'):
        _posix_shm.create_segment('psm_never_created')


def test_results_are_pickled_when_shared_memory_is_unavailable(caplog):
    from petastorm.pools._transport import pack_result

    class FullFileSystem:
        failed = False

        def write(self, size, parts):
            raise OSError(errno.ENOSPC, 'No space left on device')

    writer = FullFileSystem()
    result = {'big': np.zeros(100_000)}
    with caplog.at_level('WARNING', logger='petastorm.pools'):
        assert pack_result(result, writer) is result
        assert pack_result(result, writer) is result
    assert len([r for r in caplog.records if 'pickled through a pipe' in r.getMessage()]) == 1


def test_worker_functions_import_with_the_parents_sys_path(tmp_path, monkeypatch):
    module_dir = tmp_path / 'user_modules'
    module_dir.mkdir()
    (module_dir / 'pool_user_module_xyz.py').write_text('def triple(ctx, item):\n    return 3 * item\n')
    monkeypatch.syspath_prepend(str(module_dir))
    import pool_user_module_xyz

    with _started('process', 2, pool_user_module_xyz.triple, None) as pool:
        assert list(pool.imap(range(5))) == [0, 3, 6, 9, 12]


_UNGUARDED_SCRIPT = """
import sys
from petastorm import make_reader
from petastorm.pools import make_pool
import {module}

print('script body ran', flush=True)
with make_reader({url!r}, reader_pool_type='process', workers_count=2, shuffle_row_groups=False) as reader:
    print('ids:', [int(row.id) for row in reader], flush=True)
with make_pool('process', 2) as pool:
    pool.start({module}.jittered_square, {module}.Ctx())
    print('squares:', list(pool.imap(range(6))), flush=True)
"""


def test_a_script_without_a_main_guard_can_use_process_pools(tmp_path):
    import pyarrow as pa

    from petastorm import write_dataset
    from petastorm.codecs import ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField

    schema = Unischema('Ids', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False)])
    url = 'file://' + str(tmp_path / 'ids')
    write_dataset(url, schema, ({'id': i} for i in range(30)), row_group_size_mb=0.0001)
    script = tmp_path / 'plain_script.py'
    script.write_text(_UNGUARDED_SCRIPT.format(module=pw.__name__, url=url))
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('script body ran') == 1  # the workers did not re-run the script
    assert f'ids: {list(range(30))}' in done.stdout
    assert f'squares: {[i * i for i in range(6)]}' in done.stdout
    assert 'Error' not in done.stderr


_SCRIPT_PREAMBLE = """
import importlib, json, os, signal, sys, time
sys.path[:0] = {path!r}
from petastorm.pools import make_pool
from petastorm.pools._transport import process_block_prefix
pw = importlib.import_module({module!r})

def own_slot_names():
    return [name for name in os.listdir('/dev/shm') if name.startswith(process_block_prefix())]
"""


def _python(body: str) -> list[str]:
    preamble = _SCRIPT_PREAMBLE.format(path=sys.path, module=pw.__name__)
    return [sys.executable, '-c', preamble + textwrap.dedent(body)]


@needs_dev_shm
def test_no_resource_tracker_warnings_in_a_fresh_interpreter():
    body = """
    if __name__ == '__main__':
        ctx = pw.Ctx(delay=0.01)
        with make_pool('process', 2) as pool:
            pool.start(pw.big_uint8, ctx)
            assert len(list(pool.imap(range(10)))) == 10
            early = pool.imap(range(100))
            held = next(early)
            print('slots while running:', len(own_slot_names()), flush=True)
            del held
            early.close()
            stopped = pool.imap(range(100))
            next(stopped)
        with make_pool('process', 2) as pool:
            pool.start(pw.big_uint8, ctx)
            results = pool.imap(range(100))
            next(results)
            os.kill(pool.diagnostics['worker_pids'][1], signal.SIGKILL)
            try:
                list(results)
            except RuntimeError as exc:
                print('died:', type(exc).__name__)
    """
    child = subprocess.Popen(_python(body), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, stderr
    assert 'died: WorkerDiedError' in stdout
    assert int(stdout.split('slots while running:')[1].split()[0]) >= 1  # the check below is not vacuous
    assert 'resource_tracker' not in stderr
    assert 'leaked' not in stderr
    assert _shm_entries(child.pid) == set()


def test_workers_exit_and_clean_up_when_the_parent_is_killed():
    body = """
    pool = make_pool('process', 2)
    pool.start(pw.big_uint8, pw.Ctx(delay=0.02))
    results = pool.imap(range(1000))
    held = [next(results) for _ in range(4)]  # slots held by the parent, more results in flight
    print(json.dumps(pool.diagnostics['worker_pids']), flush=True)
    time.sleep(60)
    """
    child = subprocess.Popen(_python(body), stdout=subprocess.PIPE, text=True)
    try:
        worker_pids = json.loads(child.stdout.readline())
        assert len(worker_pids) == 2
        assert all(psutil.pid_exists(pid) for pid in worker_pids)
        assert _shm_entries(child.pid)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        killed = time.monotonic()
        alive = worker_pids
        while alive and time.monotonic() < killed + 5.0:
            time.sleep(0.05)
            alive = [pid for pid in worker_pids if _is_running(pid)]
        assert alive == []
        assert time.monotonic() - killed < 3.0
        assert _shm_entries(child.pid) == set()
    finally:
        child.kill()
        child.wait()


def _is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize('kind', POOL_KINDS)
def test_every_pool_kind_decodes_png_with_the_same_library(kind, monkeypatch):
    pytest.importorskip('petastorm.codecs._png_reader')
    monkeypatch.delenv('PETASTORM_IMAGE_BACKEND', raising=False)
    pool = _started(kind, 2, pw.png_decoder, pw.Ctx())
    try:
        chosen = set(pool.imap(range(4)))
    finally:
        pool.stop()
        pool.join()
    # Our PNG reader lets the GIL go while it works, so threads and worker processes alike take it.
    assert chosen == {'libdeflate'}
