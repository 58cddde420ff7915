"""The process pool's hand-built runtime next to one built on the standard library, measured in one run.

Could ``multiprocessing`` (its ``Pool`` with a ``forkserver`` or ``spawn`` start, and
``multiprocessing.shared_memory``) replace part of :mod:`petastorm.pools`' process runtime at the same speed?
Cases, each a ratio ours / stdlib of the medians of rounds that alternate the two (above 1: ours is faster):

* ``transfer N MiB``: items/s of results holding N MiB of arrays (two arrays of N/2 MiB; N = 1, 8, 64) from
  2 workers, the consumer reading every page of each result then dropping it. Ours: ``ProcessPool``, whose
  workers reuse shared memory slots. Stdlib: ``multiprocessing.get_context('forkserver').Pool`` whose task copies
  the arrays into a new ``SharedMemory`` and returns its name; the parent attaches it, unlinks the name at once
  (nothing is left in ``/dev/shm``), wraps arrays over it without a copy and closes it once they are collected.
  Both keep 2 items per worker in flight.
* ``small results``: items/s of tiny results (a dict with one 4-element array): both pools with our default
  window of 2 items per worker (the stdlib's through ``apply_async``), then ours with 64 in flight against
  ``Pool.imap(chunksize=1)``, which submits every item at once.
* ``start-up``: seconds from creating a pool of 2 workers to its first result. Ours (a fresh interpreter per
  worker that does not re-import ``__main__``) against ``spawn`` and against ``forkserver`` with its server
  already running (the first forkserver pool of a process also starts the server: printed apart). The stdlib
  workers run the same set-up as ours (an initializer: allocator settings, one decoder thread).
* ``segment``: microseconds to create, size and map a 1 MiB segment, open and map it again by name (as the
  parent does), unlink and close it. Ours (:mod:`petastorm.pools._posix_shm`) against ``SharedMemory``.

Usage: python benchmarks/pool_bench.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import importlib
import mmap
import multiprocessing
import os
import statistics
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

WORKERS = 2
_ALIGNMENT = 64
_PAGE = 4096


class Payload:
    """A worker's context: the arrays every result copies (built once per worker process, never pickled)."""

    def __init__(self, mib: int) -> None:
        self.mib = mib
        self._arrays: dict[str, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {'mib': self.mib}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.mib = state['mib']
        self._arrays = None

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Two arrays of ``mib / 2`` MiB each (float32 and uint8), made on first use."""
        if self._arrays is None:
            half = self.mib << 19
            rng = np.random.default_rng(self.mib)
            self._arrays = {'floats': rng.standard_normal(half // 4, dtype=np.float32),
                            'bytes': rng.integers(0, 256, half, dtype=np.uint8).reshape(-1, 1024)}
        return self._arrays


def ours_transfer(payload: Payload, item: int) -> dict[str, np.ndarray]:
    """The worker function of our pool: the payload's arrays (the pool copies them into a slot)."""
    return payload.arrays


def tiny(context: Any, item: int) -> dict[str, np.ndarray]:
    """A small result (pickled through the pipe by both pools)."""
    return {'x': np.arange(4) + item}


def stdlib_tiny(item: int) -> dict[str, np.ndarray]:
    """:func:`tiny` for ``multiprocessing.Pool``."""
    return tiny(None, item)


# ------------------------------------------------------------------------------ the stdlib-based transport


class _StdlibWorker:
    """Per-process state of a ``multiprocessing.Pool`` worker (the initializer is the stdlib's way to set it)."""

    payload: Payload | None = None


def stdlib_setup() -> None:
    """``Pool`` initializer: what our worker process does before serving (its allocator settings)."""
    from petastorm.pools._worker import _keep_freed_memory

    _keep_freed_memory()


def stdlib_init(payload: Payload | None = None) -> None:
    """``Pool`` initializer: set the worker up as ours is, and keep the payload for the tasks of this process."""
    stdlib_setup()
    _StdlibWorker.payload = payload


def stdlib_transfer(item: int) -> tuple[str, list[tuple[str, str, tuple[int, ...], int]]]:
    """Copy the payload's arrays into a new SharedMemory segment; return its name and where each array lies."""
    payload = _StdlibWorker.payload
    assert payload is not None
    arrays = payload.arrays
    total = sum(-(-array.nbytes // _ALIGNMENT) * _ALIGNMENT for array in arrays.values())
    segment = shared_memory.SharedMemory(create=True, size=total)
    layout = []
    offset = 0
    for key, array in arrays.items():
        np.ndarray(array.shape, array.dtype, buffer=segment.buf, offset=offset)[...] = array
        layout.append((key, array.dtype.str, array.shape, offset))
        offset += -(-array.nbytes // _ALIGNMENT) * _ALIGNMENT
    name = segment.name
    segment.close()  # the name stays until the parent unlinks it
    return name, layout


class StdlibReceiver:
    """Parent side: arrays over attached segments without a copy; a segment is closed once its arrays are gone."""

    def __init__(self) -> None:
        self._collected: deque[shared_memory.SharedMemory] = deque()

    def receive(self, reply: tuple[str, list[tuple[str, str, tuple[int, ...], int]]]) -> dict[str, np.ndarray]:
        """The result whose arrays lie in the segment named by ``reply``; the name is unlinked at once."""
        name, layout = reply
        self.close_collected()
        segment = shared_memory.SharedMemory(name=name)
        segment.unlink()
        exporter = np.frombuffer(segment.buf, np.uint8)
        # Closed later: while the exporter is being collected its buffer is still exported.
        weakref.finalize(exporter, self._collected.append, segment)
        return {key: np.ndarray(shape, np.dtype(dtype), buffer=exporter, offset=offset)
                for key, dtype, shape, offset in layout}

    def close_collected(self) -> None:
        """Close the segments whose arrays were garbage collected."""
        while self._collected:
            self._collected.popleft().close()


def stdlib_imap(pool: Any, task: Callable[[int], Any], count: int, receive: Callable[[Any], Any] | None = None
                ) -> Iterator[Any]:
    """Results of ``task`` for items ``0..count-1`` in order, with ``2 * WORKERS`` in flight (as our pool keeps)."""
    pending: deque[Any] = deque()
    items = iter(range(count))
    for item in items:
        pending.append(pool.apply_async(task, (item,)))
        if len(pending) == 2 * WORKERS:
            break
    while pending:
        reply = pending.popleft().get()
        for item in items:
            pending.append(pool.apply_async(task, (item,)))
            break
        yield reply if receive is None else receive(reply)


# ------------------------------------------------------------------------------------------- measuring


def _read_every_page(result: dict[str, np.ndarray]) -> int:
    return sum(int(array.reshape(-1).view(np.uint8)[::_PAGE].sum()) for array in result.values())


def _rate(results: Iterator[dict[str, np.ndarray]], count: int) -> float:
    """Items/s of consuming ``count`` results, each read page by page and dropped before the next."""
    started = time.perf_counter()
    for result in results:
        _read_every_page(result)
        del result
    return count / (time.perf_counter() - started)


@dataclass
class Row:
    """One line of the table: a case, our figure, the stdlib's and which way is better."""

    case: str
    unit: str
    ours: float
    stdlib: float
    higher_is_better: bool
    stdlib_label: str = 'stdlib'

    @property
    def ratio(self) -> float:
        """Ours / stdlib, oriented so that above 1 means ours is better."""
        return self.ours / self.stdlib if self.higher_is_better else self.stdlib / self.ours


def _interleaved(rounds: int, measure_ours: Callable[[], float], measure_stdlib: Callable[[], float]
                 ) -> tuple[float, float]:
    ours, stdlib = [], []
    for round_index in range(rounds):
        # Alternate which goes first, so that a drift of the machine's load hits both alike.
        first, second = (measure_ours, measure_stdlib) if round_index % 2 == 0 else (measure_stdlib, measure_ours)
        a, b = first(), second()
        ours.append(a if first is measure_ours else b)
        stdlib.append(b if first is measure_ours else a)
    return statistics.median(ours), statistics.median(stdlib)


def transfer_row(bench: Any, mib: int, rounds: int, quick: bool) -> Row:
    """Results of ``mib`` MiB: one pool of each kind, measured in alternating rounds."""
    from petastorm.pools import make_pool

    count = max(4, (64 if quick else 256) // mib)
    payload = bench.Payload(mib)
    receiver = StdlibReceiver()
    forkserver = multiprocessing.get_context('forkserver')
    with make_pool('process', WORKERS) as ours, \
            forkserver.Pool(WORKERS, initializer=bench.stdlib_init, initargs=(payload,)) as stdlib:
        ours.start(bench.ours_transfer, payload)
        _rate(ours.imap(range(2 * WORKERS)), 2 * WORKERS)  # warm up: workers ready, slots made
        _rate(stdlib_imap(stdlib, bench.stdlib_transfer, 2 * WORKERS, receiver.receive), 2 * WORKERS)
        ours_rate, stdlib_rate = _interleaved(
            rounds, lambda: _rate(ours.imap(range(count)), count),
            lambda: _rate(stdlib_imap(stdlib, bench.stdlib_transfer, count, receiver.receive), count))
    receiver.close_collected()
    return Row(f'transfer {mib} MiB', 'items/s', ours_rate, stdlib_rate, True)


def small_results_rows(bench: Any, rounds: int, quick: bool) -> list[Row]:
    """Items/s of tiny results: both with our default window, then ours with a wide one against ``Pool.imap``."""
    from petastorm.pools import make_pool

    count = 500 if quick else 3000
    wide = 64

    def measure(results: Callable[[], Iterator[Any]]) -> float:
        started = time.perf_counter()
        for _ in results():
            pass
        return count / (time.perf_counter() - started)

    with make_pool('process', WORKERS) as ours, make_pool('process', WORKERS, max_in_flight=wide) as ours_wide, \
            multiprocessing.get_context('forkserver').Pool(WORKERS, initializer=bench.stdlib_init) as stdlib:
        ours.start(bench.tiny, None)
        ours_wide.start(bench.tiny, None)
        for warm_up in (ours.imap(range(20)), ours_wide.imap(range(20)), stdlib_imap(stdlib, bench.stdlib_tiny, 20)):
            list(warm_up)
        windowed = _interleaved(rounds, lambda: measure(lambda: ours.imap(range(count))),
                                lambda: measure(lambda: stdlib_imap(stdlib, bench.stdlib_tiny, count)))
        unbounded = _interleaved(
            rounds, lambda: measure(lambda: ours_wide.imap(range(count))),
            lambda: measure(lambda: stdlib.imap(bench.stdlib_tiny, range(count), chunksize=1)))
    return [Row(f'small results, {2 * WORKERS} in flight', 'items/s', *windowed, True),
            Row(f'small results, ours {wide} in flight', 'items/s', *unbounded, True, 'stdlib Pool.imap, all')]


def _ours_start(bench: Any) -> float:
    from petastorm.pools import make_pool

    started = time.perf_counter()
    pool = make_pool('process', WORKERS)
    pool.start(bench.tiny, None)
    next(iter(pool.imap([0])))
    elapsed = time.perf_counter() - started
    pool.join()
    return elapsed


def _stdlib_start(bench: Any, method: str) -> float:
    started = time.perf_counter()
    pool = multiprocessing.get_context(method).Pool(WORKERS, initializer=bench.stdlib_init)
    pool.apply(bench.stdlib_tiny, (0,))
    elapsed = time.perf_counter() - started
    pool.close()
    pool.join()
    return elapsed


def start_rows(bench: Any, rounds: int) -> tuple[list[Row], float]:
    """Start-up against spawn and against a running forkserver; also the forkserver's own first start."""
    first_forkserver = _stdlib_start(bench, 'forkserver')  # starts the server if this process has none yet
    rows = []
    for method in ('spawn', 'forkserver'):
        ours, stdlib = _interleaved(rounds, lambda: _ours_start(bench), lambda m=method: _stdlib_start(bench, m))
        rows.append(Row(f'start-up ({method})', 's to first result', ours, stdlib, False, f'stdlib {method}'))
    return rows, first_forkserver


def _ours_segment_cycle(name: str) -> None:
    from petastorm.pools._posix_shm import create_segment, open_segment, unlink_segment

    fd = create_segment(name)
    os.ftruncate(fd, 1 << 20)
    created = mmap.mmap(fd, 1 << 20)
    os.close(fd)
    fd = open_segment(name)
    opened = mmap.mmap(fd, 0)
    os.close(fd)
    unlink_segment(name)
    opened.close()
    created.close()


def _stdlib_segment_cycle(name: str) -> None:
    created = shared_memory.SharedMemory(name=name, create=True, size=1 << 20)
    opened = shared_memory.SharedMemory(name=name)
    opened.unlink()  # also unregisters the name from the resource tracker
    opened.close()
    created.close()


def segment_row(rounds: int, quick: bool) -> Row:
    """Microseconds per segment life cycle."""
    count = 200 if quick else 2000
    prefix = f'psmbench{os.getpid():x}_'

    def measure(cycle: Callable[[str], None]) -> float:
        started = time.perf_counter()
        for index in range(count):
            cycle(f'{prefix}{index:x}')
        return (time.perf_counter() - started) / count * 1e6

    ours, stdlib = _interleaved(rounds, lambda: measure(_ours_segment_cycle), lambda: measure(_stdlib_segment_cycle))
    return Row('segment create+open+unlink', 'us', ours, stdlib, False)


def _load_line() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return 'load average: unknown'
    return f'load average: {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs'


def main(argv: list[str] | None = None) -> None:
    """Run every case and print a markdown table of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--quick', action='store_true', help='fewer items and rounds (a smoke run)')
    parser.add_argument('--rounds', type=int, default=None, help='rounds per case (default 5, quick 2)')
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    # The worker functions must be importable by name in the workers, as a module rather than __main__.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    bench = importlib.import_module('pool_bench')
    print(f'{_load_line()}; python {sys.version.split()[0]}, numpy {np.__version__}; {WORKERS} workers, '
          f'{rounds} rounds')
    rows = [transfer_row(bench, mib, rounds, args.quick) for mib in (1, 8, 64)]
    rows.extend(small_results_rows(bench, rounds, args.quick))
    start, first_forkserver = start_rows(bench, rounds)
    rows.extend(start)
    rows.append(segment_row(rounds, args.quick))
    print()
    print('| case | unit | ours | stdlib | ratio (above 1: ours better) |')
    print('|---|---|---:|---:|---:|')
    for row in rows:
        print(f'| {row.case} | {row.unit} | {row.ours:,.4g} | {row.stdlib:,.4g} ({row.stdlib_label}) | '
              f'{row.ratio:.2f} |')
    print()
    print(f'first forkserver pool of this process (starts the server): {first_forkserver:.3f} s to first result')
    print(_load_line())


if __name__ == '__main__':
    main()
