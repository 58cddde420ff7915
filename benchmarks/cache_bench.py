"""What the local disk cache buys on a slow filesystem: epoch 1 pays the latency, epoch 2 reads local files.

The slow filesystem is pyarrow's local filesystem behind a ``PyFileSystem`` handler that waits --latency-ms
before every file it opens for reading (like the first-byte latency of an object store). Each epoch is a new
reader over the same cache directory, timed from the first item to the last (construction, which reads the
metadata, is excluded).

Rows of the table (median of --repeats epochs each):
  local, no cache:        the local speed (the target of a warm cache)
  slow, no cache:         what every epoch costs without a cache
  slow, cache, epoch 1:   cold cache (reads the slow filesystem and fills the cache)
  slow, cache, epoch 2:   warm cache

Usage: python benchmarks/cache_bench.py [--quick] [--latency-ms 50] [--data DIR] [--workers 4]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm import make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.test_util.latency_fs import SlowLocalHandler
from petastorm.unischema import Unischema, UnischemaField

BenchSchema = Unischema('CacheBenchSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (64, 64, 3), NdarrayCodec(), False),
])


def _rows(count: int):
    rng = np.random.default_rng(0)
    for i in range(count):
        yield {'id': i, 'image': rng.integers(0, 255, size=(64, 64, 3), dtype=np.uint8)}


def _epoch(url: str, workers: int, filesystem=None, cache_dir: Path | None = None) -> tuple[float, int]:
    cache = {}
    if cache_dir is not None:
        cache = {'cache_type': 'local-disk', 'cache_location': str(cache_dir), 'cache_size_limit': 8 << 30,
                 'cache_row_size_estimate': 1 << 20, 'cache_extra_settings': {'cleanup': False}}
    with make_reader(url, reader_pool_type='thread', workers_count=workers, filesystem=filesystem, **cache) as reader:
        start = time.perf_counter()
        count = sum(1 for _ in reader)
        return time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='small data, one repeat (smoke test)')
    parser.add_argument('--latency-ms', type=float, default=50.0, help='wait before each file opened for reading')
    parser.add_argument('--data', default=None, help='where to keep the dataset and the caches')
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    rows, repeats = (600, 1) if args.quick else (6000, args.repeats)
    root = Path(args.data or tempfile.mkdtemp(prefix='cache_bench_'))
    url = 'file://' + str(root / 'dataset')
    if not (root / 'dataset').exists():
        write_dataset(url, BenchSchema, _rows(rows), row_group_size_mb=0.5, file_size_mb=8)
    row_groups = sum(pq.ParquetFile(p).num_row_groups for p in (root / 'dataset').rglob('*.parquet'))
    slow = pafs.PyFileSystem(SlowLocalHandler(args.latency_ms / 1000))

    results: dict[str, list[float]] = {'local, no cache': [], 'slow, no cache': [], 'slow, cache, epoch 1': [],
                                       'slow, cache, epoch 2': []}
    for repeat in range(repeats):
        cache_dir = root / f'cache{repeat}'
        shutil.rmtree(cache_dir, ignore_errors=True)
        results['local, no cache'].append(_epoch(url, args.workers)[0])
        results['slow, no cache'].append(_epoch(url, args.workers, slow)[0])
        results['slow, cache, epoch 1'].append(_epoch(url, args.workers, slow, cache_dir)[0])
        elapsed, count = _epoch(url, args.workers, slow, cache_dir)
        results['slow, cache, epoch 2'].append(elapsed)
        if count != rows:
            raise RuntimeError(f'the cached epoch delivered {count} rows, expected {rows}')
        shutil.rmtree(cache_dir, ignore_errors=True)

    print(f'{rows} rows of 64x64x3 uint8 in {row_groups} row groups, latency {args.latency_ms:g} ms per open, '
          f'{args.workers} thread workers (python {sys.version.split()[0]}, pyarrow {pa.__version__})')
    print('| case | seconds | rows/s |')
    print('|---|---:|---:|')
    medians = {case: statistics.median(times) for case, times in results.items()}
    for case, seconds in medians.items():
        print(f'| {case} | {seconds:.3f} | {rows / seconds:,.0f} |')
    print(f'epoch 2 / epoch 1: {medians["slow, cache, epoch 2"] / medians["slow, cache, epoch 1"]:.3f}')
    print(f'epoch 2 / local, no cache: {medians["slow, cache, epoch 2"] / medians["local, no cache"]:.2f}')


if __name__ == '__main__':
    main()
