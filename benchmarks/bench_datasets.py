"""What the benchmarks share: the hello-world and MNIST-size schemas, their row generators, pass timing."""

import statistics
import time

import numpy as np
import pyarrow as pa

from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

HelloSchema = Unischema('HelloWorldSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png'), False),
    UnischemaField('array_4d', np.uint8, (None, 128, 30, None), NdarrayCodec(), False),
])
MnistSchema = Unischema('MnistSchema', [
    UnischemaField('idx', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('digit', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (28, 28), NdarrayCodec(), False),
])


def hello_rows(n):
    """``n`` hello-world rows of random pixels (seeded)."""
    rng = np.random.default_rng(0)
    for i in range(n):
        yield {'id': i, 'image1': rng.integers(0, 255, size=(128, 256, 3), dtype=np.uint8),
               'array_4d': rng.integers(0, 255, size=(4, 128, 30, 3), dtype=np.uint8)}


def mnist_rows(n):
    """``n`` MNIST-size rows (28x28 uint8 image, digit label), seeded."""
    rng = np.random.default_rng(0)
    for i in range(n):
        yield {'idx': i, 'digit': i % 10, 'image': rng.integers(0, 255, size=(28, 28), dtype=np.uint8)}


def timed_passes(fn, repeats):
    """Median rate of ``fn`` (which returns a count) over ``repeats`` passes, after one untimed warm-up pass."""
    fn()  # warm-up: page cache, lazy imports, worker start-up
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        count = fn()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)
