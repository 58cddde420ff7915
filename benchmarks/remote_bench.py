"""Reading from object storage behind real latency, in one run: ours vs the raw pyarrow limit, Petastorm 0.13.1,
Hugging Face ``datasets`` streaming and Ray Data.

The set-up, all on 127.0.0.1 and without root:

* ``petastorm.test_util.s3_server`` in a process of its own serves a directory of hard links to the stores (bucket
  ``bench``); bodies go out with ``sendfile``, and it counts requests and bytes;
* one ``petastorm.test_util.delay_proxy`` process per latency in front of it (0 ms too, so every case crosses the
  same path): every byte leaves the proxy ``delay`` after it arrived, each way, and a new connection costs a round
  trip more.

Before the cases, ``capacity`` rows say what the set-up itself delivers: every object read whole by 8 threads of
pyarrow's S3 client, straight from the server and through each proxy. A reader slower than that is measuring itself.

The stores:

* ``scalars`` and ``hello_world``, written by Petastorm 0.13.1 (``shared/bench/make_datasets.py``);
* ``images``: 24,000 rows of a 96x96 JPEG photo crop, a label and an id, written here by our writer (with the
  schema entry Petastorm 0.13.1 reads) when ``--data-root`` does not have it.

The cache rows time a second epoch served by our local disk caches, next to the same store read from local disk
(the requests and MB of a cache row are both epochs').

Each case (see ``remote_cases.py`` for what each system does) runs in a fresh process; rounds run the cases in a
rotated order (and the systems of a store and delay take turns going first: give a number of rounds that their
number divides), and the table gives the median over rounds of: rows/s for one epoch, seconds to the first batch,
requests and MB the server answered, and the peak RSS of the reading process and its children. ``raw`` is the limit:
pyarrow's S3 client with the same number of threads, the same columns and the same decoders as ours, and ``raw
bytes`` the same without decoding.

Usage:
    python benchmarks/remote_bench.py --data-root /tmp/anchor-data \\
        [--anchor-python /tmp/petastorm-anchor-venv/bin/python] [--delays 0,10,50] [--rounds 2] \\
        [--stores scalars,hello_world,images] [--systems ours,raw,raw-bytes,petastorm,hf,ray] [--out-json F]

Petastorm 0.13.1 runs only with ``--anchor-python``: the python of an environment of its own where Petastorm 0.13.1
and s3fs are installed (it does not install beside today's numpy and pyarrow).

``images_big`` is the image store written with row groups of 32 MB instead of 2 MB (about 11,400 rows each): the
first batch of a reader waits for its first row group decoded whole, a loader's (``ours-loader``) for one batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from remote_services import BUCKET, CLIENT_ENVIRONMENT, Service, exit_on_terminate, serving  # noqa: E402

CASES = os.path.join(HERE, 'remote_cases.py')
IMAGE_ROWS = 24_000
SYSTEM_ORDER = ('ours', 'raw', 'raw-bytes', 'petastorm', 'hf', 'ray', 'ours-disk-cache', 'ours-decoded-cache',
                'ours-local')
SYSTEM_NAMES = {'ours': 'ours', 'raw': 'raw pyarrow + decode', 'raw-bytes': 'raw pyarrow, bytes only',
                'petastorm': 'Petastorm 0.13.1', 'hf': 'HF datasets streaming', 'ray': 'Ray Data',
                'ours-disk-cache': "ours, 2nd epoch from cache_type='local-disk'",
                'ours-decoded-cache': "ours, 2nd epoch from cache_type='local-disk-decoded'",
                'ours-local': 'ours from local disk', 'ours-loader': 'ours, BatchedDataLoader(batch_size=256)',
                'ours-loader-whole': 'ours, BatchedDataLoader, first item whole'}


# ------------------------------------------------------------------------------------------------ the stores


def write_image_store(path: str, rows: int, row_group_mb: float = 2) -> None:
    """``rows`` rows of a 96x96 JPEG (crops of scikit-image's photos, shifted per row), a label and an id."""
    import numpy as np
    import pyarrow as pa
    from skimage import data as samples

    from petastorm import write_dataset
    from petastorm.codecs import CompressedImageCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField

    schema = Unischema('ImageStore', [
        UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField('label', np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField('image', np.uint8, (96, 96, 3), CompressedImageCodec('jpeg', quality=90), False),
    ])
    photos = [samples.astronaut(), samples.coffee(), samples.chelsea(), samples.rocket()]

    def generate():
        rng = np.random.default_rng(0)
        for index in range(rows):
            photo = photos[index % len(photos)]
            top = int(rng.integers(0, photo.shape[0] - 96))
            left = int(rng.integers(0, photo.shape[1] - 96))
            yield {'id': index, 'label': index % 10, 'image': np.ascontiguousarray(photo[top:top + 96, left:left + 96])}

    write_dataset('file://' + path, schema, generate(), row_group_size_mb=row_group_mb,
                  file_size_mb=max(8, 4 * row_group_mb), mode='overwrite')


def write_scalar_store(path: str, rows: int, files: int = 10) -> None:
    """A stand-in for Petastorm 0.13.1's ``scalars`` (plain Parquet, no Petastorm metadata): ``id`` and nine
    float32, float64 and int32 columns in ``files`` files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = -(-rows // files)
    for index in range(files):
        ids = np.arange(index * per_file, min(rows, (index + 1) * per_file), dtype=np.int64)
        columns = {'id': ids}
        for column in range(9):
            kind = (np.float32, np.float64, np.int32)[column % 3]
            values = rng.random(len(ids)) * 1000
            columns[f'c{column}'] = values.astype(kind)
        pq.write_table(pa.table(columns), os.path.join(path, f'part-{index:05d}.parquet'))


def write_hello_store(path: str, rows: int) -> None:
    """A stand-in for Petastorm 0.13.1's ``hello_world``: its schema (a PNG and a 4-d array per row), our writer."""
    from bench_datasets import HelloSchema, hello_rows

    from petastorm import write_dataset

    write_dataset('file://' + path, HelloSchema, hello_rows(rows), row_group_size_mb=32, file_size_mb=64,
                  mode='overwrite')


def link_tree(source: str, target: str) -> None:
    """``target`` as a tree of hard links to ``source``'s files (copies across devices)."""
    for directory, _, files in os.walk(source):
        destination = os.path.join(target, os.path.relpath(directory, source))
        os.makedirs(destination, exist_ok=True)
        for name in files:
            try:
                os.link(os.path.join(directory, name), os.path.join(destination, name))
            except OSError:
                shutil.copy2(os.path.join(directory, name), os.path.join(destination, name))


def store_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(os.path.join(directory, name)).metadata.num_rows
               for directory, _, files in os.walk(path) for name in files
               if name.endswith('.parquet') and not name.startswith(('_', '.')))


# ------------------------------------------------------------------------------------------------- the cases


def run_case(python: str, system: str, url: str, endpoint: str, counter: Callable[[bool], dict] | None,
             workers: int, timeout: float, first_only: bool = False, local_root: str | None = None) -> dict:
    """One case in a fresh process (see ``remote_cases.py``), with the requests (or connections) and bytes that
    ``counter`` counted meanwhile."""
    if counter is not None:
        counter(True)
    command = [python, CASES, system, url, endpoint, '--workers', str(workers)] + (['--first-only'] * first_only)
    command += ['--local-root', local_root] if local_root else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**CLIENT_ENVIRONMENT, **os.environ})
    except subprocess.TimeoutExpired:
        return {'error': f'no result in {timeout:.0f} s'}
    counted = counter(True) if counter is not None else {}
    lines = [line for line in done.stdout.splitlines() if line.startswith('{')]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ['(no output)'])[-1]
        return {'error': tail[:200]}
    return {**json.loads(lines[-1]), **counted}


def capacity(python: str, service: Service) -> list[tuple[str, float]]:
    """MB/s of every object read whole by 8 threads: straight from the server, then through each proxy."""
    rows = []
    for name, endpoint in [('server', service.server)] + [(f'proxy {d} ms', e) for d, e in service.proxies.items()]:
        result = run_case(python, 'capacity', service.url(), endpoint, None, 8, 600)
        # the capacity case's "rows" are the bytes it read
        rows.append((name, result['rows'] / result['seconds'] / 1e6 if 'error' not in result else float('nan')))
    return rows


def _runs_at(system: str, delay: int, delays: list[int]) -> bool:
    """The cache rows' timed epoch reads no store: they run at the longest delay only, local disk at the first."""
    if system == 'ours-local':
        return delay == delays[0]
    if system in ('ours-disk-cache', 'ours-decoded-cache'):
        return delay == delays[-1]
    return True


def median(results: list[dict], key: str) -> float:
    values = [r[key] for r in results if 'error' not in r]
    return statistics.median(values) if values else float('nan')


def _count(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs if 'error' not in r and r.get(key) is not None]
    return f'{statistics.median(values):,.0f}' if values else '-'


def _cpu(runs: list[dict]) -> str:
    """The CPU seconds of the runs (every thread's), median and range: on a shared virtual machine a run's time
    follows them, and faulting fresh memory moves them several-fold between runs of the same read."""
    values = [r['cpu'] for r in runs if 'error' not in r]
    return f'{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})' if values else '-'


def table(results: dict, cloud: str, stores: list[str], delays: list[int], systems: list[str],
          rows_of: dict[str, int]) -> str:
    """One table per store of ``cloud``: each system at each delay (medians over the rounds)."""
    counted = 'requests' if cloud == 's3' else 'connections'
    lines = []
    for store in stores:
        lines += ['', f'### {cloud}: {store} ({rows_of[store]:,} rows)', '',
                  f'| one-way delay | system | rows/s | first batch s | vs raw | CPU s (fewest-most) | {counted} '
                  f'| MB | peak RSS MB |',
                  '|---:|---|---:|---:|---:|---:|---:|---:|---:|']
        for delay in delays:
            raw = median(results[cloud, store, delay, 'raw'], 'seconds') if 'raw' in systems else float('nan')
            for system in systems:
                runs = results[cloud, store, delay, system]
                if not runs:
                    continue
                errors = [r['error'] for r in runs if 'error' in r]
                if len(errors) == len(runs):
                    lines.append(f'| {delay} ms | {SYSTEM_NAMES[system]} | failed: {errors[0]} | | | | | | |')
                    continue
                seconds = median(runs, 'seconds')
                lines.append(
                    f'| {delay} ms | {SYSTEM_NAMES[system]} | {rows_of[store] / seconds:,.0f} | '
                    f'{median(runs, "first_batch"):.2f} | {raw / seconds:.2f} | {_cpu(runs)} | '
                    f'{_count(runs, counted)} | '
                    f'{median(runs, "bytes") / 1e6:,.0f} | {median(runs, "peak_rss") / 1e6:,.0f} |')
    return '\n'.join(lines)


def prepare_stores(data_root: str, stores: list[str], scalar_rows: int, hello_rows: int) -> None:
    """Write the stores ``data_root`` lacks: the image stores, and stand-ins for Petastorm 0.13.1's."""
    for name, row_group_mb in (('images', 2), ('images_big', 32)):
        if name in stores and not os.path.isdir(os.path.join(data_root, name)):
            print(f'writing the image store {name} ({IMAGE_ROWS:,} rows) under {data_root}', flush=True)
            write_image_store(os.path.join(data_root, name), IMAGE_ROWS, row_group_mb)
    if 'scalars' in stores and not os.path.isdir(os.path.join(data_root, 'scalars')):
        print(f'writing a stand-in scalar store ({scalar_rows:,} rows) under {data_root}', flush=True)
        write_scalar_store(os.path.join(data_root, 'scalars'), scalar_rows)
    if 'hello_world' in stores and not os.path.isdir(os.path.join(data_root, 'hello_world')):
        print(f'writing a stand-in hello-world store ({hello_rows:,} rows) under {data_root}', flush=True)
        write_hello_store(os.path.join(data_root, 'hello_world'), hello_rows)


def run_cloud(args: argparse.Namespace, cloud: str, root: str, stores: list[str], systems: list[str],
              rows_of: dict[str, int], results: dict) -> None:
    """Every case of ``cloud`` (its server and proxies up meanwhile), ``args.rounds`` times in rotated orders."""
    delays = [int(d) for d in args.delays.split(',')]
    with serving(root, delays, cloud) as service:
        print(f"## {cloud}: set-up capacity, every object read whole by 8 threads of pyarrow's client\n")
        for name, rate in capacity(sys.executable, service):
            print(f'- {name}: {rate:,.0f} MB/s')
        for round_index in range(args.rounds):
            # The systems of a case take turns going first: the first read after another store's (or another
            # delay's) was seen to be the slow one on the emulators, whichever system it was.
            turn = round_index % len(systems)
            cases = [(store, delay, system) for store in stores for delay in delays
                     for system in systems[turn:] + systems[:turn]
                     if _runs_at(system, delay, delays) and (system != 'petastorm' or cloud == 's3')]
            shift = round_index * len(cases) // max(1, args.rounds)
            for store, delay, system in cases[shift:] + cases[:shift]:
                python = args.anchor_python if system == 'petastorm' else sys.executable
                result = run_case(python, system, service.url(store), service.proxies[delay],
                                  service.counters[delay], args.workers, args.timeout, local_root=root)
                if 'error' not in result and result['rows'] != rows_of[store]:
                    result = {'error': f'read {result["rows"]} rows, the store has {rows_of[store]}'}
                results[cloud, store, delay, system].append(result)
                shown = result.get('error') or f'{result["seconds"]:.2f} s, first {result["first_batch"]:.2f} s'
                print(f'  round {round_index + 1}: {cloud} {store} {delay} ms {system}: {shown}', flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--data-root', required=True, help='holds scalars/ and hello_world/ (make_datasets.py)')
    parser.add_argument('--anchor-python', help="the python of Petastorm 0.13.1's side environment")
    parser.add_argument('--clouds', default='s3', help='s3, gcs (fake-gcs-server), azure (Azurite)')
    parser.add_argument('--delays', default='0,10,50', help='one-way delays in ms')
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--stores', default='scalars,hello_world,images')
    parser.add_argument('--systems', default=','.join(SYSTEM_ORDER))
    parser.add_argument('--workers', type=int, default=4, help='threads of every reader that takes a number')
    parser.add_argument('--timeout', type=float, default=600, help='seconds before a case counts as failed')
    parser.add_argument('--scalar-rows', type=int, default=5_000_000, help='rows of a stand-in scalar store')
    parser.add_argument('--hello-rows', type=int, default=2_000, help='rows of a stand-in hello-world store')
    parser.add_argument('--out-json', help='write every result here')
    args = parser.parse_args()
    exit_on_terminate()
    stores = args.stores.split(',')
    systems = [s for s in args.systems.split(',') if s != 'petastorm' or args.anchor_python]
    prepare_stores(args.data_root, stores, args.scalar_rows, args.hello_rows)
    rows_of = {store: store_rows(os.path.join(args.data_root, store)) for store in stores}

    results: dict = defaultdict(list)
    clouds = args.clouds.split(',')
    with tempfile.TemporaryDirectory(prefix='remote-bench-') as root:
        for store in stores:
            link_tree(os.path.join(args.data_root, store), os.path.join(root, BUCKET, store))
        for cloud in clouds:
            run_cloud(args, cloud, root, stores, systems, rows_of, results)
    delays = [int(d) for d in args.delays.split(',')]
    for cloud in clouds:
        print(table(results, cloud, stores, delays, systems, rows_of))
    if args.out_json:
        with open(args.out_json, 'w') as out:
            json.dump({'|'.join(map(str, key)): value for key, value in results.items()}, out, indent=1)


if __name__ == '__main__':
    started = time.perf_counter()
    main()
    print(f'\n({time.perf_counter() - started:.0f} s)')
