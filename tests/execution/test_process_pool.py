"""petastorm.pools' process pool: dead workers, shared memory, forked children, scripts, fresh interpreters."""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from petastorm.pools import (
    POOL_KINDS,
    ProcessPool,
    WorkerDiedError,
)
from petastorm.pools._shm import MAX_FREE_SLOTS
from support.pool_checks import assert_same_result, needs_dev_shm, shm_entries, started_pool

try:  # tests/ on sys.path (rootdir-relative imports, no tests/__init__.py)
    from support import pool_workers as pw
except ImportError:  # tests/ is a package
    from tests.support import pool_workers as pw


# -------------------------------------------------------------------------------------- process specific


@needs_dev_shm
def test_killed_worker_raises_worker_died_error(leak_check):
    pool = started_pool('process', 2, pw.big_uint8, pw.Ctx(delay=0.05))
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
    before = shm_entries()
    with started_pool('process', 2, pw.big_uint8, pw.Ctx(delay=0.001)) as pool:
        for item, result in enumerate(pool.imap(range(60))):
            assert result['data'][0, 0] == item % 256
            del result
            # Slots are reused once the consumer has dropped their results: besides the 4 results in flight and
            # the one the consumer holds, each worker keeps a few free ones.
            assert len(shm_entries() - before) <= 4 + 1 + 2 * (MAX_FREE_SLOTS + 1)
        results = pool.imap(range(100))
        next(results)
        time.sleep(0.2)  # let results pile up in flight
        results.close()
        results = pool.imap(range(100))
        next(results)
    leak_check()


@needs_dev_shm
def test_dropped_results_free_their_shared_memory_while_the_pool_idles(leak_check):
    before = shm_entries()
    with started_pool('process', 2, pw.big_uint8, pw.Ctx()) as pool:
        results = list(pool.imap(range(20)))  # 20 slots are in use
        assert len(shm_entries() - before) >= 20
        del results
        gc.collect()
        deadline = time.monotonic() + 5.0
        while len(shm_entries() - before) > 2 * MAX_FREE_SLOTS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(shm_entries() - before) <= 2 * MAX_FREE_SLOTS  # each worker keeps a few for reuse
    leak_check()


@needs_dev_shm
def test_received_arrays_are_writable_and_outlive_the_pool(leak_check):
    with started_pool('process', 2, pw.mixed_columns, pw.Ctx()) as pool:
        results = list(pool.imap(range(4)))
    for item, result in enumerate(results):
        image = result['image']
        assert image.flags.writeable
        assert image.flags.c_contiguous
        assert image.ctypes.data % 64 == 0
        expected = pw.mixed_columns(pw.Ctx(), item)
        assert_same_result(result, expected)
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
    with started_pool('process', 2, pw.varying_uint8, pw.Ctx(), max_in_flight=3) as pool:
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
    with started_pool('process', 1, pw.big_uint8, pw.Ctx(), max_in_flight=1) as pool:
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

    with started_pool('process', 2, pool_user_module_xyz.triple, None) as pool:
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
    assert shm_entries(child.pid) == set()


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
        assert shm_entries(child.pid)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        killed = time.monotonic()
        alive = worker_pids
        while alive and time.monotonic() < killed + 5.0:
            time.sleep(0.05)
            alive = [pid for pid in worker_pids if _is_running(pid)]
        assert alive == []
        assert time.monotonic() - killed < 3.0
        assert shm_entries(child.pid) == set()
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
    pool = started_pool(kind, 2, pw.png_decoder, pw.Ctx())
    try:
        chosen = set(pool.imap(range(4)))
    finally:
        pool.stop()
        pool.join()
    # Our PNG reader lets the GIL go while it works, so threads and worker processes alike take it.
    assert chosen == {'libdeflate'}
