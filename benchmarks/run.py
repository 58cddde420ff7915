"""Run the project's benchmark cases and record them: a markdown table and a ratio plot, with the machine.

Each group reuses the functions of its own benchmark script and compares our throughput with a limit measured in
the same run on the same data (see those scripts for what each limit is):

  codecs   codecs_bench.py: codec encode/decode rows/s vs the plain library calls; image decode vs OpenCV
  reader   reader_bench.py: make_batch_reader vs a pyarrow scan; make_reader vs the decode limit on all cores
  torch    torch_bench.py:  BatchedDataLoader vs a pyarrow->torch loop; DataLoader vs make_reader alone; hello
           world with our image decoders vs OpenCV's, and the process pool vs the thread pool
  cache    cache_bench.py:  a warm local disk cache over a slow filesystem vs reading the local files directly;
           decoded_cache_bench.py: hello world through the decoded-column cache, later epochs vs a Hugging Face
           datasets pipeline that decoded the images once, first epoch vs no cache
  storage  storage_bench.py: make_batch_reader from S3 (moto on loopback) vs from local disk

Writes ``benchmarks.md`` and ``benchmarks.png`` into --output-dir (default, for a full run only: the repository's
``docs``; a quick or partial run must name its own directory, so that it never replaces the committed results).

    python benchmarks/run.py                                             # full run, several minutes
    python benchmarks/run.py --quick --cases codecs --output-dir /tmp/b  # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The benchmark scripts import their shared helpers by module name, as they do when run on their own.
sys.path.insert(0, str(Path(__file__).resolve().parent))

GROUPS = ('codecs', 'reader', 'torch', 'cache', 'storage')
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / 'docs'


@dataclass(frozen=True)
class Measurement:
    """Our throughput in one case and the limit it is compared with, measured in the same run."""

    group: str
    case: str
    unit: str
    ours: float
    limit_name: str
    limit: float

    @property
    def ratio(self) -> float:
        """ours / limit: 1.0 is as fast as the limit, above 1 faster."""
        return self.ours / self.limit if self.limit else float('nan')


@dataclass(frozen=True)
class Settings:
    """How big and how long: ``quick`` shrinks data, repeats and measuring time to a smoke run."""

    quick: bool
    repeats: int
    data_root: Path

    @property
    def seconds(self) -> float:
        """Measuring time of a streaming (endless loader) case."""
        return 0.5 if self.quick else 3.0


def codecs_cases(settings: Settings) -> list[Measurement]:
    import codecs_bench

    rows, column_rows = (16, 32) if settings.quick else (256, 512)
    found = [Measurement('codecs', f'{name} {op}', 'rows/s', ours, 'library call', raw)
             for name, op, ours, raw in codecs_bench.run(rows, column_rows, settings.repeats)]
    cores = os.cpu_count() or 1
    for rate in codecs_bench.run_decoders(settings.quick, settings.repeats):
        if rate.decoder != 'ours (auto)':
            continue  # the per-library rows are in codecs_bench.py's own table
        found += [Measurement('codecs', f'{rate.images} {rate.size} decode, 1 core', 'img/s', rate.one_core,
                              'OpenCV', rate.opencv_one_core),
                  Measurement('codecs', f'{rate.images} {rate.size} decode, {cores} threads', 'img/s',
                              rate.all_cores, 'OpenCV', rate.opencv_all_cores)]
    return found


def reader_cases(settings: Settings) -> list[Measurement]:
    import multiprocessing

    import reader_bench
    from bench_datasets import timed_passes

    paths = reader_bench.make_data(str(settings.data_root / 'reader'), settings.quick)
    repeats = settings.repeats
    cores = os.cpu_count() or 1
    scan = timed_passes(lambda: reader_bench.raw_scan(paths['scalars']), repeats)
    found = [Measurement('reader', 'scalars make_batch_reader thread w2', 'rows/s',
                         timed_passes(lambda: reader_bench.batch_reader(paths['scalars'], 2), repeats),
                         'pyarrow scan', scan)]
    with multiprocessing.get_context('spawn').Pool(cores) as pool:
        for name, images, arrays in (('hello', ['image1'], ['array_4d']), ('mnist', [], ['image'])):
            reader_bench.decode_limit(paths[name], images, arrays, pool)  # starts the decoder processes
            limit = timed_passes(lambda n=name, i=images, a=arrays: reader_bench.decode_limit(paths[n], i, a, pool),
                                 repeats)
            for pool_kind in ('thread', 'process'):
                ours = reader_bench.row_reader_rate(paths[name], 2, pool_kind, repeats)
                found.append(Measurement('reader', f'{name} make_reader {pool_kind} w2', 'rows/s', ours,
                                         f'decode limit ({cores} procs)', limit))
    return found


def torch_cases(settings: Settings) -> list[Measurement]:
    import torch_bench

    paths = torch_bench.make_data(str(settings.data_root / 'torch'), settings.quick, ('hello', 'mnist', 'scalars'))
    hello, _ = torch_bench.run_isolated(torch_bench.case_hello_backends, paths['hello'], settings.seconds,
                                        settings.repeats)
    scalars, _ = torch_bench.run_isolated(torch_bench.case_scalars, paths['scalars'], settings.seconds,
                                          settings.repeats)
    mnist, _ = torch_bench.run_isolated(torch_bench.case_mnist, paths['mnist'], settings.seconds, settings.repeats)
    raw_loop = scalars['scalars raw pyarrow->torch loop']
    hello_rows = [Measurement('torch', f'hello {what} {pool} w2', 'rows/s', hello[f'hello {what} {pool} w2 [auto]'],
                              'same, OpenCV decode', hello[f'hello {what} {pool} w2 [opencv]'])
                  for what in ('make_reader', 'DataLoader bs64') for pool in ('thread', 'process')]
    hello_rows.append(Measurement('torch', 'hello DataLoader bs64 process w2', 'rows/s',
                                  hello['hello DataLoader bs64 process w2 [auto]'], 'thread pool',
                                  hello['hello DataLoader bs64 thread w2 [auto]']))
    return [
        *hello_rows,
        Measurement('torch', 'scalars BatchedDataLoader bs1024', 'rows/s', scalars['scalars BatchedDataLoader bs1024'],
                    'pyarrow->torch loop', raw_loop),
        Measurement('torch', 'scalars BatchedDataLoader bs1024 shuffled (100k queue)', 'rows/s',
                    scalars['scalars BatchedDataLoader bs1024 shufq100k'], 'pyarrow->torch loop', raw_loop),
        Measurement('torch', 'mnist DataLoader bs64', 'rows/s', mnist['mnist DataLoader bs64'], 'make_reader alone',
                    mnist['mnist make_reader']),
    ]


def cache_cases(settings: Settings) -> list[Measurement]:
    import cache_bench
    import pyarrow.fs as pafs

    from petastorm import write_dataset
    from petastorm.test_util.latency_fs import SlowLocalHandler

    rows, workers, latency = (300 if settings.quick else 6000), 4, 0.05
    root = settings.data_root / 'cache'
    url = (root / 'dataset').as_uri()
    if not (root / 'dataset').exists():
        write_dataset(url, cache_bench.BenchSchema, cache_bench._rows(rows), row_group_size_mb=0.5, file_size_mb=8)
    slow = pafs.PyFileSystem(SlowLocalHandler(latency))
    local, cold, warm = [], [], []
    for repeat in range(settings.repeats):
        cache_dir = root / f'cache{repeat}'
        # Rates from the rows each epoch read: a dataset kept in --data may hold another number of rows.
        for rates, args in ((local, ()), (cold, (slow, cache_dir)), (warm, (slow, cache_dir))):
            seconds, count = cache_bench._epoch(url, workers, *args)
            rates.append(count / seconds)
        shutil.rmtree(cache_dir, ignore_errors=True)
    limit = statistics.median(local)
    name = f'{latency * 1000:.0f} ms/open filesystem, {workers} threads'
    return [Measurement('cache', f'warm local disk cache ({name})', 'rows/s', statistics.median(warm),
                        'local files, no cache', limit),
            Measurement('cache', f'cold cache, first epoch ({name})', 'rows/s', statistics.median(cold),
                        'local files, no cache', limit),
            *decoded_cache_cases(settings)]


def decoded_cache_cases(settings: Settings) -> list[Measurement]:
    import decoded_cache_bench as bench
    from bench_datasets import HelloSchema, hello_rows

    from petastorm import write_dataset

    rows, epochs = (200, 2) if settings.quick else (2000, 3)
    root = settings.data_root / 'decoded_cache'
    store = root / f'hello{rows}'
    if not store.exists():
        write_dataset(store.as_uri(), HelloSchema, hello_rows(rows), row_group_size_mb=16)
    # The quick run leaves out the Hugging Face pipeline (its one-time decode starts two processes).
    prepared = {} if settings.quick else bench.hf_prepare(sorted(str(p) for p in store.rglob('*.parquet')), root)
    bench.loader_pass(store.as_uri(), 1)  # warm-up: lazy imports, image decoders, the page cache of the store
    rates: dict[str, list[float]] = {}
    for repeat in range(settings.repeats):  # interleaved: a change of load hits every case alike
        cache_dir = root / f'cache{repeat}'
        shutil.rmtree(cache_dir, ignore_errors=True)
        cache = bench.cache_arguments(cache_dir)
        rates.setdefault('none', []).append(bench.loader_pass(store.as_uri(), 1).rate)
        rates.setdefault('first', []).append(bench.loader_pass(store.as_uri(), 1, **cache).rate)
        rates.setdefault('later', []).append(bench.loader_pass(store.as_uri(), epochs, **cache).rate)
        for layout, (dataset, _, _) in prepared.items():
            for fmt in ('torch', 'numpy'):
                rates.setdefault(f'HF {layout}, {fmt}', []).append(bench.hf_pass(dataset, fmt, epochs).rate)
        shutil.rmtree(cache_dir, ignore_errors=True)
    medians = {case: statistics.median(values) for case, values in rates.items()}
    case = 'hello DataLoader bs64, decoded cache'
    found = [Measurement('cache', f'{case}, first epoch', 'rows/s', medians['first'], 'no cache', medians['none'])]
    hf = {name: rate for name, rate in medians.items() if name.startswith('HF ')}
    if hf:
        best = max(hf, key=hf.__getitem__)
        found.append(Measurement('cache', f'{case}, later epochs', 'rows/s', medians['later'],
                                 f'{best} (decoded once)', hf[best]))
    else:
        found.append(Measurement('cache', f'{case}, later epochs', 'rows/s', medians['later'], 'no cache',
                                 medians['none']))
    return found


def storage_cases(settings: Settings) -> list[Measurement]:
    import storage_bench  # puts tests/ on sys.path for s3_loopback

    from support.s3_loopback import MotoServer

    rows, workers = (100_000 if settings.quick else 1_000_000), 4
    table = storage_bench.make_table(rows)
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as moto:
        options = moto.storage_options()
        local_url, s3_url = storage_bench.write_local_and_s3(table, tmp, options)
        times = storage_bench.median_read_times(local_url, s3_url, options, workers, rows, settings.repeats)
    return [Measurement('storage', f's3 (moto, loopback) {case}', 'rows/s', rows / remote, 'local disk', rows / local)
            for case, (local, remote) in times.items()]


CASES: dict[str, Callable[[Settings], list[Measurement]]] = {
    'codecs': codecs_cases, 'reader': reader_cases, 'torch': torch_cases, 'cache': cache_cases,
    'storage': storage_cases,
}


def machine() -> dict[str, str]:
    """The machine and the library versions the numbers were measured with."""
    from importlib import metadata

    def version(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return 'not installed'

    processor = f', {platform.processor()}' if platform.processor() else ''
    ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    load = ', '.join(f'{value:.1f}' for value in os.getloadavg())
    return {
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        'cpu': f'{os.cpu_count()} cores ({platform.machine()}{processor})',
        'ram': f'{ram:.1f} GiB',
        'os': platform.platform(),
        'load average at the end (1, 5, 15 min)': load,
        'python': platform.python_version(),
        'pyarrow': version('pyarrow'),
        'numpy': version('numpy'),
        'torch': version('torch'),
    }


def markdown(measurements: list[Measurement], host: dict[str, str], command: str, seconds: float) -> str:
    """The report: how it was made, on what machine, the table and the plot."""
    lines = [
        '# Benchmarks',
        '',
        'Throughput of each case next to its limit, measured in the same run on the same data; `ours / limit` is',
        'the ratio plotted below (1.0 = as fast as the limit). The limits are raw library calls (pyarrow scans,',
        'the image and `.npy` decoders on every core, a plain pyarrow-to-torch loop, local disk instead of',
        'remote storage). Rates on a machine shared with other work are noisy: compare ratios, not rates.',
        '',
        f'Made with `{command}` in {seconds:.0f} s.',
        '',
        '| machine | |',
        '|---|---|',
        *(f'| {key} | {value} |' for key, value in host.items()),
        '',
        '| group | case | ours | limit | limit value | unit | ours / limit |',
        '|---|---|---:|---|---:|---|---:|',
    ]
    for m in measurements:
        lines.append(f'| {m.group} | {m.case} | {m.ours:,.0f} | {m.limit_name} | {m.limit:,.0f} | {m.unit} | '
                     f'{m.ratio:.2f} |')
    lines += ['', '![ours / limit per case](benchmarks.png)', '']
    return '\n'.join(lines)


def plot(measurements: list[Measurement], host: dict[str, str], path: Path) -> None:
    """Horizontal bars of ours / limit per case (log scale), coloured by group, with the parity line."""
    import matplotlib

    matplotlib.use('Agg')  # files only: no display needed
    import matplotlib.pyplot as plt

    labels = [f'{m.group}: {m.case}' for m in measurements]
    ratios = [m.ratio for m in measurements]
    palette = plt.get_cmap('tab10')
    colours = [palette(GROUPS.index(m.group) % 10) for m in measurements]
    figure, axes = plt.subplots(figsize=(10, 0.32 * len(measurements) + 1.6))
    positions = range(len(measurements))
    axes.barh(positions, ratios, color=colours)
    axes.set_yticks(list(positions), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xscale('log')
    axes.axvline(1.0, color='black', linewidth=1)
    for position, ratio in zip(positions, ratios, strict=True):
        axes.annotate(f'{ratio:.2f}', (ratio, position), xytext=(3, 0), textcoords='offset points', va='center',
                      fontsize=7)
    axes.set_xlabel('ours / limit (log scale; 1 = as fast as the limit)')
    axes.set_title(f'Throughput vs limit - {host["cpu"]}, {host["ram"]} RAM, {host["date"]}', fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _result_flags(args: argparse.Namespace) -> list[str]:
    # Only the flags that change the numbers: where data and output go does not.
    flags = ['--quick'] if args.quick else []
    if args.cases != ','.join(GROUPS):
        flags += ['--cases', args.cases]
    if not args.quick and args.repeats != 3:
        flags += ['--repeats', str(args.repeats)]
    return flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='small data, one repeat, short runs (smoke test)')
    parser.add_argument('--cases', default=','.join(GROUPS), help='comma-separated groups (default: %(default)s)')
    parser.add_argument('--repeats', type=int, default=3, help='repeats per case; the median is kept')
    parser.add_argument('--output-dir', type=Path, default=None,
                        help='where benchmarks.md and benchmarks.png go (default for a full run: the docs directory)')
    parser.add_argument('--data', type=Path, default=None, help='where to keep the generated datasets')
    args = parser.parse_args(argv)
    groups = [g for g in args.cases.split(',') if g]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f'unknown --cases {unknown}; expected some of {", ".join(GROUPS)}')
    if args.output_dir is None:
        if args.quick or groups != list(GROUPS):
            parser.error('a --quick or partial run needs --output-dir: by default the results replace the '
                         f'committed ones in {DEFAULT_OUTPUT}')
        args.output_dir = DEFAULT_OUTPUT
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='petastorm-bench-') as scratch:
        settings = Settings(quick=args.quick, repeats=1 if args.quick else args.repeats,
                            data_root=args.data or Path(scratch))
        measurements = []
        for group in groups:
            group_started = time.perf_counter()
            measurements += CASES[group](settings)
            print(f'{group}: {time.perf_counter() - group_started:.1f} s', file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    host = machine()
    command = ' '.join(['python benchmarks/run.py', *_result_flags(args)])
    args.output_dir.mkdir(parents=True, exist_ok=True)
    report = markdown(measurements, host, command, seconds)
    (args.output_dir / 'benchmarks.md').write_text(report)
    plot(measurements, host, args.output_dir / 'benchmarks.png')
    print(report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
