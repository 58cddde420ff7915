"""Shared pieces of the reliability suite: leak accounting, tiny datasets and the figures printed at the end.

Every test here is checked for leaks: the Python threads and child processes alive after the test must be those
alive before it (after a short grace period for workers that are already exiting). The figures the tests record
with the ``figures`` fixture are printed in the terminal summary, so ``pytest -q`` shows them.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reliability.helpers import SMALL_ROWS, write_small_dataset

psutil = pytest.importorskip('psutil')

#: how long a test's threads and processes may take to disappear after it returned.
LEAK_GRACE_SECONDS = 5.0

_FIGURES = pytest.StashKey[dict]()
_LEAKS = pytest.StashKey[dict]()

# The suite reads Petastorm datasets with make_batch_reader on purpose (both readers over one store).
_BATCH_READER_ADVICE = pytest.mark.filterwarnings("ignore:Please use make_reader:UserWarning")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if 'reliability' in item.nodeid.split('::')[0]:
            item.add_marker(pytest.mark.reliability)
            item.add_marker(_BATCH_READER_ADVICE)


class Figures:
    """Named lines of figures, printed together at the end of the run."""

    def __init__(self, store: dict):
        self._store = store

    def add(self, section: str, line: str) -> None:
        self._store.setdefault(section, []).append(line)

    def tally(self, section: str, key: str, **counts: float) -> None:
        """Add ``counts`` to the running totals printed as one line per ``key``."""
        totals = self._store.setdefault(section, {}).setdefault(key, {})
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + value


@pytest.fixture
def figures(request) -> Figures:
    return Figures(request.config.stash.setdefault(_FIGURES, {}))


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


@pytest.fixture(autouse=True)
def no_leaked_threads_or_processes(request):
    """Fail the test if it leaves a thread or a child process behind."""
    threads_before, children_before = _threads(), _children()
    yield
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    while True:
        new_threads = _threads() - threads_before
        new_children = _children() - children_before
        if not (new_threads or new_children) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    leaks = request.config.stash.setdefault(_LEAKS, {'tests': 0, 'threads': 0, 'processes': 0})
    leaks['tests'] += 1
    leaks['threads'] += len(new_threads)
    leaks['processes'] += len(new_children)
    if new_threads or new_children:
        names = [t.name for t in threading.enumerate() if t.ident in new_threads]
        pytest.fail(f'leaked {len(new_threads)} thread(s) {names} and {len(new_children)} child process(es) '
                    f'{sorted(new_children)}')


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    figures = config.stash.get(_FIGURES, {})
    leaks = config.stash.get(_LEAKS, None)
    if not figures and leaks is None:
        return
    write = terminalreporter.write_line
    terminalreporter.section('reliability figures')
    if leaks is not None:
        write(f'leak check: {leaks["tests"]} tests, {leaks["threads"]} threads and {leaks["processes"]} child '
              f'processes leaked')
    for section, lines in figures.items():
        write(f'{section}:')
        if isinstance(lines, dict):
            lines = [f'{key}: ' + ', '.join(f'{name}={value:.1f}' if isinstance(value, float) else f'{name}={value}'
                                            for name, value in totals.items()) for key, totals in lines.items()]
        for line in lines:
            write(f'  {line}')


@pytest.fixture(scope='session')
def small_dataset_url(tmp_path_factory) -> str:
    """A Petastorm dataset of ``SMALL_ROWS`` rows in several files and row groups."""
    url = 'file://' + str(tmp_path_factory.mktemp('reliability') / 'small')
    result = write_small_dataset(url)
    assert sum(len(v) for v in result.row_groups.values()) >= 6, 'the suite needs several row groups'
    return url


@pytest.fixture(scope='session')
def plain_parquet_url(tmp_path_factory) -> str:
    """A plain Parquet store (no Petastorm metadata) of ``SMALL_ROWS`` rows: 2 files of 7-row row groups."""
    root = tmp_path_factory.mktemp('reliability') / 'plain'
    root.mkdir()
    half = SMALL_ROWS // 2
    for part, (lo, hi) in enumerate([(0, half), (half, SMALL_ROWS)]):
        ids = np.arange(lo, hi, dtype=np.int64)
        table = pa.table({'id': ids, 'value': ids.astype(np.float64) / 2})
        pq.write_table(table, root / f'part-{part}.parquet', row_group_size=7)
    return 'file://' + str(root)
