"""``petastorm-throughput.py``: measure the read throughput of a dataset.

Prints, like Petastorm::

    Average sample read rate: 3761.29 samples/sec; RAM 324.05 MB (rss); CPU 112.50%

or, with ``--json``, one JSON object. Progress goes to stderr (by default only when stderr is a terminal).
With ``-v`` (or ``--json``) the stages are timed too, and a breakdown before the result line (a ``"stages"``
entry in JSON) says which of I/O, filter, decode, transform, collate or queue wait bounds the rate.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence

from petastorm import cli as _cli
from petastorm.benchmark.throughput import (
    BenchmarkResult,
    Loader,
    ReadMethod,
    ThroughputReport,
    WorkerPoolType,
    _matching_fields,
    measure_throughput,
)

__all__ = ['PROG', 'format_result', 'main', 'result_as_json', 'show_progress']

PROG = 'petastorm-throughput.py'


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description='Measure how many samples per second a Petastorm reader delivers, with the RAM '
                               'and CPU it uses (measured in a fresh process).',
        epilog=f"example: {PROG} file:///tmp/dataset -m 20 -n 200 -w 2 -p thread --field-regex 'id.*'")
    parser.add_argument('dataset_path', metavar='dataset_url',
                        help='URL of the dataset, e.g. file:///tmp/dataset, s3://bucket/dataset or '
                             'hdfs:///path/to/dataset')
    parser.add_argument('--field-regex', type=str, nargs='+', metavar='FIELD_REGEX',
                        help='read only fields whose whole name matches one of these regular expressions '
                             '(default: all fields)')
    parser.add_argument('-w', '--workers-count', type=int, default=3, help='reader workers (default: %(default)s)')
    parser.add_argument('-p', '--pool-type', choices=[t.value for t in WorkerPoolType], default='thread',
                        help='reader worker pool (default: %(default)s)')
    parser.add_argument('-m', '--warmup-cycles', type=int, default=200,
                        help='samples read before measuring (default: %(default)s)')
    parser.add_argument('-n', '--measure-cycles', type=int, default=1000,
                        help='samples measured (default: %(default)s)')
    parser.add_argument('--profile-threads', action='store_true',
                        help='accepted for compatibility with Petastorm; has no effect')
    parser.add_argument('-d', '--read-method', choices=[m.value for m in ReadMethod], default='python',
                        help="'python': next(reader); 'tf': through a tf.data dataset, needs "
                             "pip install 'neo-petastorm[tf]' (default: %(default)s)")
    parser.add_argument('-q', '--shuffling-queue-size', type=int, default=500,
                        help='with -d tf: shuffle buffer size (default: %(default)s)')
    parser.add_argument('--min-after-dequeue', type=int, default=None,
                        help='accepted for compatibility and ignored: tf.data has no such setting')
    parser.add_argument('--batch', action='store_true',
                        help='use make_batch_reader (also reads plain Parquet); a cycle is then one batch and the '
                             'rate counts rows')
    parser.add_argument('--loader', choices=[loader.value for loader in Loader], default='none',
                        help="read through petastorm.pytorch.DataLoader ('torch') or BatchedDataLoader "
                             "('torch-batched'); a cycle is then one loader batch and the rate counts rows; needs "
                             "pip install 'neo-petastorm[torch]' (default: %(default)s)")
    parser.add_argument('--loader-batch-size', type=int, default=64,
                        help='rows per loader batch with --loader (default: %(default)s)')
    parser.add_argument('--json', action='store_true',
                        help='print the result, the settings and the stage breakdown as one JSON object')
    _cli.add_storage_options_argument(parser)
    parser.add_argument('--progress', action=argparse.BooleanOptionalAction, default=None,
                        help='show progress on stderr (default: only when stderr is a terminal)')
    parser.add_argument('-vv', action='store_true', help='debug logging')
    parser.add_argument('-v', action='store_true', help='info logging, and print the stage breakdown')
    _cli.add_version_argument(parser)
    return parser


def show_progress(phase: str, done: int, total: int) -> None:
    """Draw ``phase done/total`` on one stderr line (called from the benchmark process)."""
    end = '\n' if phase == 'measure' and done == total else ''
    print(f'\r{phase:>7}: {done}/{total} ({100 * done // max(total, 1)}%)', end=end, file=sys.stderr, flush=True)


def format_result(result: BenchmarkResult) -> str:
    """The result line Petastorm prints."""
    return (f'Average sample read rate: {result.samples_per_second:1.2f} samples/sec; '
            f'RAM {result.memory_info.rss / 2**20:1.2f} MB (rss); CPU {result.cpu:1.2f}%')


def result_as_json(report: ThroughputReport, args: argparse.Namespace) -> str:
    """The result, the settings that produced it and the stage breakdown, as one JSON object."""
    result = report.result
    return json.dumps({
        'dataset_url': args.dataset_path, 'samples_per_second': result.samples_per_second,
        'time_mean': result.time_mean, 'rss_bytes': int(result.memory_info.rss), 'cpu_percent': result.cpu,
        'warmup_cycles': args.warmup_cycles, 'measure_cycles': args.measure_cycles,
        'workers_count': args.workers_count, 'pool_type': args.pool_type, 'read_method': args.read_method,
        'batch': args.batch, 'field_regex': args.field_regex, 'loader': args.loader,
        'loader_batch_size': args.loader_batch_size,
        'stages': report.stages.as_dict() if report.stages is not None else None,
    })


def _require(module: str, feature: str) -> None:
    """Fail before spawning the benchmark when a framework is missing (finding it is cheaper than importing it)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        from petastorm._optional import import_optional

        import_optional(module, feature)  # raises the error that names the pip extra


def _configure_logging(args: argparse.Namespace) -> None:
    if args.vv or args.v:
        logging.basicConfig(stream=sys.stderr, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
        logging.getLogger().setLevel(logging.DEBUG if args.vv else logging.INFO)


def _checked_arguments(args: argparse.Namespace) -> dict | None:
    """Refuse wrong arguments before the benchmark is spawned; the ``storage_options`` they give.

    Raises:
        UsageError: an argument out of range, a dataset that is not there, a loader with a read method other than
            python, or a field regex that matches nothing.
        MissingDependencyError: the framework of ``--read-method tf`` or ``--loader`` is not installed.
    """
    if args.workers_count < 1:
        raise _cli.UsageError(f'--workers-count must be at least 1, got {args.workers_count}')
    if args.warmup_cycles < 0 or args.measure_cycles < 1:
        raise _cli.UsageError(f'--warmup-cycles must be >= 0 and --measure-cycles >= 1, got '
                              f'{args.warmup_cycles} and {args.measure_cycles}')
    storage_options = _cli.parse_storage_options(args.storage_options)
    _cli.existing_directory(args.dataset_path, 'dataset', storage_options)
    if args.loader != Loader.NONE.value and args.read_method != ReadMethod.PYTHON.value:
        raise _cli.UsageError(f'--loader {args.loader} cannot be combined with --read-method {args.read_method}')
    if args.loader_batch_size < 1:
        raise _cli.UsageError(f'--loader-batch-size must be at least 1, got {args.loader_batch_size}')
    if args.read_method == ReadMethod.TF.value:
        _require('tensorflow', '--read-method tf')
    if args.loader != Loader.NONE.value:
        _require('torch', f'--loader {args.loader}')
    if args.field_regex:
        try:  # in this process, before spawning the benchmark: a regex that matches nothing is a usage error
            _matching_fields(args.dataset_path, args.field_regex, args.batch, {'storage_options': storage_options})
        except (ValueError, re.error) as err:
            raise _cli.UsageError(str(err)) from err
    return storage_options


def _measure(args: argparse.Namespace, storage_options: dict | None) -> ThroughputReport:
    """The benchmark the arguments describe, run in a child process."""
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    return measure_throughput(
        args.dataset_path, args.field_regex, warmup_cycles_count=args.warmup_cycles,
        measure_cycles_count=args.measure_cycles, pool_type=WorkerPoolType(args.pool_type),
        loaders_count=args.workers_count, profile_threads=args.profile_threads,
        read_method=ReadMethod(args.read_method), shuffling_queue_size=args.shuffling_queue_size,
        batch=args.batch, loader=Loader(args.loader),
        loader_batch_size=args.loader_batch_size, time_stages=args.v or args.vv or args.json,
        on_progress=show_progress if progress else None,
        reader_extra_args={'storage_options': storage_options} if storage_options else None)


def _print_report(report: ThroughputReport, args: argparse.Namespace) -> None:
    """The JSON line (``--json``), or the stage breakdown (when timed) and the result line."""
    if args.json:
        print(result_as_json(report, args))
        return
    if report.stages is not None:
        print(report.stages.format())
    print(format_result(report.result))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``petastorm-throughput.py``."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    _configure_logging(args)

    def work() -> None:
        _print_report(_measure(args, _checked_arguments(args)), args)

    _cli.run(PROG, work)


if __name__ == '__main__':
    main()
