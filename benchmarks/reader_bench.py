"""Reader throughput next to its limits, measured in one run on the same data.

Cases (each a median of --repeats runs):
  scalars: make_batch_reader over a plain Parquet store of N rows x 10 columns
           vs a raw pyarrow.dataset scan of the same columns into numpy (the limit).
  hello:   make_reader over the hello-world schema (png 128x256x3 + uint8 ndarray (4,128,30,3))
           vs the decode limit: pyarrow read + per-row cv2.imdecode/np.load, one process per core.
  mnist:   make_reader over 28x28 uint8 ndarray + label rows vs the same decode limit.
  process pool vs thread pool on hello.

Usage: python benchmarks/reader_bench.py [--quick] [--cases scalars,hello,mnist] [--data DIR]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from bench_datasets import HelloSchema, MnistSchema, hello_rows, mnist_rows, timed_passes

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.etl.dataset_metadata import load_row_groups


def make_data(root, quick):
    paths = {}
    scalars = os.path.join(root, 'scalars')
    n_scalar = 500_000 if quick else 5_000_000
    if not os.path.exists(scalars):
        rng = np.random.default_rng(0)
        os.makedirs(scalars)
        chunk = 1_000_000 if not quick else 250_000
        for part, start in enumerate(range(0, n_scalar, chunk)):
            n = min(chunk, n_scalar - start)
            cols = {'id': np.arange(start, start + n, dtype=np.int64)}
            for c in range(9):
                cols[f'f{c}'] = rng.random(n) if c % 2 else rng.integers(0, 1000, n, dtype=np.int32)
            pq.write_table(pa.table(cols), os.path.join(scalars, f'part-{part:03d}.parquet'), row_group_size=250_000)
    paths['scalars'] = scalars
    hello = os.path.join(root, 'hello')
    if not os.path.exists(hello):
        write_dataset('file://' + hello, HelloSchema, hello_rows(300 if quick else 2000), row_group_size_mb=16)
    paths['hello'] = hello
    mnist = os.path.join(root, 'mnist')
    if not os.path.exists(mnist):
        write_dataset('file://' + mnist, MnistSchema, mnist_rows(10_000 if quick else 60_000), row_group_size_mb=4)
    paths['mnist'] = mnist
    return paths


def raw_scan(path):
    n = 0
    for batch in ds.dataset(path, format='parquet').to_batches():
        for column in batch.columns:
            column.to_numpy(zero_copy_only=False)
        n += batch.num_rows
    return n


def batch_reader(path, workers, pool='thread'):
    n = 0
    with make_batch_reader('file://' + path, reader_pool_type=pool, workers_count=workers,
                           shuffle_row_groups=False) as reader:
        for batch in reader:
            n += len(batch.id)
    return n


def row_reader_rate(path, workers, pool, repeats):
    """Steady-state rows/s of one reader (worker start-up excluded): median over ``repeats`` passes."""
    with make_reader('file://' + path, reader_pool_type=pool, workers_count=workers, num_epochs=None) as reader:
        rows_per_pass = sum(p.num_rows for p in load_row_groups('file://' + path))
        for _ in range(min(rows_per_pass, 200)):  # warm up: workers started, caches filled
            next(reader)
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(rows_per_pass):
                next(reader)
            rates.append(rows_per_pass / (time.perf_counter() - start))
    return statistics.median(rates)


def _decode_item(args):
    import cv2

    cv2.setNumThreads(1)
    path, row_group, image_columns, array_columns = args
    table = pq.ParquetFile(path).read_row_group(row_group, columns=image_columns + array_columns)
    n = 0
    for name in image_columns:
        for payload in table.column(name).to_pylist():
            cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)
    for name in array_columns:
        for payload in table.column(name).to_pylist():
            np.load(io.BytesIO(payload))
            n += 1
    return table.num_rows


def decode_limit(path, image_columns, array_columns, pool):
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith('.parquet'))
    items = [(f, i, image_columns, array_columns) for f in files for i in range(pq.ParquetFile(f).num_row_groups)]
    return sum(pool.map(_decode_item, items, chunksize=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='small data, one repeat (smoke test)')
    parser.add_argument('--cases', default='scalars,hello,mnist')
    parser.add_argument('--data', default=None, help='where to keep the generated datasets')
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    root = args.data or tempfile.mkdtemp(prefix='petastorm-bench-')
    paths = make_data(root, args.quick)
    cases = args.cases.split(',')
    cores = os.cpu_count() or 1
    rows = []
    if 'scalars' in cases:
        limit = timed_passes(lambda: raw_scan(paths['scalars']), repeats)
        for workers in (1, 2, 10):
            ours = timed_passes(lambda w=workers: batch_reader(paths['scalars'], w), repeats)
            rows.append((f'scalars make_batch_reader thread w{workers}', 'rows/s', ours, 'pyarrow scan', limit))
    with mp.get_context('spawn').Pool(cores) as pool:
        for name, images, arrays in (('hello', ['image1'], ['array_4d']), ('mnist', [], ['image'])):
            if name not in cases:
                continue
            decode_limit(paths[name], images, arrays, pool)  # warm up the decoder processes
            limit = timed_passes(lambda n=name, i=images, a=arrays: decode_limit(paths[n], i, a, pool), repeats)
            for pool_kind, workers in (('thread', 2), ('thread', 4), ('process', 2)):
                ours = row_reader_rate(paths[name], workers, pool_kind, repeats)
                rows.append((f'{name} make_reader {pool_kind} w{workers}', 'rows/s', ours,
                             f'decode limit ({cores} procs)', limit))
    print(f'| case | unit | ours | limit | limit value | ours / limit |  (python {sys.version.split()[0]}, '
          f'{cores} cores, median of {repeats})')
    print('|---|---|---:|---|---:|---:|')
    for case, unit, ours, limit_name, limit in rows:
        print(f'| {case} | {unit} | {ours:,.0f} | {limit_name} | {limit:,.0f} | {ours / limit:.2f} |')


if __name__ == '__main__':
    main()
