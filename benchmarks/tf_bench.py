"""TensorFlow dataset throughput next to the plain reader it wraps, measured in one process on the same data.

Cases (reader and dataset runs alternate back to back; rates are medians of --repeats runs):
  scalars  make_petastorm_dataset(make_batch_reader(N x 10 scalar columns)) vs make_batch_reader alone; the
           target is a steady-state ratio of at least 0.7 (the original's TF path ran at about half its Python
           path).
  mnist    make_petastorm_dataset(make_reader(28x28 uint8 + label)).batch(64) vs make_reader alone (rows cut by
           Dataset.unbatch() inside TensorFlow against one namedtuple per row in Python).
Two rates per case: "steady" counts rows for --seconds after a warm-up (pool and TensorFlow start-up
excluded, like reader_bench.py); "pass" times whole single-epoch passes including every start-up cost
(TensorFlow builds and traces the dataset's functions once per dataset, a few tenths of a second).

Usage: python benchmarks/tf_bench.py [--quick] [--cases scalars,mnist] [--data-root DIR] [--repeats N]
With --data-root, stores named scalars and mnist_like (or mnist) are used when present, else written there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

from torch_bench import make_data

from petastorm import make_batch_reader, make_reader
from petastorm.tf_utils import make_petastorm_dataset

TARGET_RATIO = 0.7
TF_BATCH = 64  # rows per batch when a row reader's dataset is batched


def _reader_counts(reader):
    """Rows of each item the plain reader yields."""
    if reader.batched_output:
        for batch in reader:
            yield len(batch[0])
    else:
        for _ in reader:
            yield 1


def _dataset_counts(reader):
    """Rows of each element of the reader's dataset (a row reader's dataset batched by TF_BATCH)."""
    dataset = make_petastorm_dataset(reader)
    if not reader.batched_output:
        dataset = dataset.batch(TF_BATCH)
    for element in dataset:
        yield int(element[0].shape[0])


def _full_pass(factory, url, workers, counts):
    start = time.perf_counter()
    with factory(url, num_epochs=1, workers_count=workers) as reader:
        rows = sum(counts(reader))
    return rows, rows / (time.perf_counter() - start)


def _steady(factory, url, workers, counts, seconds):
    with factory(url, num_epochs=None, workers_count=workers) as reader:
        stream = counts(reader)
        warm_until = time.perf_counter() + min(1.0, seconds / 2)
        while time.perf_counter() < warm_until:
            next(stream)
        rows, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            rows += next(stream)
        rate = rows / (time.perf_counter() - start)
        stream.close()
        return rate


def compare(factory, url, workers, repeats, seconds):
    """``{(kind, 'reader'|'dataset'): median rows/s}`` for kind 'steady' and 'pass', runs alternating."""
    rates = {}
    sources = {'reader': _reader_counts, 'dataset': _dataset_counts}
    rows = {name: _full_pass(factory, url, workers, counts)[0] for name, counts in sources.items()}  # warm-up
    if rows['reader'] != rows['dataset']:
        raise RuntimeError(f'the dataset delivered {rows["dataset"]} rows, the reader {rows["reader"]}')
    for _ in range(repeats):
        for name, counts in sources.items():
            rates.setdefault(('steady', name), []).append(_steady(factory, url, workers, counts, seconds))
        for name, counts in sources.items():
            rates.setdefault(('pass', name), []).append(_full_pass(factory, url, workers, counts)[1])
    return {key: statistics.median(values) for key, values in rates.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='small data, one repeat (smoke test)')
    parser.add_argument('--cases', default='scalars,mnist')
    parser.add_argument('--data-root', default=None, help='where the stores are (or are written)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--workers', type=int, default=4, help='reader workers_count (thread pool)')
    parser.add_argument('--seconds', type=float, default=4.0, help='measuring time of a steady-state run')
    args = parser.parse_args(argv)
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    warnings.filterwarnings('ignore', category=UserWarning)
    repeats = 1 if args.quick else args.repeats
    seconds = 0.5 if args.quick else args.seconds
    cases = args.cases.split(',')
    root = args.data_root or tempfile.mkdtemp(prefix='petastorm-tf-bench-')
    paths = make_data(root, args.quick, cases)
    factories = {'scalars': make_batch_reader, 'mnist': make_reader}
    print(f'| case | rate | plain reader rows/s | make_petastorm_dataset rows/s | dataset / reader |  '
          f'(python {sys.version.split()[0]}, {os.cpu_count()} cores, {args.workers} workers, median of {repeats})')
    print('|---|---|---:|---:|---:|')
    for case in cases:
        rates = compare(factories[case], 'file://' + paths[case], args.workers, repeats, seconds)
        for kind in ('steady', 'pass'):
            reader_rate, dataset_rate = rates[(kind, 'reader')], rates[(kind, 'dataset')]
            ratio = dataset_rate / reader_rate
            verdict = ''
            if case == 'scalars' and kind == 'steady':
                verdict = f' (target >= {TARGET_RATIO}: {"met" if ratio >= TARGET_RATIO else "MISSED"})'
            print(f'| {case} | {kind} | {reader_rate:,.0f} | {dataset_rate:,.0f} | {ratio:.2f}{verdict} |')


if __name__ == '__main__':
    main()
