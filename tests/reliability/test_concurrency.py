"""Concurrency: readers sharing a dataset and a local disk cache, in one process and in several; parallel writers.

The cache is given a size limit smaller than the dataset's row groups, so entries are filled, read and evicted
by several readers at the same time. Every reader must still see every row once per epoch with the right values.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from petastorm import make_reader
from reliability.concurrent_worker import read_through_cache
from reliability.helpers import SMALL_ROWS, subprocess_env, write_small_dataset

READERS = 4
EPOCHS = 2
#: small enough that the cache evicts while the readers run (the dataset's entries add up to more).
CACHE_LIMIT = 6000


def _run_threads(targets) -> list:
    results: list = [None] * len(targets)
    errors: list = []

    def run(i, target):
        try:
            results[i] = target()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), 'a reader or writer thread hangs'
    if errors:
        raise errors[0]
    return results


def _run_processes(argvs: list[list[str]]) -> list:
    env = subprocess_env(silence_warnings=True)
    children = [subprocess.Popen([sys.executable, '-m', 'reliability.concurrent_worker', *argv],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for argv in argvs]
    results = []
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _assert_each_row_once_per_epoch(ids: list[int]) -> None:
    assert Counter(ids) == Counter(dict.fromkeys(range(SMALL_ROWS), EPOCHS))


@pytest.mark.parametrize('pool', ['thread', 'dummy'])
def test_readers_in_one_process_share_a_dataset_and_a_cache(pool, small_dataset_url, tmp_path, figures):
    cache = str(tmp_path / 'cache')
    started = time.perf_counter()
    results = _run_threads([lambda: read_through_cache(small_dataset_url, cache, CACHE_LIMIT, EPOCHS, pool)
                            for _ in range(READERS)])
    for ids in results:
        _assert_each_row_once_per_epoch(ids)
    figures.add('concurrency', f'{READERS} {pool}-pool readers in one process, one cache: {EPOCHS} epochs each, '
                               f'all rows once per epoch ({time.perf_counter() - started:.1f} s)')


def test_readers_without_cache_in_one_process(small_dataset_url):
    def read():
        with make_reader(small_dataset_url, workers_count=2, num_epochs=EPOCHS, seed=1) as reader:
            return [int(row.id) for row in reader]

    results = _run_threads([read] * READERS)
    for ids in results:
        _assert_each_row_once_per_epoch(ids)
    assert len({tuple(ids) for ids in results}) == 1, 'the same seed gave different orders in concurrent readers'


@pytest.mark.slow
def test_readers_in_several_processes_share_a_dataset_and_a_cache(small_dataset_url, tmp_path, figures):
    cache = str(tmp_path / 'cache')
    started = time.perf_counter()
    results = _run_processes([['read', small_dataset_url, cache, str(CACHE_LIMIT), str(EPOCHS)]] * 3)
    for ids in results:
        _assert_each_row_once_per_epoch(ids)
    # The cache left behind by the processes serves a later reader correctly.
    _assert_each_row_once_per_epoch(read_through_cache(small_dataset_url, cache, CACHE_LIMIT, EPOCHS))
    figures.add('concurrency', f'3 reader processes, one cache: all rows once per epoch '
                               f'({time.perf_counter() - started:.1f} s)')


def test_parallel_writers_to_different_outputs(tmp_path, figures):
    urls = [f'file://{tmp_path}/thread-{i}' for i in range(4)]
    counts = _run_threads([lambda url=url, i=i: write_small_dataset(url, 1000 * i).num_rows
                           for i, url in enumerate(urls)])
    assert counts == [SMALL_ROWS] * 4
    for i, url in enumerate(urls):
        with make_reader(url, reader_pool_type='dummy') as reader:
            assert sorted(int(r.id) for r in reader) == [1000 * i + k for k in range(SMALL_ROWS)]
    figures.add('concurrency', '4 writer threads to 4 outputs: every dataset complete and readable')


@pytest.mark.slow
def test_parallel_writer_processes_to_different_outputs(tmp_path, figures):
    urls = [f'file://{tmp_path}/process-{i}' for i in range(2)]
    counts = _run_processes([['write', url, str(5000 * i)] for i, url in enumerate(urls)])
    assert counts == [SMALL_ROWS] * 2
    for i, url in enumerate(urls):
        with make_reader(url, reader_pool_type='dummy') as reader:
            assert sorted(int(r.id) for r in reader) == [5000 * i + k for k in range(SMALL_ROWS)]
    figures.add('concurrency', '2 writer processes to 2 outputs: every dataset complete and readable')
