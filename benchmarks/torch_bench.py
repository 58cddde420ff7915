"""PyTorch loader throughput next to its limits, measured in one run on the same data.

Cases (each in its own process, so that peak RSS is the case's own; rates are medians of --repeats runs):
  hello    DataLoader(make_reader(hello world), batch_size=64) vs make_reader alone (rows/s, peak RSS).
  backends hello world make_reader and DataLoader bs64, thread and process pools of 2, with the automatic image
           decoders against PETASTORM_IMAGE_BACKEND=opencv (the decode of earlier releases), interleaved.
  mnist    DataLoader(make_reader(28x28 uint8 + label), batch_size=64) vs make_reader alone.
  scalars  BatchedDataLoader(make_batch_reader(N x 10 scalar columns), batch_size=1024) vs the limit: a raw
           pyarrow scan -> numpy -> 1024-row slices -> torch.as_tensor loop; and the same loader with
           shuffling_queue_capacity=100000, also with the compiled shuffling kernel switched off
           (PETASTORM_NO_COMPILED_SHUFFLE=1: the numpy code an install without a C compiler runs, same batches)
           next to it.
  inmem    InMemBatchedDataLoader(batch_size=1024, shuffle=True): load time and shuffled epoch rate, on the
           scalar store (make_batch_reader) and the MNIST-style store (make_reader).
The last column repeats what the original Petastorm 0.13.1 measured on a 2-core machine of this kind, for
orientation only: compare ratios measured in one run (see the side-by-side harness for that).

Usage: python benchmarks/torch_bench.py [--quick] [--cases hello,backends,mnist,scalars,inmem] [--data-root DIR]
With --data-root, stores named hello_world (or hello), mnist_like (or mnist) and scalars are used when present.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing as mp
import os
import resource
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

# What Petastorm 0.13.1 measured with the side-by-side harness on a 2-core machine of this kind.
ORIGINAL = {
    'hello DataLoader bs64': '872 (3.5 GB)',
    'mnist DataLoader bs64': '3,453',
    'scalars BatchedDataLoader bs1024': '4,572,466',
    'scalars BatchedDataLoader bs1024 shufq100k': '688,691',
    'scalars InMem load (s)': '1.70',
    'scalars InMem shuffled epoch': '408,657',
    'mnist InMem load (s)': '18.58',
    'mnist InMem shuffled epoch': '208,504',
}


def _existing(root, names):
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            return path
    return None


def make_data(root, quick, cases=('hello', 'mnist', 'scalars', 'inmem')):
    """Paths of the hello, mnist and scalar stores under ``root`` (those the cases need written when missing)."""
    paths = {}
    paths['hello'] = _existing(root, ('hello_world', 'hello')) or os.path.join(root, 'hello')
    if {'hello', 'backends'} & set(cases) and not os.path.exists(paths['hello']):
        write_dataset('file://' + paths['hello'], HelloSchema, hello_rows(200 if quick else 2000),
                      row_group_size_mb=16)
    paths['mnist'] = _existing(root, ('mnist_like', 'mnist')) or os.path.join(root, 'mnist')
    if {'mnist', 'inmem'} & set(cases) and not os.path.exists(paths['mnist']):
        write_dataset('file://' + paths['mnist'], MnistSchema, mnist_rows(10_000 if quick else 60_000),
                      row_group_size_mb=4)
    paths['scalars'] = _existing(root, ('scalars',)) or os.path.join(root, 'scalars')
    if {'scalars', 'inmem'} & set(cases) and not os.path.exists(paths['scalars']):
        rng = np.random.default_rng(0)
        os.makedirs(paths['scalars'])
        total = 300_000 if quick else 5_000_000
        chunk = 1_000_000
        for part, start in enumerate(range(0, total, chunk)):
            n = min(chunk, total - start)
            cols = {'id': np.arange(start, start + n, dtype=np.int64)}
            for c in range(9):
                cols[f'c{c}'] = rng.random(n).astype(np.float32 if c < 4 else np.float64) if c < 7 else \
                    rng.integers(0, 1000, n, dtype=np.int32)
            pq.write_table(pa.table(cols), os.path.join(paths['scalars'], f'part-{part:03d}.parquet'),
                           row_group_size=160_000)
    return paths


def _rows_in(batch):
    first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(first)


def _stream_rate(open_loader, seconds):
    """Rows/s of an endless loader after a short warm-up."""
    with open_loader() as loader:
        iterator = iter(loader)
        warm_until = time.perf_counter() + min(1.0, seconds / 2)
        while time.perf_counter() < warm_until:
            next(iterator)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            count += _rows_in(next(iterator))
        return count / (time.perf_counter() - start)


def _reader_rate(make, seconds, batched):
    with make() as reader:
        warm_until = time.perf_counter() + min(1.0, seconds / 2)
        while time.perf_counter() < warm_until:
            next(reader)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            item = next(reader)
            count += len(item[0]) if batched else 1
        return count / (time.perf_counter() - start)


def _raw_torch_pass(path, batch_size=1024):
    """The limit of BatchedDataLoader: pyarrow scan -> numpy -> fixed-size slices -> torch.as_tensor."""
    import warnings

    import torch

    warnings.filterwarnings('ignore', message='The given NumPy array is not writable')

    n = 0
    carry = None
    names = None
    for batch in ds.dataset(path, format='parquet').to_batches():
        names = batch.schema.names
        cols = [c.to_numpy(zero_copy_only=False) for c in batch.columns]
        if carry is not None:
            cols = [np.concatenate([a, b]) for a, b in zip(carry, cols, strict=True)]
        full = len(cols[0]) - len(cols[0]) % batch_size
        for s in range(0, full, batch_size):
            out = {k: torch.as_tensor(c[s:s + batch_size]) for k, c in zip(names, cols, strict=True)}
            n += len(out[names[0]])
        carry = [c[full:] for c in cols]
    if carry is not None and len(carry[0]):
        n += len({k: torch.as_tensor(c) for k, c in zip(names, carry, strict=True)}[names[0]])
    return n


def _loader_pass(path, shuffle_capacity):
    from petastorm.pytorch import BatchedDataLoader

    n = 0
    with BatchedDataLoader(make_batch_reader('file://' + path, num_epochs=1), batch_size=1024,
                           shuffling_queue_capacity=shuffle_capacity) as loader:
        for batch in loader:
            n += len(batch['id'])
    return n


# -- cases, each run in a fresh process; they return {name: value} plus the process's peak RSS ------------------

def case_hello(path, seconds, repeats):
    import warnings

    from petastorm.pytorch import DataLoader

    warnings.filterwarnings('ignore', category=UserWarning)
    url = 'file://' + path
    loader = statistics.median(_stream_rate(lambda: DataLoader(make_reader(url, num_epochs=None), batch_size=64),
                                            seconds) for _ in range(repeats))
    return {'hello DataLoader bs64': loader}


def case_hello_backends(path, seconds, repeats, backends=('opencv', 'auto')):
    """Hello world through make_reader and DataLoader bs64, thread and process pools of 2, per image backend.

    ``PETASTORM_IMAGE_BACKEND=opencv`` is the decode of earlier releases; every round runs every combination
    back to back, so a change of load on the machine hits all of them alike.
    """
    import warnings

    from petastorm.pytorch import DataLoader

    warnings.filterwarnings('ignore', category=UserWarning)
    url = 'file://' + path
    rates = {}
    for _ in range(repeats):
        for backend in backends:
            os.environ['PETASTORM_IMAGE_BACKEND'] = backend  # read at each decode; inherited by worker processes
            for pool in ('thread', 'process'):
                def reader(pool=pool):
                    return make_reader(url, num_epochs=None, reader_pool_type=pool, workers_count=2)
                rates.setdefault(f'hello make_reader {pool} w2 [{backend}]', []).append(
                    _reader_rate(reader, seconds, False))
                rates.setdefault(f'hello DataLoader bs64 {pool} w2 [{backend}]', []).append(
                    _stream_rate(lambda reader=reader: DataLoader(reader(), batch_size=64), seconds))
    os.environ.pop('PETASTORM_IMAGE_BACKEND', None)
    return {name: statistics.median(values) for name, values in rates.items()}


def case_hello_reader(path, seconds, repeats):
    url = 'file://' + path
    return {'hello make_reader': statistics.median(
        _reader_rate(lambda: make_reader(url, num_epochs=None), seconds, False) for _ in range(repeats))}


def case_mnist(path, seconds, repeats):
    from petastorm.pytorch import DataLoader

    url = 'file://' + path
    loader = statistics.median(_stream_rate(lambda: DataLoader(make_reader(url, num_epochs=None), batch_size=64),
                                            seconds) for _ in range(repeats))
    reader = statistics.median(_reader_rate(lambda: make_reader(url, num_epochs=None), seconds, False)
                               for _ in range(repeats))
    return {'mnist DataLoader bs64': loader, 'mnist make_reader': reader}


# The shuffled loader without the compiled kernel (what an install without a C compiler runs).
NUMPY_SHUFFLE = 'scalars BatchedDataLoader bs1024 shufq100k, numpy shuffle'
NO_KERNEL = 'PETASTORM_NO_COMPILED_SHUFFLE'


def _numpy_shuffle_pass(path):
    """The shuffled loader as installed without a C compiler: the kernel switched off for the buffers it makes."""
    before = os.environ.get(NO_KERNEL)
    os.environ[NO_KERNEL] = '1'
    try:
        return _loader_pass(path, 100_000)
    finally:
        if before is None:
            os.environ.pop(NO_KERNEL)
        else:
            os.environ[NO_KERNEL] = before


def case_scalars(path, seconds, repeats):
    from petastorm.shuffle import compiled_shuffle_in_use

    rates = {'scalars raw pyarrow->torch loop': timed_passes(lambda: _raw_torch_pass(path), repeats),
             'scalars BatchedDataLoader bs1024': timed_passes(lambda: _loader_pass(path, 0), repeats),
             'scalars BatchedDataLoader bs1024 shufq100k': timed_passes(lambda: _loader_pass(path, 100_000),
                                                                         repeats)}
    if compiled_shuffle_in_use():
        rates[NUMPY_SHUFFLE] = timed_passes(lambda: _numpy_shuffle_pass(path), repeats)
    return rates


def _inmem(path, batched, repeats):
    import warnings

    from petastorm.pytorch import InMemBatchedDataLoader

    warnings.filterwarnings('ignore', category=UserWarning)
    rows = sum(pq.read_metadata(os.path.join(root, f)).num_rows
               for root, _, files in os.walk(path) for f in files if f.endswith('.parquet'))
    factory = make_batch_reader if batched else make_reader
    loads, epochs = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        loader = InMemBatchedDataLoader(factory('file://' + path, num_epochs=1), batch_size=1024, num_epochs=2,
                                        rows_capacity=rows, shuffle=True)
        loaded = time.perf_counter()
        seen = sum(_rows_in(batch) for batch in loader)
        done = time.perf_counter()
        assert seen == 2 * rows, (seen, rows)
        loads.append(loaded - start)
        epochs.append(2 * rows / (done - loaded))
    return statistics.median(loads[1:]), statistics.median(epochs[1:])


def case_inmem(paths, seconds, repeats):
    scalars_load, scalars_epoch = _inmem(paths['scalars'], True, repeats)
    mnist_load, mnist_epoch = _inmem(paths['mnist'], False, repeats)
    return {'scalars InMem load (s)': scalars_load, 'scalars InMem shuffled epoch': scalars_epoch,
            'mnist InMem load (s)': mnist_load, 'mnist InMem shuffled epoch': mnist_epoch}


def _in_process(fn, *args):
    result = fn(*args)
    return result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_isolated(fn, *args):
    """``(fn(*args), peak RSS MB)`` from a fresh process."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context('spawn')) as pool:
        return pool.submit(_in_process, fn, *args).result()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='small data, short runs, one repeat (smoke test)')
    parser.add_argument('--cases', default='hello,mnist,scalars,inmem')
    parser.add_argument('--data-root', default=None, help='where the stores are (or are written)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=5.0, help='measuring time of a streaming case')
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    seconds = 0.5 if args.quick else args.seconds
    root = args.data_root or tempfile.mkdtemp(prefix='petastorm-torch-bench-')
    cases = args.cases.split(',')
    paths = make_data(root, args.quick, cases)
    values, rss = {}, {}
    if 'hello' in cases:
        for fn in (case_hello, case_hello_reader):
            result, peak = run_isolated(fn, paths['hello'], seconds, repeats)
            values.update(result)
            rss.update(dict.fromkeys(result, peak))
    if 'backends' in cases:
        result, _ = run_isolated(case_hello_backends, paths['hello'], seconds, repeats)
        values.update(result)
    if 'mnist' in cases:
        result, peak = run_isolated(case_mnist, paths['mnist'], seconds, repeats)
        values.update(result)
    if 'scalars' in cases:
        result, peak = run_isolated(case_scalars, paths['scalars'], seconds, repeats)
        values.update(result)
    if 'inmem' in cases:
        result, peak = run_isolated(case_inmem, paths, seconds, repeats)
        values.update(result)
    references = {
        'hello DataLoader bs64': 'hello make_reader',
        'mnist DataLoader bs64': 'mnist make_reader',
        'scalars BatchedDataLoader bs1024': 'scalars raw pyarrow->torch loop',
        'scalars BatchedDataLoader bs1024 shufq100k': 'scalars raw pyarrow->torch loop',
        NUMPY_SHUFFLE: 'scalars BatchedDataLoader bs1024 shufq100k',
        **{f'hello {what} {pool} w2 [auto]': f'hello {what} {pool} w2 [opencv]'
           for what in ('make_reader', 'DataLoader bs64') for pool in ('thread', 'process')},
    }
    print(f'| case | ours | peak RSS MB | compared with | its value | ours / it | original 0.13.1 |  '
          f'(python {sys.version.split()[0]}, {os.cpu_count()} cores, median of {repeats})')
    print('|---|---:|---:|---|---:|---:|---:|')
    for name, value in values.items():
        if name in references.values() and name not in references:  # a limit only: shown beside its cases
            continue
        reference = references.get(name)
        ref_value = values.get(reference) if reference else None
        ratio = f'{value / ref_value:.2f}' if ref_value else ''
        shown = f'{value:.2f}' if name.endswith('(s)') else f'{value:,.0f}'
        ref_shown = f'{ref_value:,.0f}' if ref_value else ''
        peak = f'{rss[name]:,.0f}' if name in rss else ''
        print(f'| {name} | {shown} | {peak} | {reference or ""} | {ref_shown} | {ratio} | '
              f'{ORIGINAL.get(name, "")} |')
    for name in [n for n in values if ' process w2 [' in n]:
        thread = values.get(name.replace(' process ', ' thread '))
        if thread:
            print(f'{name}: process / thread pool {values[name] / thread:.2f}')


if __name__ == '__main__':
    main()
