"""Reading a scalar store from an S3-compatible server on loopback vs from local disk, in one run, same data.

The store (plain Parquet, N rows x 10 scalar columns, several files of several row groups) is written once to a
local directory and once to ``s3://`` on a moto server started here (127.0.0.1, free port). Each case reads it with
``make_batch_reader`` (thread pool) and is timed as the median of --repeats runs:

  all columns: every column, so the same bytes cross the network as are read from disk;
  one column:  one of the ten, where ranged requests keep the transfer to about a tenth.

Then the local disk cache (``cache_type='local-disk'``) on S3: a first epoch that fills the cache, and a second
epoch (a new reader over the same cache directory) that reads every row group from local disk.

Then the time to the first batch of ``make_batch_reader`` (reader creation included) for local and S3, with the thread
and the process pool: process-pool workers are fresh interpreters, so this shows what their start-up costs.

The last line is ``s3 / local time ratio: X.XX`` for the all-columns case.

Usage: python benchmarks/storage_bench.py [--quick] [--rows N] [--repeats R] [--workers W]
"""

from __future__ import annotations

import argparse
import os
import posixpath
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm import make_batch_reader
from petastorm.fs import path_to_url, resolve_url

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))
from support.s3_loopback import BUCKET, MotoServer  # noqa: E402

COLUMNS = 10


def make_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    columns = {'id': np.arange(rows, dtype=np.int64)}
    for i in range(1, COLUMNS):
        if i % 3 == 0:
            columns[f'c{i}'] = rng.integers(0, 1000, rows, dtype=np.int32)
        else:
            columns[f'c{i}'] = rng.random(rows)
    return pa.table(columns)


def write_store(url: str, table: pa.Table, storage_options: dict | None, files: int) -> None:
    fs, root = resolve_url(url, storage_options)
    fs.create_dir(root, recursive=True)
    per_file = -(-table.num_rows // files)
    for index in range(files):
        part = table.slice(index * per_file, per_file)
        with fs.open_output_stream(posixpath.join(root, f'part-{index:03d}.parquet')) as stream:
            pq.write_table(part, stream, row_group_size=max(1, per_file // 4))


def read_time(url: str, storage_options: dict | None, columns: list[str] | None, workers: int,
              expected_rows: int, **reader_args: object) -> float:
    start = time.perf_counter()
    with make_batch_reader(url, schema_fields=columns, storage_options=storage_options, reader_pool_type='thread',
                           workers_count=workers, **reader_args) as reader:
        rows = sum(len(batch[0]) for batch in reader)
    elapsed = time.perf_counter() - start
    if rows != expected_rows:
        raise RuntimeError(f'read {rows} rows from {url}, expected {expected_rows}')
    return elapsed


# The read cases: every column (as many bytes cross the network as come from disk), or one of the ten.
READ_CASES = (('all columns', None), ('one column', ['c1']))


def write_local_and_s3(table: pa.Table, directory: str, storage_options: dict) -> tuple[str, str]:
    """Write ``table`` as a store under ``directory`` and as one in the moto server's bucket: ``(local, s3)`` URLs."""
    local_url, s3_url = path_to_url(os.path.join(directory, 'store')), f's3://{BUCKET}/store'
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True, **storage_options).mkdir(BUCKET)  # pyarrow's client makes no buckets
    write_store(local_url, table, None, files=4)
    write_store(s3_url, table, storage_options, files=4)
    return local_url, s3_url


def median_read_times(local_url: str, s3_url: str, storage_options: dict, workers: int, rows: int,
                      repeats: int) -> dict[str, tuple[float, float]]:
    """``{case: (local seconds, s3 seconds)}``, each the median of ``repeats`` whole reads."""
    return {case: (statistics.median(read_time(local_url, None, columns, workers, rows) for _ in range(repeats)),
                   statistics.median(read_time(s3_url, storage_options, columns, workers, rows)
                                     for _ in range(repeats)))
            for case, columns in READ_CASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='100k rows, 1 repeat (a smoke run)')
    parser.add_argument('--rows', type=int, default=1_000_000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--workers', type=int, default=4)
    args = parser.parse_args()
    rows = 100_000 if args.quick else args.rows
    repeats = 1 if args.quick else args.repeats
    warnings.simplefilter('ignore', UserWarning)

    table = make_table(rows)
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as moto:
        options = moto.storage_options()
        local_url, s3_url = write_local_and_s3(table, tmp, options)
        size_mb = sum(os.path.getsize(os.path.join(tmp, 'store', f)) for f in os.listdir(os.path.join(tmp, 'store')))
        size_mb /= 1024 * 1024

        print(f'scalar store: {rows:,} rows x {COLUMNS} columns, {size_mb:.1f} MB in 4 Parquet files; '
              f'make_batch_reader, thread pool, {args.workers} workers; median of {repeats}')
        print('| case | local s | s3 s | local rows/s | s3 rows/s | s3 / local |')
        print('|---|---|---|---|---|---|')
        ratios = {}
        for case, (local, remote) in median_read_times(local_url, s3_url, options, args.workers, rows,
                                                       repeats).items():
            ratios[case] = remote / local
            print(f'| {case} | {local:.3f} | {remote:.3f} | {rows / local:,.0f} | {rows / remote:,.0f} | '
                  f'{remote / local:.2f} |')
        print()
        disk_cache_epochs(s3_url, options, args.workers, rows, repeats, tmp)
        print()
        first_row_times(local_url, s3_url, options, args.workers, repeats)
    print(f's3 / local time ratio: {ratios["all columns"]:.2f}')


def disk_cache_epochs(s3_url: str, options: dict, workers: int, rows: int, repeats: int, tmp: str) -> None:
    """Epoch times of S3 reads through the local disk cache: the first fills it, the second is served by it."""
    first, second = [], []
    for index in range(repeats):
        cache = {'cache_type': 'local-disk', 'cache_location': os.path.join(tmp, f'cache-{index}'),
                 'cache_size_limit': 10 ** 10, 'cache_row_size_estimate': 100,
                 'cache_extra_settings': {'cleanup': False}}  # kept for the second epoch's reader
        first.append(read_time(s3_url, options, None, workers, rows, **cache))
        second.append(read_time(s3_url, options, None, workers, rows, **cache))
    uncached = statistics.median(read_time(s3_url, options, None, workers, rows) for _ in range(repeats))
    print(f'local disk cache on s3, all columns, median of {repeats}')
    print('| epoch | s | vs s3 without cache |')
    print('|---|---|---|')
    print(f'| no cache | {uncached:.3f} | 1.00 |')
    for name, times in (('1st (fills the cache)', first), ('2nd (from the cache)', second)):
        print(f'| {name} | {statistics.median(times):.3f} | {statistics.median(times) / uncached:.2f} |')


def first_row_time(url: str, storage_options: dict | None, pool: str, workers: int) -> float:
    start = time.perf_counter()
    with make_batch_reader(url, storage_options=storage_options, reader_pool_type=pool,
                           workers_count=workers) as reader:
        next(reader)
        return time.perf_counter() - start


def first_row_times(local_url: str, s3_url: str, options: dict, workers: int, repeats: int) -> None:
    """Seconds from make_batch_reader to its first batch, local vs S3, thread vs process pool (runs interleaved)."""
    cases = [(pool, where) for pool in ('thread', 'process') for where in ('local', 's3')]
    times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for _ in range(repeats):
        for pool, where in cases:
            url, storage_options = (local_url, None) if where == 'local' else (s3_url, options)
            times[pool, where].append(first_row_time(url, storage_options, pool, workers))
    print(f'time to the first batch of make_batch_reader, {workers} workers, median of {repeats}')
    print('| pool | local s | s3 s |')
    print('|---|---|---|')
    for pool in ('thread', 'process'):
        print(f'| {pool} | {statistics.median(times[pool, "local"]):.2f} | '
              f'{statistics.median(times[pool, "s3"]):.2f} |')


if __name__ == '__main__':
    main()
