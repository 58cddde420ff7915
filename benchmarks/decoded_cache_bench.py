"""What the decoded-column cache buys on image data: later epochs skip the PNG decode that bounds every loader.

The hello-world store (``bench_datasets.HelloSchema``: a 128x256x3 PNG and a 4x128x30x3 ``.npy`` array per row)
is read by ``petastorm.pytorch.DataLoader(make_reader(...), batch_size=64)``, and by a Hugging Face ``datasets``
pipeline that decodes the same images once with ``.map(num_proc=2)`` and reads the decoded Arrow files back in
batches of 64 on later epochs, in each of its layouts (``Array3D``/``Array4D`` features, or flat fixed-length
lists reshaped by the consumer) and formats (``torch``, ``numpy``). The fastest of them is the reference.

Rounds are interleaved (each round runs every case once, so a change of load on the machine hits them alike);
rates are medians over the rounds, next to the CPU time the pass took in this process per sample (what the
rate would be bound by on an idle machine). Each timed pass starts before the reader is made and ends after its
last batch, so reader start-up is included:
  no cache           one epoch, no cache
  decoded, 1st epoch one epoch into a new cache directory (decodes and writes the cache)
  decoded, later     --epochs epochs from that directory (one reader)
  HF <layout> <fmt>  --epochs epochs of ``Dataset.iter(batch_size=64)`` over the decoded files

``--images photo`` stores photographs shipped with scikit-image (astronaut, coffee, chelsea, resized to 128x256)
in the PNG column instead of the hello-world random pixels: PNG files that compress and cost more to decode, as
real images do (random pixels make PNG decoding little more than a copy, the cheapest case for a loader and the
dearest for a cache's first epoch).

Usage: python benchmarks/decoded_cache_bench.py [--quick] [--rows 2000] [--rounds 3] [--epochs 3] [--data DIR]
                                                [--images noise|photo] [--no-hf]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from bench_datasets import HelloSchema, hello_rows

from petastorm import make_reader, write_dataset

BATCH = 64
IMAGE_SHAPE, ARRAY_SHAPE = (128, 256, 3), (4, 128, 30, 3)


def photo_rows(count: int):
    """Hello-world rows whose image is one of three photographs (shifted per row), the array random as there."""
    import cv2
    import numpy as np
    from skimage import data

    photos = [cv2.resize(getattr(data, name)(), IMAGE_SHAPE[1::-1], interpolation=cv2.INTER_AREA)
              for name in ('astronaut', 'coffee', 'chelsea')]
    for row in hello_rows(count):
        row['image1'] = np.roll(photos[row['id'] % 3], row['id'] % 64, axis=1)
        yield row


def _load() -> str:
    return ', '.join(f'{value:.1f}' for value in os.getloadavg())


def _bytes(paths) -> int:
    return sum(os.path.getsize(path) for path in paths)


def cache_arguments(location: Path) -> dict:
    """The reader arguments of a decoded-column cache in ``location`` that later readers keep using."""
    return {'cache_type': 'local-disk-decoded', 'cache_location': str(location), 'cache_size_limit': 64 << 30,
            'cache_row_size_estimate': 1 << 20, 'cache_extra_settings': {'cleanup': False}}


class Pass:
    """Times one pass: samples/s, and CPU microseconds per sample of this process (all its threads)."""

    def __enter__(self) -> Pass:
        self.count = 0
        self._start, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc_info) -> None:
        self.rate = self.count / (time.perf_counter() - self._start)
        self.cpu_us = (time.process_time() - self._cpu) / max(self.count, 1) * 1e6


def loader_pass(url: str, epochs: int, **cache) -> Pass:
    """``epochs`` epochs of our DataLoader (batch 64) with the thread pool, reader start-up included."""
    from petastorm.pytorch import DataLoader

    with Pass() as timed, DataLoader(make_reader(url, num_epochs=epochs, **cache), batch_size=BATCH) as loader:
        for batch in loader:
            timed.count += len(batch['id'])
    return timed


def write_pass(directory: Path, total_bytes: int, chunk_bytes: int = 16 << 20) -> float:
    """Seconds to write ``total_bytes`` to new files in ``directory`` (what the first epoch adds to a read)."""
    block = os.urandom(chunk_bytes)
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for index in range(max(1, total_bytes // chunk_bytes)):
        with open(directory / f'block{index}', 'wb') as file:
            file.write(block)
    seconds = time.perf_counter() - start
    shutil.rmtree(directory, ignore_errors=True)
    return seconds


def _hf_decode(batch: dict, flat: bool) -> dict:
    import cv2
    import numpy as np

    images = [cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)
              for payload in batch['image1']]
    arrays = [np.load(io.BytesIO(payload)) for payload in batch['array_4d']]
    if flat:
        return {'id': batch['id'], 'image1': np.stack(images).reshape(len(images), -1),
                'array_4d': np.stack(arrays).reshape(len(arrays), -1)}
    return {'id': batch['id'], 'image1': images, 'array_4d': arrays}


def hf_prepare(parquet_files: list[str], root: Path) -> dict:
    """The store decoded once per HF layout: ``{layout: (dataset, seconds of .map, bytes of decoded files)}``."""
    import math
    from functools import partial

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    raw = datasets.Dataset.from_parquet(parquet_files, cache_dir=str(root / 'hf_parquet'))
    layouts = {
        'Array3D': datasets.Features({'id': datasets.Value('int32'),
                                      'image1': datasets.Array3D(IMAGE_SHAPE, 'uint8'),
                                      'array_4d': datasets.Array4D(ARRAY_SHAPE, 'uint8')}),
        'flat list': datasets.Features({'id': datasets.Value('int32'),
                                        'image1': datasets.List(datasets.Value('uint8'), length=math.prod(IMAGE_SHAPE)),
                                        'array_4d': datasets.List(datasets.Value('uint8'),
                                                                  length=math.prod(ARRAY_SHAPE))}),
    }
    prepared = {}
    for name, features in layouts.items():
        start = time.perf_counter()
        decoded = raw.map(partial(_hf_decode, flat=name == 'flat list'), batched=True, batch_size=BATCH, num_proc=2,
                          features=features, cache_file_name=str(root / f'hf_{name.replace(" ", "_")}.arrow'),
                          load_from_cache_file=False)
        prepared[name] = (decoded, time.perf_counter() - start, _bytes(f['filename'] for f in decoded.cache_files))
    return prepared


def hf_pass(dataset, fmt: str, epochs: int) -> Pass:
    """``epochs`` epochs of ``Dataset.iter(batch_size=64)`` in format ``fmt``."""
    formatted = dataset.with_format(fmt)
    with Pass() as timed:
        for _ in range(epochs):
            for batch in formatted.iter(batch_size=BATCH):
                timed.count += len(batch['id'])
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='small store, one round, no HF pipeline (smoke test)')
    parser.add_argument('--rows', type=int, default=2000)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--epochs', type=int, default=3, help='epochs per pass of the later-epoch cases')
    parser.add_argument('--data', default=None, help='where to keep the store, the caches and the HF files')
    parser.add_argument('--no-hf', action='store_true', help='leave out the Hugging Face pipeline')
    parser.add_argument('--images', choices=('noise', 'photo'), default='noise',
                        help='hello-world random pixels (default) or photographs in the PNG column')
    args = parser.parse_args()
    rows, rounds, epochs = (200, 1, 2) if args.quick else (args.rows, args.rounds, args.epochs)
    warnings.filterwarnings('ignore', category=UserWarning)
    root = Path(args.data or tempfile.mkdtemp(prefix='decoded_cache_bench_'))
    store = root / f'hello{rows}' if args.images == 'noise' else root / f'photo{rows}'
    url = store.as_uri()
    if not store.exists():
        write_dataset(url, HelloSchema, (hello_rows if args.images == 'noise' else photo_rows)(rows),
                      row_group_size_mb=16)
    parquet_files = sorted(str(p) for p in store.rglob('*.parquet'))
    load_before = _load()

    prepared = {}
    if not (args.quick or args.no_hf):
        prepared = hf_prepare(parquet_files, root)

    loader_pass(url, 1)  # warm-up: lazy imports, image decoders, the page cache of the store
    passes: dict[str, list[Pass]] = {}
    write_seconds: list[float] = []
    cache_bytes = 0
    for round_index in range(rounds):
        cache_dir = root / f'decoded_cache{round_index}'
        shutil.rmtree(cache_dir, ignore_errors=True)
        cache = cache_arguments(cache_dir)
        passes.setdefault('no cache', []).append(loader_pass(url, 1))
        passes.setdefault('decoded cache, first epoch', []).append(loader_pass(url, 1, **cache))
        passes.setdefault('decoded cache, later epochs', []).append(loader_pass(url, epochs, **cache))
        cache_bytes = _bytes(cache_dir.rglob('*.arrow'))
        write_seconds.append(write_pass(root / 'write_pass', cache_bytes))
        for name, (dataset, _, _) in prepared.items():
            for fmt in ('torch', 'numpy'):
                passes.setdefault(f'HF {name}, {fmt}', []).append(hf_pass(dataset, fmt, epochs))
        shutil.rmtree(cache_dir, ignore_errors=True)

    medians = {case: statistics.median(p.rate for p in values) for case, values in passes.items()}
    cpu = {case: statistics.median(p.cpu_us for p in values) for case, values in passes.items()}
    parquet_bytes = _bytes(parquet_files)
    print(f'hello world ({args.images} images), {rows} rows, {len(parquet_files)} Parquet file(s), DataLoader '
          f'batch {BATCH}, {rounds} interleaved rounds, later epochs {epochs} per pass (python '
          f'{sys.version.split()[0]}, {os.cpu_count()} cores; load average {load_before} before, {_load()} after)')
    print('| case | samples/s | CPU µs/sample |')
    print('|---|---:|---:|')
    for case, rate in medians.items():
        print(f'| {case} | {rate:,.0f} | {cpu[case]:,.0f} |')
    first, none = 'decoded cache, first epoch', 'no cache'
    print(f'decoded cache, first epoch / no cache: {medians[first] / medians[none]:.2f} (goal >= 0.8); CPU per '
          f'sample, no cache / first epoch: {cpu[none] / cpu[first]:.2f}')
    print(f'decoded cache, later epochs / no cache: '
          f'{medians["decoded cache, later epochs"] / medians["no cache"]:.2f}')
    # Where the first epoch's time goes: the epoch without a cache, plus writing the entries' bytes to new files.
    epoch_seconds = {case: rows / medians[case] for case in (none, first)}
    written = statistics.median(write_seconds)
    print(f'first epoch {epoch_seconds[first]:.2f} s = no cache {epoch_seconds[none]:.2f} s + '
          f'{epoch_seconds[first] - epoch_seconds[none]:.2f} s; writing the {cache_bytes / 1e6:,.0f} MB of entries '
          f'to new files alone takes {written:.2f} s here ({cache_bytes / 1e6 / written:,.0f} MB/s)')
    print(f'bytes on disk / Parquet store ({parquet_bytes / 1e6:,.0f} MB): decoded cache '
          f'{cache_bytes / parquet_bytes:.2f}x' + ''.join(
              f', HF {name} {size / parquet_bytes:.2f}x' for name, (_, _, size) in prepared.items()))
    if prepared:
        best = max((case for case in medians if case.startswith('HF ')), key=medians.__getitem__)
        print('HF one-time decode (.map, num_proc=2): ' + ', '.join(
            f'{name} {seconds:.1f} s' for name, (_, seconds, _) in prepared.items()))
        print(f'decoded cache, later epochs / fastest HF ({best}): '
              f'{medians["decoded cache, later epochs"] / medians[best]:.2f} (goal >= 1.2)')
    if args.data is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()
