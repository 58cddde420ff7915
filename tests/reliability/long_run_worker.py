"""Run by test_long_run in a fresh interpreter: 50 epochs with one loader, printing RSS after every epoch as JSON.

Usage: ``python -m reliability.long_run_worker LOADER DATASET_URL EPOCHS ROWS``. A separate process per loader
keeps one loader's memory from hiding in another's.
"""

from __future__ import annotations

import json
import sys

import psutil

from petastorm import make_batch_reader, make_reader


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def _epochs_of_rows(reader, rows_per_epoch: int, count) -> list[float]:
    """RSS after each epoch of a stream that runs its epochs back to back (``count(item)`` rows per item)."""
    curve, seen = [], 0
    for item in reader:
        seen += count(item)
        while seen >= rows_per_epoch * (len(curve) + 1):
            curve.append(_rss_mb())
    return curve


def _per_pass(loader, epochs: int) -> list[float]:
    """RSS after each of ``epochs`` passes over a loader that restarts its reader on every ``iter``."""
    curve = []
    for _ in range(epochs):
        for _ in loader:
            pass
        curve.append(_rss_mb())
    return curve


def run(kind: str, url: str, epochs: int, rows: int) -> list[float]:
    common = {'reader_pool_type': 'thread', 'workers_count': 2, 'seed': 7}
    if kind == 'make_reader':
        with make_reader(url, num_epochs=epochs, **common) as reader:
            return _epochs_of_rows(reader, rows, lambda row: 1)
    if kind == 'make_batch_reader':
        with make_batch_reader(url, num_epochs=epochs, **common) as reader:
            return _epochs_of_rows(reader, rows, lambda batch: len(batch.id))
    from petastorm.pytorch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader

    if kind == 'DataLoader':
        with make_reader(url, num_epochs=1, **common) as reader:
            return _per_pass(DataLoader(reader, batch_size=16), epochs)
    if kind == 'BatchedDataLoader':
        with make_batch_reader(url, num_epochs=1, **common) as reader:
            loader = BatchedDataLoader(reader, batch_size=16, shuffling_queue_capacity=64)
            return _per_pass(loader, epochs)
    if kind == 'InMemBatchedDataLoader':
        reader = make_batch_reader(url, num_epochs=1, **common)
        loader = InMemBatchedDataLoader(reader, batch_size=16, num_epochs=epochs, rows_capacity=rows, shuffle=True)
        return _epochs_of_rows(loader, rows, lambda batch: len(batch['id']))
    raise ValueError(f'unknown loader {kind!r}')


def main() -> None:
    kind, url, epochs, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    curve = run(kind, url, epochs, rows)
    print(json.dumps({'loader': kind, 'rss_mb': curve}), flush=True)


if __name__ == '__main__':
    main()
