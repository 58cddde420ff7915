"""Codec throughput next to the raw library calls on the same data.

For each field kind, measures rows per second of

* ``encode``: ``codec.encode`` per row, against the plain library encoder (``cv2.imencode`` after RGB->BGR,
  or ``np.save``);
* ``decode``: ``codec.decode`` per row, against the plain decoder on the same bytes (``cv2.imdecode`` +
  ``cvtColor``, or ``np.load``);
* ``decode_column``: ``codec.decode_column`` over a pyarrow binary column, against the plain decoder looped over
  the same payloads plus ``np.stack`` (the same output).

Each number is the median of several repeats. Prints a markdown table; ``ratio`` is ours / raw (1.0 = as fast as
the library, above 1 = faster).

    python benchmarks/codecs_bench.py           # full run (about 20 s)
    python benchmarks/codecs_bench.py --quick   # smoke run
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs import CompressedImageCodec, NdarrayCodec
from petastorm.unischema import UnischemaField


@dataclass
class Case:
    name: str
    field: UnischemaField
    make_value: Callable[[np.random.Generator], np.ndarray]
    raw_encode: Callable[[np.ndarray], bytes]
    raw_decode: Callable[[bytes], np.ndarray]


def _hello_world_image(rng: np.random.Generator) -> np.ndarray:
    """A 128x256 RGB image of smooth gradients plus mild noise: compressible, like a photo."""
    y, x = np.mgrid[0:128, 0:256].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=3)
    planes = [127 + 90 * np.sin(x / (20 + 7 * c) + y / (31 + 5 * c) + phase[c]) for c in range(3)]
    image = np.stack(planes, axis=-1) + rng.normal(0, 4, size=(128, 256, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _npy_save(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value)
    return buffer.getvalue()


def _npy_load(payload: bytes) -> np.ndarray:
    return np.load(io.BytesIO(payload))


def _cases() -> list[Case]:
    import cv2

    def png_encode(value: np.ndarray) -> bytes:
        return cv2.imencode('.png', cv2.cvtColor(value, cv2.COLOR_RGB2BGR))[1].tobytes()

    def png_decode(payload: bytes) -> np.ndarray:
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)

    return [
        Case('png uint8 (128,256,3)', UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png')),
             _hello_world_image, png_encode, png_decode),
        Case('ndarray uint8 (4,128,30,3)',
             UnischemaField('array_4d', np.uint8, (None, 128, 30, None), NdarrayCodec()),
             lambda rng: rng.integers(0, 255, size=(4, 128, 30, 3), dtype=np.uint8), _npy_save, _npy_load),
        Case('ndarray uint8 (28,28) mnist', UnischemaField('image', np.uint8, (28, 28), NdarrayCodec()),
             lambda rng: rng.integers(0, 255, size=(28, 28), dtype=np.uint8), _npy_save, _npy_load),
    ]


def _median_rates(ours: Callable[[], Any], raw: Callable[[], Any], rows: int, repeats: int) -> tuple[float, float]:
    """Rows/s of ``ours`` and ``raw``: one warm-up each, then alternating timed runs (fair to clock drift)."""
    ours()
    raw()
    timings: dict[str, list[float]] = {'ours': [], 'raw': []}
    for _ in range(repeats):
        for key, work in (('ours', ours), ('raw', raw)):
            start = time.perf_counter()
            work()
            timings[key].append(time.perf_counter() - start)
    return rows / statistics.median(timings['ours']), rows / statistics.median(timings['raw'])


def _operations(case: Case, values: list[np.ndarray], payloads: list[bytes],
                column_payloads: list[bytes]) -> dict[str, tuple[int, Callable[[], Any], Callable[[], Any]]]:
    """``{op: (rows, ours, raw)}``: the same work done by our codec and by the plain library."""
    codec, field = case.field.codec, case.field
    column = pa.array(column_payloads, type=pa.binary())
    return {
        'encode': (len(values), lambda: [codec.encode(field, v) for v in values],
                   lambda: [case.raw_encode(v) for v in values]),
        'decode': (len(payloads), lambda: [codec.decode(field, p) for p in payloads],
                   lambda: [case.raw_decode(p) for p in payloads]),
        'decode_column': (len(column_payloads), lambda: codec.decode_column(field, column),
                          lambda: np.stack([case.raw_decode(p) for p in column_payloads])),
    }


def run(rows: int, column_rows: int, repeats: int) -> list[tuple[str, str, float, float]]:
    rng = np.random.default_rng(0)
    results = []
    for case in _cases():
        codec, field = case.field.codec, case.field
        distinct = [case.make_value(rng) for _ in range(8)]
        values = [distinct[i % len(distinct)] for i in range(rows)]
        payloads = [bytes(codec.encode(field, v)) for v in values]
        for raw in distinct:  # our bytes and the library's bytes decode to the same pixels either way
            assert np.array_equal(case.raw_decode(bytes(codec.encode(field, raw))), raw)
            assert np.array_equal(codec.decode(field, case.raw_encode(raw)), raw)
        column_payloads = [payloads[i % len(payloads)] for i in range(column_rows)]
        for op, (count, ours_work, raw_work) in _operations(case, values, payloads, column_payloads).items():
            ours_rate, raw_rate = _median_rates(ours_work, raw_work, count, repeats)
            results.append((case.name, op, ours_rate, raw_rate))
    return results


def format_table(results: list[tuple[str, str, float, float]]) -> str:
    lines = ['| field | op | ours rows/s | raw rows/s | ratio |', '|---|---|---:|---:|---:|']
    for name, op, ours, raw in results:
        lines.append(f'| {name} | {op} | {ours:,.0f} | {raw:,.0f} | {ours / raw:.2f} |')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--quick', action='store_true', help='a few rows and one repeat (smoke run)')
    parser.add_argument('--rows', type=int, default=None, help='rows per row-wise measurement')
    parser.add_argument('--column-rows', type=int, default=None, help='values in the decoded column')
    parser.add_argument('--repeats', type=int, default=None, help='repeats (the median is reported)')
    args = parser.parse_args(argv)
    rows = args.rows or (16 if args.quick else 256)
    column_rows = args.column_rows or (32 if args.quick else 512)
    repeats = args.repeats or (1 if args.quick else 5)
    started = time.perf_counter()
    results = run(rows, column_rows, repeats)
    print(f'codec throughput: {rows} rows per row-wise op, {column_rows}-value columns, median of {repeats}')
    print()
    print(format_table(results))
    print()
    print(f'total {time.perf_counter() - started:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
