"""Faults: errors in user code, codecs and storage reach the caller quickly and say where; nothing hangs or leaks.

The time to an error is measured from the moment the first row was delivered (so every pool is up, including
worker processes that take seconds to start on a loaded machine) to the moment the error is raised; the fault
sits in a later row group, read after that first row.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import TransformSpec, make_batch_reader, make_reader
from petastorm.errors import DecodeFieldError
from petastorm.pools.base import WorkerDiedError
from petastorm.predicates import in_lambda
from reliability.helpers import SMALL_ROWS, subprocess_env, write_small_dataset

psutil = pytest.importorskip('psutil')

POOLS = ['dummy', 'thread', 'process']
FAULT_DEADLINE_SECONDS = 2.0
#: the id whose row group fails (in the last file, so the first rows are read before it).
FAULTY_ID = SMALL_ROWS - 1


class TransformFault(RuntimeError):
    pass


class PredicateFault(ValueError):
    pass


def exploding_transform(row):
    if row['id'] == FAULTY_ID:
        raise TransformFault(f'transform refused row {row["id"]}')
    return row


def exploding_predicate(value):
    if value == FAULTY_ID:
        raise PredicateFault(f'predicate refused id {value}')
    return True


@pytest.fixture
def dataset(tmp_path):
    """A fresh small dataset (tests corrupt or delete its files) and the path of its last data file."""
    url = 'file://' + str(tmp_path / 'ds')
    result = write_small_dataset(url)
    last = pathlib.Path(sorted(result.files)[-1])
    assert FAULTY_ID in pq.read_table(last, columns=['id']).column('id').to_pylist()
    return url, last


def _corrupt_vec_payloads(path: pathlib.Path) -> None:
    """Rewrite a file with the same row groups but 'vec' payloads that are not .npy files."""
    source = pq.ParquetFile(path)
    tables = [source.read_row_group(i) for i in range(source.num_row_groups)]
    with pq.ParquetWriter(path.with_suffix('.tmp'), tables[0].schema) as writer:
        for table in tables:
            garbage = [b'not a npy payload'] * table.num_rows
            index = table.schema.get_field_index('vec')
            field = table.schema.field('vec')
            writer.write_table(table.set_column(index, field, pa.array(garbage, type=field.type)))
    path.with_suffix('.tmp').replace(path)


def _fault_kwargs(kind: str) -> dict:
    if kind == 'transform':
        return {'transform_spec': TransformSpec(exploding_transform)}
    if kind == 'predicate':
        return {'predicate': in_lambda(['id'], exploding_predicate)}
    return {}


def _consume_until_error(reader, after_first_row=None):
    """Iterate; return (exception, seconds from the first row to the exception)."""
    iterator = iter(reader)
    next(iterator)
    if after_first_row is not None:
        after_first_row()
    started = time.perf_counter()
    try:
        for _ in iterator:
            pass
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return err, time.perf_counter() - started
    pytest.fail('the reader finished without raising the injected fault')


def _full_text(err: BaseException) -> str:
    return ''.join(traceback.format_exception(err))


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('kind', ['transform', 'predicate', 'codec', 'filesystem'])
def test_fault_reaches_the_caller_quickly_with_traceback_and_location(kind, pool, dataset, figures):
    url, last_file = dataset
    if kind == 'codec':
        _corrupt_vec_payloads(last_file)
    after_first_row = (lambda: last_file.unlink()) if kind == 'filesystem' else None
    reader = make_reader(url, reader_pool_type=pool, workers_count=1, results_queue_size=1,
                         shuffle_row_groups=False, **_fault_kwargs(kind))
    with reader:
        err, seconds = _consume_until_error(reader, after_first_row)
    text = _full_text(err)
    expected_type = {'transform': TransformFault, 'predicate': PredicateFault, 'codec': DecodeFieldError,
                     'filesystem': OSError}[kind]
    assert isinstance(err, expected_type), text
    assert str(last_file) in text, text
    assert 'row group' in text, text
    origin = {'transform': 'exploding_transform', 'predicate': 'exploding_predicate', 'codec': 'decode',
              'filesystem': 'memory_map'}[kind]  # local data files are memory-mapped
    assert origin in text, f'the original traceback is missing:\n{text}'
    assert seconds < FAULT_DEADLINE_SECONDS
    figures.add('faults: seconds from fault to caller', f'{kind:>10} / {pool:<7}: {seconds:.3f} s')


def slow_transform(row):
    time.sleep(0.05)
    return row


def test_killed_worker_process_raises_a_clear_error(dataset, figures):
    url, _ = dataset
    with make_reader(url, reader_pool_type='process', workers_count=2, num_epochs=None,
                     transform_spec=TransformSpec(slow_transform)) as reader:
        next(reader)
        victim = reader.diagnostics['worker_pids'][0]
        os.kill(victim, signal.SIGKILL)
        started = time.perf_counter()
        with pytest.raises(WorkerDiedError) as info:
            for _ in reader:
                pass
        seconds = time.perf_counter() - started
    assert str(victim) in str(info.value)
    assert seconds < 5
    figures.add('faults: worker SIGKILL', f'WorkerDiedError after {seconds:.2f} s: {str(info.value)[:90]}...')


_PARENT_SCRIPT = textwrap.dedent('''
    import sys, time
    from petastorm import TransformSpec, make_reader
    from reliability.test_faults import slow_transform
    reader = make_reader(sys.argv[1], reader_pool_type='process', workers_count=2, num_epochs=None,
                         transform_spec=TransformSpec(slow_transform))
    next(reader)
    print(' '.join(map(str, reader.diagnostics['worker_pids'])), flush=True)
    while True:
        next(reader)
''')


def test_killed_parent_leaves_no_worker_behind(dataset, figures):
    url, _ = dataset
    parent = subprocess.Popen([sys.executable, '-c', _PARENT_SCRIPT, url], stdout=subprocess.PIPE,
                              env=subprocess_env(), text=True)
    try:
        worker_pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(worker_pids) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        started = time.perf_counter()
        alive = worker_pids
        while alive and time.perf_counter() - started < 10:
            alive = [pid for pid in worker_pids if _is_running(pid)]
            time.sleep(0.05)
        seconds = time.perf_counter() - started
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    assert not alive, f'worker processes {alive} outlived their killed parent'
    assert seconds < 5
    figures.add('faults: parent SIGKILL', f'both worker processes gone {seconds:.2f} s after the parent was killed')


def _is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _bounded(action, seconds: float = 10.0) -> float:
    """Run ``action`` in a thread; fail if it does not return within ``seconds``. Returns its duration."""
    outcome = {}

    def run():
        started = time.perf_counter()
        try:
            action()
        except BaseException as err:  # noqa: BLE001 - reported below
            outcome['error'] = err
        outcome['seconds'] = time.perf_counter() - started

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f'{action} did not return within {seconds} s'
    if 'error' in outcome:
        raise outcome['error']
    return outcome['seconds']


def _stop_join(reader):
    reader.stop()
    reader.join()


def _exit(reader):
    reader.__exit__(None, None, None)


def _twice(reader):
    reader.stop()
    reader.stop()
    reader.join()
    reader.join()
    reader.__exit__(None, None, None)


STATES = ['fresh', 'mid-iteration', 'exhausted', 'failed', 'blocked-in-next']
ENDINGS = {'stop+join': _stop_join, 'exit': _exit, 'twice': _twice}
# Every (state, pool) pair once, each pool meeting every ending: the full product would start many more worker
# processes for no new path.
STOP_CASES = [(state, pool, list(ENDINGS)[(i + j) % len(ENDINGS)])
              for i, state in enumerate(STATES) for j, pool in enumerate(POOLS)]


@pytest.mark.parametrize(('state', 'pool', 'ending'), STOP_CASES)
def test_stop_join_and_exit_always_return(state, pool, ending, dataset):
    url, _ = dataset
    kwargs = {'reader_pool_type': pool, 'workers_count': 2}
    if state == 'failed':
        kwargs['transform_spec'] = TransformSpec(exploding_transform)
    if state == 'blocked-in-next':
        kwargs.update(num_epochs=None, transform_spec=TransformSpec(slow_transform))
    reader = make_batch_reader(url, **kwargs) if state == 'exhausted' else make_reader(url, **kwargs)
    consumer = None
    consumer_errors: list[BaseException] = []
    if state == 'mid-iteration':
        next(reader)
    elif state == 'exhausted':
        assert sum(len(b.id) for b in reader) == SMALL_ROWS
    elif state == 'failed':
        with pytest.raises(TransformFault):
            list(reader)
    elif state == 'blocked-in-next':
        # Another thread is inside next() when the reader is stopped: it must end too, with an error or the end.
        def consume():
            try:
                for _ in reader:
                    pass
            except BaseException as err:  # noqa: BLE001 - kept for the check after the join
                consumer_errors.append(err)

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(0.2)
    _bounded(lambda: ENDINGS[ending](reader))
    if consumer is not None:
        consumer.join(10)
        assert not consumer.is_alive(), 'the consuming thread is still blocked after stop()/join()'
        # A stopped reader may end the blocked next() with its RuntimeError, never with anything else.
        assert all(isinstance(err, RuntimeError) for err in consumer_errors), \
            f'the consuming thread ended with {consumer_errors!r}'
    with pytest.raises(RuntimeError):
        next(reader)


@pytest.mark.parametrize('pool', POOLS)
def test_an_abandoned_reader_is_cleaned_up_by_exit_after_an_exception_in_the_loop(pool, dataset):
    """An exception leaving the ``with`` block mid-read propagates within the bound.

    That ``__exit__`` cleaned up (no worker thread or process left running) is checked by the autouse
    ``no_leaked_threads_or_processes`` fixture.
    """
    url, _ = dataset

    class Abandon(Exception):
        pass

    def read_and_abandon():
        with make_reader(url, reader_pool_type=pool, workers_count=2, num_epochs=None) as reader:
            next(reader)
            raise Abandon()

    with pytest.raises(Abandon):
        _bounded(read_and_abandon, seconds=60)  # includes starting worker processes


def test_codec_corruption_names_the_field(dataset):
    url, last_file = dataset
    _corrupt_vec_payloads(last_file)
    with make_batch_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader, \
            pytest.raises(DecodeFieldError) as info:
        for _ in reader:
            pass
    assert '"vec"' in str(info.value)
    assert str(last_file) in str(info.value)
    assert info.value.__cause__ is not None
