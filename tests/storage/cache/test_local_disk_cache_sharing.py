"""One local disk cache shared by threads and processes: each entry is filled once, a node's ranks read each row
group once, and cleanup removes only what the cache made while the other users of the directory carry on."""

import multiprocessing as mp
import os
import shutil
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.local_disk_cache import LocalDiskCache
from support.cache_stores import LIMIT, ROWS, disk_cache_args, reader_ids, row_group_count, small_table
from support.node_ranks import run_ranks_together

# make_batch_reader on a Petastorm dataset warns as Petastorm does.
pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')


def test_threads_filling_one_key_fill_it_once(tmp_path):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    fills = []

    def fill():
        fills.append(1)
        time.sleep(0.1)
        return small_table(7)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get('key', fill))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fills) == 1
    assert len(results) == 4
    assert all(result.equals(small_table(7)) for result in results)


def _fill_keys_in_process(cache_dir, counter_path, keys, go):
    cache = LocalDiskCache(cache_dir, LIMIT, None)
    go.wait(30)
    for key in keys:
        def fill(key=key):
            with open(counter_path, 'a') as counter:
                counter.write(key + '\n')
            time.sleep(0.02)
            return pa.table({'key': [key] * 10})

        table = cache.get(key, fill)
        if table.column('key')[0].as_py() != key:
            raise AssertionError(f'{key}: got {table.column("key")[0]}')


def test_processes_sharing_a_directory_fill_each_entry_once(tmp_path):
    counter = tmp_path / 'fills.txt'
    keys = [f'key{i}' for i in range(30)]
    context = mp.get_context('spawn')
    go = context.Event()
    orders = [keys, keys[::-1], keys[10:] + keys[:10]]
    processes = [context.Process(target=_fill_keys_in_process, args=(str(tmp_path / 'c'), str(counter), order, go))
                 for order in orders]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    filled = counter.read_text().split()
    assert sorted(filled) == sorted(keys)  # each key filled by exactly one process


def test_cleanup_is_the_default_and_removes_only_what_the_cache_made(tmp_path):
    alone = tmp_path / 'alone'
    cache = LocalDiskCache(alone, LIMIT, None)
    cache.get('table', lambda: small_table(1))
    cache.get('value', lambda: 'text')
    cache.cleanup()
    assert not alone.exists()
    cache.cleanup()  # again: nothing left, no error
    # A cleaned-up cache only computes values: it reads and writes nothing, and makes no directory again.
    fills = []
    assert cache.get('value', lambda: fills.append(1) or 'computed') == 'computed'
    assert fills == [1]
    assert not alone.exists()

    shared = tmp_path / 'shared'
    shared.mkdir()
    (shared / 'user_file.txt').write_text('not ours')
    cache = LocalDiskCache(shared, LIMIT, None)
    cache.get('value', lambda: 1)
    cache.cleanup()
    assert sorted(p.name for p in shared.iterdir()) == ['user_file.txt']

    kept = LocalDiskCache(tmp_path / 'kept', LIMIT, None, cleanup=False)
    kept.get('value', lambda: 1)
    kept.cleanup()
    assert LocalDiskCache(tmp_path / 'kept', LIMIT, None).get('value', lambda: pytest.fail('kept')) == 1


def test_cleanup_errors_are_printed_in_petastorm_words(tmp_path, capsys, monkeypatch):
    cache = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    cache.get('value', lambda: 1)

    def refuse(path, *args, **kwargs):
        raise PermissionError(f'cannot remove {path}')

    with monkeypatch.context() as patched:
        patched.setattr(shutil, 'rmtree', refuse)
        cache.cleanup()  # does not raise
    assert capsys.readouterr().out == f"Error during rmtree: cannot remove {tmp_path / 'c' / 'entries'}\n"
    assert (tmp_path / 'c').exists()

    cache = LocalDiskCache(tmp_path / 'd', LIMIT, None)
    monkeypatch.setattr(cache._cache, 'close', lambda: (_ for _ in ()).throw(OSError('still busy')))
    cache.cleanup()
    assert capsys.readouterr().out == 'Error closing cache: still busy\n'
    assert not (tmp_path / 'd').exists()  # removed all the same


def test_a_cache_whose_directory_another_process_removed_carries_on(tmp_path):
    mine = LocalDiskCache(tmp_path / 'c', LIMIT, None)
    theirs = LocalDiskCache(tmp_path / 'c', LIMIT, None)  # another process's view of the same directory
    mine.get('old', lambda: small_table(1))
    theirs.cleanup()
    assert not (tmp_path / 'c').exists()
    assert mine.get('new', lambda: small_table(2)).equals(small_table(2))  # stored: the layout is made again
    assert len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) == 1
    fills = []
    for _ in range(2):
        assert mine.get('old', lambda: fills.append(1) or small_table(1)).equals(small_table(1))
    assert fills == [1]  # filled again once, then a hit


@pytest.mark.parametrize('removed_at', ['entries/1', 'tmp/probe'])
def test_a_cache_made_while_another_process_cleans_up_makes_its_layout_again(tmp_path, monkeypatch, removed_at):
    # Another process's cleanup removes the tree between the creation of a directory and of what goes in it: the
    # creation in the removed parent fails as mkdir and open fail then.
    location = tmp_path / 'c'
    real_makedirs, real_open, removed = os.makedirs, open, []

    def racing(real):
        def call(path, *args, **kwargs):
            if not removed and str(path).startswith(str(location / removed_at)):
                removed.append(path)
                shutil.rmtree(location)
                raise FileNotFoundError(2, 'No such file or directory', str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, 'makedirs', racing(real_makedirs))
    monkeypatch.setattr('builtins.open', racing(real_open))
    cache = LocalDiskCache(location, LIMIT, None, cleanup=False)
    monkeypatch.undo()
    assert removed  # the race happened
    assert cache.get('k', lambda: small_table(3)).equals(small_table(3))
    assert len(list((location / 'entries').rglob('*.arrow'))) == 1


def test_a_reader_removes_its_cache_on_exit_by_default_and_quietly(cache_dataset_url, tmp_path, capsys):
    location = tmp_path / 'c'
    args = {**disk_cache_args(location), 'cache_extra_settings': None}
    with make_reader(cache_dataset_url, reader_pool_type='thread', workers_count=2, **args) as reader:
        assert isinstance(reader.cache, LocalDiskCache)
        assert sorted(int(row.id) for row in reader) == list(range(ROWS))
        assert list((location / 'entries').rglob('*.arrow'))
    assert not location.exists()
    assert capsys.readouterr().out == ''  # only an explicit cleanup_cache() prints
    # cleanup=False
    reader_ids(make_batch_reader(cache_dataset_url, reader_pool_type='dummy', **disk_cache_args(location)))
    assert list((location / 'entries').rglob('*.arrow'))


def _read_epochs_in_process(url, cache_dir, epochs, go):
    go.wait(30)
    with make_reader(url, reader_pool_type='thread', workers_count=2, num_epochs=epochs, cache_type='local-disk',
                     cache_location=cache_dir, cache_size_limit=LIMIT, cache_row_size_estimate=1000) as reader:
        rows = [(int(row.id), row.name, row.vec.tolist()) for row in reader]
    expected = sorted((i, f'row{i}', [float(i)] * 4) for i in range(ROWS)) * epochs
    if sorted(rows) != sorted(expected):
        raise AssertionError(f'wrong rows after {epochs} epochs: {len(rows)} rows')


def test_processes_that_clean_up_on_exit_do_not_break_the_others(cache_dataset_url, tmp_path):
    # The default cleanup=True: the first process to finish removes the directory while the others still read.
    context = mp.get_context('spawn')
    go = context.Event()
    processes = [context.Process(target=_read_epochs_in_process,
                                 args=(cache_dataset_url, str(tmp_path / 'c'), epochs, go))
                 for epochs in (1, 3, 6)]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert not (tmp_path / 'c').exists()  # the last one out removed it for good


def _read_in_process(url, cache_dir, counter_path, seed, go):
    original = pq.ParquetFile.read_row_group

    def counting(self, *args, **kwargs):
        with open(counter_path, 'a') as counter:
            counter.write('read\n')
        time.sleep(0.02)
        return original(self, *args, **kwargs)

    pq.ParquetFile.read_row_group = counting
    go.wait(30)
    ids = reader_ids(make_reader(url, reader_pool_type='thread', workers_count=2, seed=seed,
                                 **disk_cache_args(cache_dir)))
    if sorted(ids) != list(range(ROWS)):
        raise AssertionError(f'wrong rows: {sorted(ids)}')


def test_ranks_of_one_node_read_each_row_group_once(cache_dataset_url, tmp_path):
    counter = tmp_path / 'reads.txt'
    assert run_ranks_together(_read_in_process, cache_dataset_url, tmp_path / 'c', counter) == [0, 0]
    assert len(counter.read_text().split()) == row_group_count(cache_dataset_url)
