"""Ray Data reading of Petastorm stores, side by side in one run on the same data (rows/s, medians of rounds).

Three ways to get torch batches of 64 decoded rows, one full pass each, interleaved round after round:
  read_petastorm   ``read_petastorm(url).iter_torch_batches(batch_size=64)``
  DataLoader       our ``petastorm.pytorch.DataLoader(make_reader(url), batch_size=64)`` (no Ray)
  hand-written     ``ray.data.read_parquet(path).map_batches(decode).iter_torch_batches(batch_size=64)``: Ray's
                   own reader with the decoding a Ray user writes by hand today (``cv2.imdecode`` of the PNGs,
                   ``np.load`` of the ``.npy`` cells, one cell at a time).
Stores: hello world (a 128x256x3 PNG and a 4x128x30x3 array per row) and MNIST-like (28x28 uint8 arrays). Ray
runs in this process on ``num_cpus=2`` (start-up and one warm-up pass of each way are not timed).

Usage: python benchmarks/ray_bench.py [--quick] [--rounds 3] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
from bench_datasets import HelloSchema, MnistSchema, hello_rows, mnist_rows

from petastorm import make_reader, write_dataset


def make_stores(root: str, quick: bool) -> dict[str, str]:
    """Paths of the hello-world and MNIST-like stores under ``root``, written when missing."""
    stores = {'hello': os.path.join(root, 'hello'), 'mnist': os.path.join(root, 'mnist')}
    if not os.path.exists(stores['hello']):
        write_dataset('file://' + stores['hello'], HelloSchema, hello_rows(300 if quick else 1000),
                      row_group_size_mb=16, progress=False)
    if not os.path.exists(stores['mnist']):
        write_dataset('file://' + stores['mnist'], MnistSchema, mnist_rows(10_000 if quick else 60_000),
                      row_group_size_mb=4, progress=False)
    return stores


def _count(batches) -> int:
    rows = 0
    for batch in batches:
        rows += len(next(iter(batch.values())))
    return rows


def read_petastorm_pass(path: str) -> int:
    from petastorm.ray import read_petastorm

    return _count(read_petastorm('file://' + path).iter_torch_batches(batch_size=64))


def dataloader_pass(path: str) -> int:
    from petastorm.pytorch import DataLoader

    with DataLoader(make_reader('file://' + path, num_epochs=1), batch_size=64) as loader:
        return _count(loader)


def _decode_npy(cells) -> np.ndarray:
    return np.stack([np.load(io.BytesIO(cell)) for cell in cells])


def _decode_png(cells) -> np.ndarray:
    import cv2

    return np.stack([cv2.cvtColor(cv2.imdecode(np.frombuffer(cell, np.uint8), cv2.IMREAD_UNCHANGED),
                                  cv2.COLOR_BGR2RGB) for cell in cells])


def decode_hello(batch: dict) -> dict:
    """What a Ray user writes today to decode the hello-world columns: one cell at a time."""
    return {'id': batch['id'], 'image1': _decode_png(batch['image1']), 'array_4d': _decode_npy(batch['array_4d'])}


def decode_mnist(batch: dict) -> dict:
    return {'idx': batch['idx'], 'digit': batch['digit'], 'image': _decode_npy(batch['image'])}


def hand_written_pass(path: str, decode) -> int:
    import ray.data

    dataset = ray.data.read_parquet(path).map_batches(decode, batch_format='numpy')
    return _count(dataset.iter_torch_batches(batch_size=64))


def measure(stores: dict[str, str], rounds: int) -> dict[str, dict[str, float]]:
    decoders = {'hello': decode_hello, 'mnist': decode_mnist}
    results = {}
    for name, path in stores.items():
        ways = {'read_petastorm': lambda p=path: read_petastorm_pass(p),
                'DataLoader': lambda p=path: dataloader_pass(p),
                'hand-written': lambda p=path, d=decoders[name]: hand_written_pass(p, d)}
        counts = {way: run() for way, run in ways.items()}  # warm-up pass of each way
        if len(set(counts.values())) != 1:
            raise RuntimeError(f'{name}: the ways read different numbers of rows: {counts}')
        rates: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(rounds):
            for way, run in ways.items():
                start = time.perf_counter()
                rows = run()
                rates[way].append(rows / (time.perf_counter() - start))
        results[name] = {way: statistics.median(values) for way, values in rates.items()}
        results[name]['rows'] = float(next(iter(counts.values())))
    return results


def print_table(results: dict[str, dict[str, float]], rounds: int) -> None:
    print(f'rows/s, median of {rounds} rounds, one full pass each, batch_size=64, Ray num_cpus=2')
    print(f'{"store":<8} {"rows":>7} {"read_petastorm":>15} {"DataLoader":>11} {"hand-written":>13} '
          f'{"vs hand-written":>16} {"vs DataLoader":>14}')
    for name, rates in results.items():
        ours, loader, hand = rates['read_petastorm'], rates['DataLoader'], rates['hand-written']
        print(f'{name:<8} {int(rates["rows"]):>7} {ours:>15,.0f} {loader:>11,.0f} {hand:>13,.0f} '
              f'{ours / hand:>15.2f}x {ours / loader:>13.2f}x')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='small stores (300 hello, 10,000 MNIST rows)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--data-root', help='directory of the stores (written when missing); default: a temp dir')
    args = parser.parse_args(argv)
    warnings.filterwarnings('ignore', category=UserWarning)
    import ray

    with tempfile.TemporaryDirectory() as scratch:
        stores = make_stores(args.data_root or scratch, args.quick)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False
            context.print_on_execution_start = False
            results = measure(stores, args.rounds)
        finally:
            ray.shutdown()
    print_table(results, args.rounds)


if __name__ == '__main__':
    main()
