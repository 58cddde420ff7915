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

A second table compares the image decoders the codec can use (``PETASTORM_IMAGE_BACKEND``) with OpenCV on
photographs shipped with scikit-image (astronaut, coffee, chelsea) resized to 128x256, 224x224 and 512x512 and
encoded as PNG (OpenCV's defaults) and JPEG quality 90, and on hello-world noise images: images/s on one core
and with one thread per core, the ratio to OpenCV, and whether every pixel equals OpenCV's.

    python benchmarks/codecs_bench.py           # full run (about 20 s)
    python benchmarks/codecs_bench.py --quick   # smoke run
    python benchmarks/codecs_bench.py --decoders-only   # only the decoder table
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


IMAGE_SIZES = ((128, 256), (224, 224), (512, 512))
PHOTOS = ('astronaut', 'coffee', 'chelsea')
# (label, PETASTORM_IMAGE_BACKEND setting) per format; OpenCV's own calls are the reference.
DECODERS = {'png': (('ours (auto)', 'auto'), ('libdeflate', 'libdeflate'), ('imagecodecs', 'imagecodecs'),
                    ('pyspng', 'pyspng')),
            'jpeg': (('ours (auto)', 'auto'), ('simplejpeg', 'simplejpeg'), ('imagecodecs', 'imagecodecs'))}


@dataclass(frozen=True)
class DecoderRate:
    images: str
    size: str
    decoder: str
    one_core: float
    all_cores: float
    opencv_one_core: float
    opencv_all_cores: float
    identical: bool


def image_sets(quick: bool) -> dict[tuple[str, str], list[bytes]]:
    """``{(images, size): payloads}``: the photographs in PNG and JPEG q90 per size, and hello-world noise PNGs."""
    import cv2
    from skimage import data

    sizes = IMAGE_SIZES[1:2] if quick else IMAGE_SIZES
    sets = {}
    for height, width in sizes:
        photos = [cv2.resize(getattr(data, name)(), (width, height), interpolation=cv2.INTER_AREA) for name in PHOTOS]
        bgr = [cv2.cvtColor(photo, cv2.COLOR_RGB2BGR) for photo in photos]
        sets[('photo png', f'{height}x{width}')] = [cv2.imencode('.png', image)[1].tobytes() for image in bgr]
        sets[('photo jpeg q90', f'{height}x{width}')] = [
            cv2.imencode('.jpeg', image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes() for image in bgr]
    rng = np.random.default_rng(0)
    sets[('hello-world noise png', '128x256')] = [
        cv2.imencode('.png', rng.integers(0, 255, (128, 256, 3), dtype=np.uint8))[1].tobytes() for _ in range(3)]
    return sets


def _opencv_decode(payload: bytes) -> np.ndarray:
    import cv2

    return cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)


def _decode_seconds(decode: Callable[[bytes], Any], work: list[bytes], pool: ThreadPoolExecutor | None) -> float:
    """Seconds to decode ``work``: CPU seconds of this thread when alone (other load on the machine does not
    count), wall seconds with a pool."""
    if pool is None:
        start = time.thread_time()
        for payload in work:
            decode(payload)
        return time.thread_time() - start
    # Each thread decodes a run of images in a loop: a future per image would measure the executor (tens of
    # microseconds each, holding the GIL) more than a decoder that takes as little as the noise images need.
    runs = [work[i::pool._max_workers] for i in range(pool._max_workers)]

    def decode_run(run: list[bytes]) -> None:
        for payload in run:
            decode(payload)

    start = time.perf_counter()
    list(pool.map(decode_run, runs))
    return time.perf_counter() - start


def _interleaved_rates(decoders: dict[str, Callable[[bytes], Any]], work: list[bytes], threads: int,
                       repeats: int) -> dict[str, float]:
    """Images/s per decoder; each round runs every decoder once, back to back, so load changes hit all alike."""
    seconds: dict[str, list[float]] = {name: [] for name in decoders}
    with ThreadPoolExecutor(threads) as pool:
        for round_ in range(repeats + 1):  # the first round warms up
            for name, decode in decoders.items():
                spent = _decode_seconds(decode, work, pool if threads > 1 else None)
                if round_:
                    seconds[name].append(spent)
    return {name: len(work) / statistics.median(spent) for name, spent in seconds.items()}


def run_decoders(quick: bool, repeats: int) -> list[DecoderRate]:
    """Every decoder next to OpenCV on every image set, one core and one thread per core."""
    from petastorm.codecs._image_backends import _backends_for

    cores = os.cpu_count() or 1
    results = []
    for (images, size), payloads in image_sets(quick).items():
        kind = 'jpeg' if 'jpeg' in images else 'png'
        height, width = (int(n) for n in size.split('x'))
        count = max(8, int((30 if quick else 300) * 224 * 224 / (height * width)))
        work = [payloads[i % len(payloads)] for i in range(count)]
        references = [_opencv_decode(p) for p in payloads]
        decoders: dict[str, Callable[[bytes], Any]] = {'opencv': _opencv_decode}
        identical = {}
        for label, setting in DECODERS[kind]:
            backends = _backends_for(setting)

            def decode(payload: bytes, backends=backends) -> np.ndarray:
                return backends.decode(memoryview(payload))

            decoders[label] = decode
            identical[label] = all(np.array_equal(decode(p), r) for p, r in zip(payloads, references, strict=True))
        one_core = _interleaved_rates(decoders, work, 1, repeats)
        all_cores = _interleaved_rates(decoders, work, cores, repeats)
        results += [DecoderRate(images, size, label, one_core[label], all_cores[label], one_core['opencv'],
                                all_cores['opencv'], identical[label]) for label, _ in DECODERS[kind]]
    return results


def format_decoder_table(results: list[DecoderRate]) -> str:
    cores = os.cpu_count() or 1
    lines = [f'| images | size | decoder | 1 core img/s (CPU time) | {cores} threads img/s | OpenCV 1 core '
             f'| OpenCV {cores} threads | ratio 1 core | ratio {cores} threads | identical pixels |',
             '|---|---|---|' + '---:|' * 6 + '---|']
    for r in results:
        lines.append(f'| {r.images} | {r.size} | {r.decoder} | {r.one_core:,.0f} | {r.all_cores:,.0f} | '
                     f'{r.opencv_one_core:,.0f} | {r.opencv_all_cores:,.0f} | {r.one_core / r.opencv_one_core:.2f} | '
                     f'{r.all_cores / r.opencv_all_cores:.2f} | {"yes" if r.identical else "NO"} |')
    return '\n'.join(lines)


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
    parser.add_argument('--decoders-only', action='store_true', help='only the image decoder comparison')
    args = parser.parse_args(argv)
    rows = args.rows or (16 if args.quick else 256)
    column_rows = args.column_rows or (32 if args.quick else 512)
    repeats = args.repeats or (1 if args.quick else 5)
    started = time.perf_counter()
    if not args.decoders_only:
        results = run(rows, column_rows, repeats)
        print(f'codec throughput: {rows} rows per row-wise op, {column_rows}-value columns, median of {repeats}')
        print()
        print(format_table(results))
        print()
    print(f'image decoders against OpenCV on the same bytes, median of {repeats}')
    print()
    print(format_decoder_table(run_decoders(args.quick, repeats)))
    print()
    print(f'total {time.perf_counter() - started:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
