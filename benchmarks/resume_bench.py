"""What saving the position every step costs: a pass of the loader with and without state_dict() after each batch.

On the hello-world store (PNG images and 4-d arrays, the README's example), DataLoader(make_reader(...),
batch_size=64): the step time of a pass without a state and with ``loader.state_dict()`` after every batch, with
no shuffling buffer and with one of 512 rows (whose rows the state lists as pending). The two variants run
interleaved, ``--repeats`` times each; the table gives medians of the step times and their ratio, and, measured
inside the saving passes, the time spent in ``state_dict()`` as a share of the rest of the step (goal: under 2%):
the share is what the calls cost, free of the run-to-run noise of whole passes on a shared machine. The calls
are timed twice: on the clock, which includes waiting for the GIL while the reader's threads hold it (the
interpreter switches threads every 5 ms, so a call of a tenth of a millisecond may wait several), and in the
main thread's CPU time, which is what the calls take from the step.

Usage: python benchmarks/resume_bench.py [--quick] [--repeats N] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from bench_datasets import HelloSchema, hello_rows

from petastorm import make_reader, write_dataset


def one_pass(url: str, capacity: int, save_every_step: bool) -> tuple[float, float, float, int, int]:
    """``(seconds of the pass, seconds inside state_dict() on the clock and in CPU time, steps, largest state as JSON
    bytes)`` of one pass."""
    from petastorm.pytorch import DataLoader

    in_state, cpu_in_state, largest = 0.0, 0.0, 0
    with DataLoader(make_reader(url, reader_pool_type='thread', workers_count=2, seed=0, shuffle_rows=True),
                    batch_size=64, shuffling_queue_capacity=capacity) as loader:
        steps = 0
        start = time.perf_counter()
        for _batch in loader:
            steps += 1
            if save_every_step:
                before, cpu_before = time.perf_counter(), time.thread_time()
                state = loader.state_dict()
                in_state += time.perf_counter() - before
                cpu_in_state += time.thread_time() - cpu_before
                largest = max(largest, len(json.dumps(state)))
        seconds = time.perf_counter() - start
    return seconds, in_state, cpu_in_state, steps, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='200 rows, 3 repeats')
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--data-root', default=None)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    root = args.data_root or tempfile.mkdtemp(prefix='resume_bench_')
    path = os.path.join(root, 'hello_world')
    if not os.path.exists(path):
        write_dataset('file://' + path, HelloSchema, hello_rows(200 if args.quick else 2000), row_group_size_mb=16)
    url = 'file://' + path
    print(f'hello-world store {path}; DataLoader(make_reader(thread pool of 2), batch_size=64); '
          f'medians of {repeats} interleaved passes')
    print('| shuffling_queue_capacity | ms per step, no state | ms per step, state_dict() every step | ratio | '
          'state_dict() share of the step: clock / CPU | ms per state_dict(): clock / CPU | largest state (JSON) |')
    print('|---|---|---|---|---|---|---|')
    for capacity in (0, 512):
        one_pass(url, capacity, True)  # warm-up: page cache, lazy imports
        plain, saving, shares, cpu_shares, calls, cpu_calls, size = [], [], [], [], [], [], 0
        for _ in range(repeats):
            seconds, _, _, steps, _ = one_pass(url, capacity, False)
            plain.append(seconds / steps)
            seconds, in_state, cpu_in_state, steps, size = one_pass(url, capacity, True)
            saving.append(seconds / steps)
            shares.append(in_state / (seconds - in_state))
            cpu_shares.append(cpu_in_state / (seconds - in_state))
            calls.append(in_state / steps)
            cpu_calls.append(cpu_in_state / steps)
        a, b = statistics.median(plain), statistics.median(saving)
        print(f'| {capacity} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.3f} | {statistics.median(shares):.2%} / '
              f'{statistics.median(cpu_shares):.2%} | {statistics.median(calls) * 1e3:.3f} / '
              f'{statistics.median(cpu_calls) * 1e3:.3f} | {size:,} bytes |')


if __name__ == '__main__':
    main()
