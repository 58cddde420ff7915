"""``NdarrayCodec`` (``.npy`` blobs) next to ``ArrowTensorCodec`` (Arrow tensor columns) on the same arrays.

Columns: the MNIST-like ``image`` (28x28 uint8, mostly zeros like handwritten digits), the hello-world
``array_4d`` (random uint8, 4x128x30x3), the latter both with a fixed shape (``fixed_shape_tensor``) and with the
hello-world schema's shape ``(None, 128, 30, None)`` (``variable_shape_tensor``; ``NdarrayCodec`` stores the same
bytes for both shapes), and 64x64 float32 features (normal noise). Each dataset is written once per codec by
``write_dataset`` with its default compression (snappy). For each column the table shows

* ``decode rows/s``: ``codec.decode_column`` over each row group's column as read from the files (for
  ``NdarrayCodec`` its vectorized path that parses one ``.npy`` header per column);
* ``batch reader rows/s``: a whole pass of ``make_batch_reader`` (dummy pool: one thread, no overlap) over the
  dataset, reading and decoding;
* ``bytes on disk``: the data files' size.

Every figure is the median of several rounds, the two codecs measured alternately in the same run; ``ratio`` is
tensor / ndarray (above 1 = the tensor codec is faster; for bytes, above 1 = larger).

    python benchmarks/tensor_bench.py            # full run (about a minute)
    python benchmarks/tensor_bench.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from petastorm import make_batch_reader, write_dataset
from petastorm.codecs import ArrowTensorCodec, NdarrayCodec
from petastorm.unischema import Unischema, UnischemaField


@dataclass(frozen=True)
class Column:
    """One benchmarked column: its name, numpy type, schema shape, how many rows, and how a value is made."""

    label: str
    dtype: type
    shape: tuple[int | None, ...]
    rows: int
    make_value: Callable[[np.random.Generator], np.ndarray]


def _digit(rng: np.random.Generator) -> np.ndarray:
    """A 28x28 image that is zero except for a bright stroke area, as in MNIST."""
    image = np.zeros((28, 28), np.uint8)
    top, left = rng.integers(4, 12, size=2)
    patch = rng.integers(0, 256, size=(12, 12), dtype=np.uint8)
    image[top:top + 12, left:left + 12] = np.where(patch > 120, patch, 0)
    return image


def _array_4d(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 255, size=(4, 128, 30, 3), dtype=np.uint8)


def _features(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((64, 64)).astype(np.float32)


def _columns(quick: bool) -> list[Column]:
    scale = 10 if quick else 1
    return [Column('mnist image (28, 28) uint8', np.uint8, (28, 28), 20000 // scale, _digit),
                   Column('array_4d (4, 128, 30, 3) uint8', np.uint8, (4, 128, 30, 3), 600 // scale, _array_4d),
                   Column('array_4d (None, 128, 30, None) uint8', np.uint8, (None, 128, 30, None), 600 // scale,
                          _array_4d),
                   Column('features (64, 64) float32', np.float32, (64, 64), 4000 // scale, _features)]


def _write(root: str, column: Column, codec: object, values: list[np.ndarray]) -> str:
    schema = Unischema('Bench', [UnischemaField('id', np.int64, (), None, False),
                                 UnischemaField('value', column.dtype, column.shape, codec, False)])
    url = f'file://{root}/{type(codec).__name__}'
    write_dataset(url, schema, ({'id': i, 'value': v} for i, v in enumerate(values)), row_group_size_mb=16,
                  legacy_metadata=False, progress=False)
    return url


def _median_rate(rows: int, work: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return rows / statistics.median(times)


def _read_all(url: str) -> int:
    count = 0
    with warnings.catch_warnings():  # a Petastorm dataset read by make_batch_reader: intended here
        warnings.simplefilter('ignore', UserWarning)
        reader = make_batch_reader(url, schema_fields=['value'], reader_pool_type='dummy')
    with reader:
        for batch in reader:
            count += len(batch.value)
    return count


def _measure(column: Column, rounds: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(0)
    values = [column.make_value(rng) for _ in range(column.rows)]
    codecs = {'ndarray': NdarrayCodec(), 'tensor': ArrowTensorCodec()}
    results: dict[str, dict[str, float]] = {name: {} for name in codecs}
    with tempfile.TemporaryDirectory() as root:
        urls = {name: _write(root, column, codec, values) for name, codec in codecs.items()}
        files = {name: glob.glob(url[len('file://'):] + '/*.parquet') for name, url in urls.items()}
        # One table per row group: what a reader hands to decode_column.
        tables = {name: [pq.ParquetFile(path).read_row_group(i, columns=['value']) for path in paths
                         for i in range(pq.ParquetFile(path).num_row_groups)] for name, paths in files.items()}
        fields = {name: UnischemaField('value', column.dtype, column.shape, codec, False)
                  for name, codec in codecs.items()}

        def decode(name: str) -> None:
            for table in tables[name]:
                decoded = codecs[name].decode_column(fields[name], table.column('value'))
                if len(decoded) != table.num_rows:
                    raise AssertionError('decoded the wrong number of rows')

        for name in codecs:  # warm up both paths (imports, page cache) before timing either
            decode(name)
            _read_all(urls[name])
        for name in codecs:
            results[name]['decode'] = _median_rate(column.rows, lambda n=name: decode(n), rounds)
        for name in codecs:
            results[name]['reader'] = _median_rate(column.rows, lambda n=name: _read_all(urls[n]), rounds)
        for name in codecs:
            results[name]['bytes'] = float(sum(os.path.getsize(p) for p in files[name]))
    return {metric: (results['ndarray'][metric], results['tensor'][metric]) for metric in ('decode', 'reader', 'bytes')}


def main(argv: list[str] | None = None) -> None:
    """Print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='fewer rows and rounds (a smoke run)')
    parser.add_argument('--rounds', type=int, default=None, help='rounds per figure (default 7, 2 with --quick)')
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 7)
    print('| column | rows | metric | NdarrayCodec | ArrowTensorCodec | ratio |')
    print('|---|---:|---|---:|---:|---:|')
    names = {'decode': 'decode rows/s', 'reader': 'batch reader rows/s', 'bytes': 'bytes on disk'}
    for column in _columns(args.quick):
        for metric, (ndarray, tensor) in _measure(column, rounds).items():
            print(f'| {column.label} | {column.rows} | {names[metric]} | {ndarray:,.0f} | {tensor:,.0f} | '
                  f'{tensor / ndarray:.2f} |')


if __name__ == '__main__':
    main()
