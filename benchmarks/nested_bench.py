"""Ragged, null and Hugging Face image stores through our loaders and their peers, side by side in one run.

Two stores, written here:

* ``rec``: a recommendation-like store (``--rows`` rows, 1M by default): an int label, 20 float features and 8
  id-list columns of mean length 20 (``list<int64>``), 5% nulls in the features and the lists, plain Parquet
  written by pyarrow in 4 files of 64K-row row groups;
* ``images``: ``--images`` photo-like 224x224 RGB PNGs with a label, once as our ``CompressedImageCodec`` store
  (``write_dataset``) and once in the Hugging Face layout (``struct<bytes, path>`` with ``datasets``'
  ``huggingface`` features metadata) holding the same PNG bytes.

Every way delivers torch batches of ``--batch-size`` rows of every column (lists as values + offsets, nulls as a
mask or what the peer gives), one pass (cut at ``--seconds``), rounds interleaved; rows/s are medians of
``--rounds`` rounds, start-up (Ray, the ``datasets`` Arrow cache) not timed:

  pyarrow          ``ParquetFile.iter_batches`` + ``to_numpy`` of each column's flattened values, offsets and
                   validity, ``torch.from_numpy``: the limit of reading these files in one process
  BatchedDataLoader  ours, ``make_batch_reader`` (2 threads) + ``BatchedDataLoader(variable_length='jagged',
                   nulls='mask')``; ``+shuffle``: with a 100,000-row shuffling buffer
  DataLoader       ours, the same with ``petastorm.pytorch.DataLoader``
  InMemBatchedDataLoader  ours, epochs from the rows it loaded into memory (the loading not timed), the match
                   for the ``datasets`` Arrow cache below
  HF datasets      ``Dataset.from_parquet(...).with_format('torch').iter(batch_size)``; where that raises (it
                   cannot format list columns with null rows), ``with_format('arrow')`` batches made tensors as for
                   the pyarrow limit, from the Arrow cache ``from_parquet`` built (not timed), and once more with
                   building the cache timed, as in a user's first epoch
  Ray Data         ``ray.data.read_parquet(...).iter_torch_batches(batch_size, collate_fn)``: the collate makes the
                   list columns values + offsets, as Ray's default collate cannot stack ragged rows

Usage: python benchmarks/nested_bench.py [--quick] [--rounds 3] [--cases rec,images] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

FEATURES = 20
LISTS = 8
MEAN_LENGTH = 20
NULLS = 0.05


# -- the stores ----------------------------------------------------------------------------------------------------


def _masked(values: pa.Array, rng: np.random.Generator) -> pa.Array:
    """``values`` with a random ``NULLS`` share of them null."""
    import pyarrow.compute as pc

    return pc.if_else(pa.array(rng.random(len(values)) < NULLS), pa.nulls(len(values), type=values.type), values)


def rec_table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns: dict[str, pa.Array] = {'label': pa.array(rng.integers(0, 2, rows))}
    for i in range(FEATURES):
        columns[f'f{i}'] = _masked(pa.array(rng.standard_normal(rows).astype(np.float32)), rng)
    for i in range(LISTS):
        lengths = rng.poisson(MEAN_LENGTH, rows)
        valid = rng.random(rows) >= NULLS
        lengths[~valid] = 0
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = pa.array(rng.integers(0, 1 << 40, int(offsets[-1])))
        columns[f'ids{i}'] = pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~valid))
    return pa.table(columns)


def make_rec_store(root: str, rows: int) -> list[str]:
    directory = os.path.join(root, f'rec_{rows}')
    files = [os.path.join(directory, f'part-{k}.parquet') for k in range(4)]
    if all(os.path.exists(f) for f in files):
        return files
    os.makedirs(directory, exist_ok=True)
    per_file = -(-rows // 4)
    for k, path in enumerate(files):
        count = min(per_file, rows - k * per_file)
        pq.write_table(rec_table(count, seed=k), path + '.tmp', row_group_size=65536)
        os.replace(path + '.tmp', path)
    return files


def _photo(rng: np.random.Generator, size: int = 224) -> np.ndarray:
    """A smooth, photo-like image (gradients and blobs plus a little noise), which compresses as photos do."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    channels = []
    for _ in range(3):
        a, b, c = rng.random(3) * 6
        channels.append(np.sin(a * x + b * y + c) * 100 + 128 + rng.normal(0, 6, (size, size)))
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def make_image_stores(root: str, count: int) -> tuple[str, str]:
    """Our ``CompressedImageCodec`` store and the Hugging Face layout of the same PNG bytes."""
    from petastorm import write_dataset
    from petastorm.codecs import CompressedImageCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField

    ours = os.path.join(root, f'images_petastorm_{count}')
    hf = os.path.join(root, f'images_hf_{count}', 'train.parquet')
    if not os.path.exists(ours):
        schema = Unischema('Photos', [UnischemaField('label', np.int64, (), ScalarCodec(pa.int64()), False),
                                      UnischemaField('image', np.uint8, (224, 224, 3), CompressedImageCodec('png'),
                                                     False)])
        rng = np.random.default_rng(0)
        write_dataset('file://' + ours, schema, ({'label': i % 10, 'image': _photo(rng)} for i in range(count)),
                      row_group_size_mb=16, progress=False)
    if not os.path.exists(hf):
        os.makedirs(os.path.dirname(hf), exist_ok=True)
        stored = pq.read_table(ours, columns=['label', 'image'])
        image = pa.StructArray.from_arrays([stored.column('image').combine_chunks().cast(pa.binary()),
                                            pa.nulls(stored.num_rows, pa.string())], names=['bytes', 'path'])
        features = {'info': {'features': {'image': {'_type': 'Image'},
                                          'label': {'dtype': 'int64', '_type': 'Value'}}}}
        table = pa.table({'image': image, 'label': stored.column('label')})
        table = table.replace_schema_metadata({b'huggingface': json.dumps(features).encode()})
        files = sorted(f for f in os.listdir(ours) if f.endswith('.parquet'))
        rows_per_group = pq.ParquetFile(os.path.join(ours, files[0])).metadata.row_group(0).num_rows
        pq.write_table(table, hf + '.tmp', row_group_size=rows_per_group)
        os.replace(hf + '.tmp', hf)
    return ours, hf


# -- the ways to read ----------------------------------------------------------------------------------------------


def _rows(batch) -> int:
    if isinstance(batch, dict):
        for value in batch.values():
            if hasattr(value, 'offsets') and hasattr(value, 'values'):
                return len(value.offsets) - 1
            if hasattr(value, 'shape'):
                return int(value.shape[0])
            if isinstance(value, list):
                return len(value)
    return len(batch)


def _timed(batches: Iterable, seconds: float, warmup: int = 0) -> float:
    """Rows per second of ``batches`` (after its first ``warmup`` batches), cut after ``seconds``.

    The time runs from the first request: a shuffling buffer's filling counts, as it does in training.
    """
    iterator = iter(batches)
    for _ in range(warmup):
        next(iterator, None)
    rows = 0
    start = time.perf_counter()
    for batch in iterator:
        rows += _rows(batch)
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return rows / elapsed if elapsed > 0 else float('nan')


def arrow_to_torch(names: list[str], columns: Iterable[pa.Array]) -> dict:
    """Each column's flattened values, offsets and validity as tensors: the least work that gives jagged tensors."""
    import torch

    out = {}
    for name, column in zip(names, columns, strict=True):
        valid = torch.from_numpy(column.is_valid().to_numpy(zero_copy_only=False))
        if pa.types.is_list(column.type):
            out[name] = (torch.from_numpy(column.flatten().to_numpy()),
                         torch.from_numpy(column.offsets.to_numpy().astype(np.int64)), valid)
        else:
            out[name] = (torch.from_numpy(column.fill_null(0).to_numpy()), valid)
    return out


def pyarrow_batches(files: list[str], batch_size: int):
    for path in files:
        for record_batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            yield arrow_to_torch(record_batch.schema.names, record_batch.columns)


def hf_arrow_batches(dataset, batch_size: int):
    """What a ``datasets`` user writes when ``with_format('torch')`` cannot take the columns: Arrow batches made
    jagged tensors as for the pyarrow limit."""
    for table in dataset.with_format('arrow').iter(batch_size=batch_size):
        yield arrow_to_torch(table.column_names, (column.combine_chunks() for column in table.columns))


def _pa_rows(batch: dict) -> int:
    return len(next(iter(batch.values()))[-1])


def ours_batched(url: str, batch_size: int, shuffle: int = 0, **kwargs):
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    reader = make_batch_reader(url, reader_pool_type='thread', workers_count=2, num_epochs=1, **kwargs)
    return BatchedDataLoader(reader, batch_size=batch_size, shuffling_queue_capacity=shuffle,
                             variable_length='jagged', nulls='mask')


def ours_dataloader(url: str, batch_size: int, rows: bool = False, **kwargs):
    from petastorm import make_batch_reader, make_reader
    from petastorm.pytorch import DataLoader

    make = make_reader if rows else make_batch_reader
    reader = make(url, reader_pool_type='thread', workers_count=2, num_epochs=1, **kwargs)
    return DataLoader(reader, batch_size=batch_size, variable_length='jagged', nulls='mask')


def ours_inmem_epochs(url: str, batch_size: int, seconds: float) -> float:
    """Rows per second of ``InMemBatchedDataLoader`` epochs, loading the store into memory not timed (as for the
    ``datasets`` Arrow cache)."""
    from petastorm import make_batch_reader
    from petastorm.pytorch import InMemBatchedDataLoader

    reader = make_batch_reader(url, reader_pool_type='thread', workers_count=2, num_epochs=1)
    loader = InMemBatchedDataLoader(reader, batch_size=batch_size, num_epochs=100, rows_capacity=1 << 62,
                                    variable_length='jagged', nulls='mask')
    return _timed(loader, seconds)


def hf_dataset(files: list[str], cache_dir: str):
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_parquet(files, cache_dir=cache_dir).with_format('torch')


def hf_first_epoch(files: list[str], batch_size: int, seconds: float) -> float:
    """Rows per second of ``with_format('arrow')`` batches, the time running from ``from_parquet`` into a new cache."""
    import shutil

    cache = tempfile.mkdtemp(prefix='hf_cache_')
    try:
        started = time.perf_counter()
        dataset = hf_dataset(files, cache)
        return _pa_timed(hf_arrow_batches(dataset, batch_size), seconds, started=started)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def ray_jagged_collate(batch: dict):
    """What a Ray user writes to get jagged id lists: concatenate each column's per-row arrays, keep the offsets."""
    import torch

    out = {}
    for name, values in batch.items():
        if values.dtype == object:
            lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
            offsets = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            present = [v for v in values if v is not None and len(v)]
            flat = np.concatenate(present) if present else np.empty(0, np.int64)
            out[name] = (torch.from_numpy(flat), torch.from_numpy(offsets))
        else:
            out[name] = torch.from_numpy(np.nan_to_num(values) if values.dtype.kind == 'f' else values)
    return out


def ray_batches(files: list[str], batch_size: int):
    import ray

    dataset = ray.data.read_parquet(files)
    return dataset.iter_torch_batches(batch_size=batch_size, collate_fn=ray_jagged_collate)


# -- the cases -------------------------------------------------------------------------------------------------------


def case_rec(root: str, rows: int, batch_size: int, seconds: float, rounds: int, peers: bool) -> list[tuple]:
    files = make_rec_store(root, rows)
    url = 'file://' + os.path.dirname(files[0])
    ways: dict[str, Callable[[], float]] = {
        'pyarrow (limit)': lambda: _pa_timed(pyarrow_batches(files, batch_size), seconds),
        'BatchedDataLoader': lambda: _closing_rate(lambda: ours_batched(url, batch_size), seconds),
        'BatchedDataLoader +shuffle': lambda: _closing_rate(lambda: ours_batched(url, batch_size, 100_000,
                                                                                 shuffle_rows=True, seed=1), seconds),
        'DataLoader': lambda: _closing_rate(lambda: ours_dataloader(url, batch_size), seconds),
        'InMemBatchedDataLoader, epochs from memory': lambda: ours_inmem_epochs(url, batch_size, seconds),
    }
    if peers:
        cache = tempfile.mkdtemp(prefix='hf_cache_')
        hf = hf_dataset(files, cache)
        ways['HF datasets'] = lambda: _timed(hf.iter(batch_size=batch_size), seconds)
        ways['HF datasets, Arrow format'] = lambda: _pa_timed(hf_arrow_batches(hf, batch_size), seconds)
        ways['HF datasets, Arrow format, with from_parquet'] = lambda: hf_first_epoch(files, batch_size, seconds)
        ways['Ray Data'] = lambda: _timed(ray_batches(files, batch_size), seconds)
    return _rounds('rec', ways, rounds)


def case_images(root: str, count: int, batch_size: int, seconds: float, rounds: int, peers: bool) -> list[tuple]:
    ours, hf_file = make_image_stores(root, count)
    ours_url, hf_url = 'file://' + ours, 'file://' + hf_file
    ways: dict[str, Callable[[], float]] = {
        'CompressedImageCodec store, BatchedDataLoader': lambda: _closing_rate(
            lambda: ours_batched(ours_url, batch_size), seconds),
        'HF-layout store, BatchedDataLoader': lambda: _closing_rate(lambda: ours_batched(hf_url, batch_size), seconds),
        'CompressedImageCodec store, DataLoader': lambda: _closing_rate(
            lambda: ours_dataloader(ours_url, batch_size, rows=True), seconds),
        'HF-layout store, DataLoader': lambda: _closing_rate(
            lambda: ours_dataloader(hf_url, batch_size, rows=True), seconds),
    }
    if peers:
        cache = tempfile.mkdtemp(prefix='hf_cache_')
        hf = hf_dataset([hf_file], cache)
        ways['HF datasets (HF-layout store)'] = lambda: _timed(hf.iter(batch_size=batch_size), seconds)
    return _rounds('images', ways, rounds)


def _pa_timed(batches: Iterable, seconds: float, started: float | None = None) -> float:
    """Rows per second of batches of ``(values, ..., validity)`` tuples; the time runs from ``started`` if given
    (the ``datasets`` Arrow cache built from the Parquet files first, as a user's first epoch does)."""
    iterator = iter(batches)
    rows = 0
    start = time.perf_counter() if started is None else started
    for batch in iterator:
        rows += _pa_rows(batch)
        if time.perf_counter() - start > seconds:
            break
    return rows / (time.perf_counter() - start)


def _closing_rate(make: Callable[[], object], seconds: float) -> float:
    with make() as loader:  # type: ignore[attr-defined]
        return _timed(loader, seconds)


def _rounds(case: str, ways: dict[str, Callable[[], float]], rounds: int) -> list[tuple]:
    """Every way once per round; a way that raises is reported with its error and not run again."""
    rates: dict[str, list[float]] = {name: [] for name in ways}
    failed: dict[str, str] = {}
    for _ in range(rounds):
        for name, way in ways.items():
            if name in failed:
                continue
            try:
                rates[name].append(way())
            except Exception as err:  # a peer that cannot read these columns is a result, not the end of the run
                failed[name] = f'{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ""}'[:120]
    return [(case, name, statistics.median(values) if values else float('nan'), values, failed.get(name))
            for name, values in rates.items()]


def _table(results: list[tuple]) -> str:
    lines = ['| store | way | rows/s (median) | rounds |', '|---|---|---:|---|']
    for case, name, median, values, error in results:
        if error is not None:
            lines.append(f'| {case} | {name} | fails | {error} |')
        else:
            lines.append(f'| {case} | {name} | {median:,.0f} | {", ".join(f"{v:,.0f}" for v in values)} |')
    return '\n'.join(lines)


def _ratios(results: list[tuple]) -> list[str]:
    rates = {(case, name): median for case, name, median, _, error in results if error is None}
    lines = []
    peers = [rates[k] for k in rates if k[0] == 'rec' and k[1].startswith(('HF datasets', 'Ray Data'))]
    if ('rec', 'BatchedDataLoader') in rates:
        ours = rates[('rec', 'BatchedDataLoader')]
        lines.append(f'rec: BatchedDataLoader / pyarrow limit = {ours / rates[("rec", "pyarrow (limit)")]:.2f} '
                     f'(goal >= 0.5)')
        if peers:
            lines.append(f'rec: BatchedDataLoader / best peer = {ours / max(peers):.1f} (goal >= 5)')
    for loader in ('BatchedDataLoader', 'DataLoader'):
        hf_key, ours_key = ('images', f'HF-layout store, {loader}'), ('images', f'CompressedImageCodec store, {loader}')
        if hf_key in rates and ours_key in rates:
            lines.append(f'images: HF-layout / CompressedImageCodec store through {loader} = '
                         f'{rates[hf_key] / rates[ours_key]:.2f} (goal >= 1)')
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rows', type=int, default=1_000_000)
    parser.add_argument('--images', type=int, default=2_000)
    parser.add_argument('--batch-size', type=int, default=4096)
    parser.add_argument('--seconds', type=float, default=20.0)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--cases', default='rec,images')
    parser.add_argument('--data-root', default=os.path.join(tempfile.gettempdir(), 'petastorm_nested_bench'))
    parser.add_argument('--no-peers', action='store_true', help='only pyarrow and our loaders')
    parser.add_argument('--quick', action='store_true', help='small stores, one round, short passes')
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.images, args.seconds, args.rounds, args.batch_size = 20_000, 256, 2.0, 1, 1024
    warnings.simplefilter('ignore')
    logging.getLogger('petastorm').setLevel(logging.ERROR)
    os.makedirs(args.data_root, exist_ok=True)
    cases = args.cases.split(',')
    peers = not args.no_peers
    if peers and 'rec' in cases:
        import ray

        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    results: list[tuple] = []
    try:
        if 'rec' in cases:
            results += case_rec(args.data_root, args.rows, args.batch_size, args.seconds, args.rounds, peers)
        if 'images' in cases:
            results += case_images(args.data_root, args.images, min(args.batch_size // 16, 64), args.seconds,
                                   args.rounds, peers)
    finally:
        if peers and 'rec' in cases:
            import ray

            ray.shutdown()
    print(f'nested_bench: rows={args.rows:,} images={args.images:,} batch={args.batch_size} '
          f'(python {sys.version.split()[0]}, {os.cpu_count()} cores, medians of {args.rounds} rounds)')
    print(_table(results))
    for line in _ratios(results):
        print(line)
    return 0


if __name__ == '__main__':
    sys.exit(main())
