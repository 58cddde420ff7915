"""Spark converter cost next to its limits, measured in one run on the same DataFrames.

For each repeat a new 10-column scalar DataFrame (id bigint, 4 float, 3 double, 2 int; a different plan each time,
so nothing is reused) is built in Spark local[2], then:
  convert     make_spark_converter(df) wall time, next to the limit: the same DataFrame written by Spark alone
              (df.write.parquet with the same row-group size and codec), run back to back in alternating order.
  reuse       make_spark_converter(df) again: the same plan is found in the session's cache.
  epoch       rows/s of make_torch_dataloader(batch_size=1024, num_epochs=1) (the default loader; two epochs per
              converter), next to the limit: a raw pyarrow scan of the converter's files -> 1024-row slices ->
              torch.as_tensor.
The last column repeats what the original Petastorm 0.13.1 measured on a 2-core machine of this kind (its default
loader is the row-by-row DataLoader), for orientation only: compare ratios measured in one run.

With --sessions, the same DataFrames are converted through a classic session and through a Spark Connect session
(``SparkSession.builder.remote('local[2]')``: a local Connect server), each in a process of its own, one after the
other in the same run:
  convert      make_spark_converter(df) wall time;
  first batch  from entering make_torch_dataloader(batch_size=1024) to holding its first batch.

Usage: python benchmarks/converter_bench.py [--quick] [--rows N] [--repeats R] [--sessions]
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

from torch_bench import _raw_torch_pass

ORIGINAL = {
    'make_spark_converter (s)': '3.3',
    'make_torch_dataloader bs1024 epoch rows/s': '160,000',
}


def _spark(kind='classic'):
    """A local[2] session: classic, or a Spark Connect client of a local Connect server started for it."""
    from pyspark.sql import SparkSession

    os.environ.setdefault('PYSPARK_PYTHON', sys.executable)
    builder = SparkSession.builder.remote('local[2]') if kind == 'connect' else SparkSession.builder.master('local[2]')
    spark = (builder.appName('petastorm-converter-bench')
             .config('spark.driver.memory', '2g').config('spark.ui.enabled', 'false')
             .config('spark.ui.showConsoleProgress', 'false').config('spark.sql.shuffle.partitions', '4')
             .getOrCreate())
    if kind == 'classic':
        spark.sparkContext.setLogLevel('ERROR')
    return spark


def _dataframe(spark, rows, variant):
    """id + 4 float + 3 double + 2 int columns, computed in the JVM; ``variant`` makes the plan distinct."""
    from pyspark.sql import functions as F

    columns = [F.col('id')]
    columns += [F.rand(seed=variant * 100 + k).cast('float').alias(f'f32_{k}') for k in range(4)]
    columns += [F.randn(seed=variant * 100 + 10 + k).alias(f'f64_{k}') for k in range(3)]
    columns += [(F.rand(seed=variant * 100 + 20 + k) * 1e6).cast('int').alias(f'i32_{k}') for k in range(2)]
    return spark.range(0, rows, 1, 4).select(*columns)


def _spark_write(df, url):
    from petastorm.spark.dataframe_prep import DEFAULT_ROW_GROUP_SIZE_BYTES

    start = time.perf_counter()
    (df.write.option('compression', 'uncompressed').option('parquet.block.size', DEFAULT_ROW_GROUP_SIZE_BYTES)
     .parquet(url))
    return time.perf_counter() - start


def _epoch(converter, batch_size):
    start = time.perf_counter()
    rows = 0
    with converter.make_torch_dataloader(batch_size=batch_size, num_epochs=1) as loader:
        for batch in loader:
            rows += len(batch['id'])
    return rows, time.perf_counter() - start


def run(rows, repeats, batch_size, work_dir):
    import petastorm.pytorch  # noqa: F401 - imported here so that the first epoch does not pay for torch's import
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark = _spark()
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f'file://{work_dir}/cache')
    _spark_write(_dataframe(spark, 1000, 0), f'file://{work_dir}/warm-up')  # JVM warm-up, not timed
    measured = {'convert': [], 'write': [], 'reuse': [], 'epoch': [], 'raw': []}
    for repeat in range(1, repeats + 1):
        df = _dataframe(spark, rows, repeat)
        write_url = f'file://{work_dir}/plain-{repeat}'
        if repeat % 2:  # alternate the order so that neither side always runs on a warmer JVM
            measured['write'].append(_spark_write(df, write_url))
        start = time.perf_counter()
        converter = make_spark_converter(df)
        measured['convert'].append(time.perf_counter() - start)
        if not repeat % 2:
            measured['write'].append(_spark_write(df, write_url))
        start = time.perf_counter()
        again = make_spark_converter(df)
        measured['reuse'].append(time.perf_counter() - start)
        if again.cache_dir_url != converter.cache_dir_url or len(converter) != rows:
            raise RuntimeError(f'the second conversion wrote {again} instead of reusing {converter}')
        for _ in range(2):
            count, seconds = _epoch(converter, batch_size)
            if count != rows:
                raise RuntimeError(f'an epoch gave {count} rows instead of {rows}')
            measured['epoch'].append(count / seconds)
        start = time.perf_counter()
        count = _raw_torch_pass(converter.cache_dir_url[len('file://'):], batch_size)
        measured['raw'].append(count / (time.perf_counter() - start))
        converter.delete()
        shutil.rmtree(write_url[len('file://'):])
    spark.stop()
    return {name: statistics.median(values) for name, values in measured.items()}


def _first_batch_seconds(converter, batch_size):
    start = time.perf_counter()
    with converter.make_torch_dataloader(batch_size=batch_size, num_epochs=1) as loader:
        next(iter(loader))
        return time.perf_counter() - start


def run_session(kind, rows, repeats, batch_size, work_dir):
    """Medians of convert and first-batch seconds through one kind of session (run in a process of its own)."""
    import petastorm.pytorch  # noqa: F401 - so that the first batch does not pay for torch's import
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark = _spark(kind)
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f'file://{work_dir}/cache-{kind}')
    make_spark_converter(_dataframe(spark, 1000, 0)).delete()  # warm-up, not timed
    measured = {'convert': [], 'first_batch': []}
    for repeat in range(1, repeats + 1):
        df = _dataframe(spark, rows, repeat)
        start = time.perf_counter()
        converter = make_spark_converter(df)
        measured['convert'].append(time.perf_counter() - start)
        if len(converter) != rows:
            raise RuntimeError(f'{kind}: the converter holds {len(converter)} rows instead of {rows}')
        measured['first_batch'].append(_first_batch_seconds(converter, batch_size))
        converter.delete()
    spark.stop()
    return {name: statistics.median(values) for name, values in measured.items()}


def run_sessions(rows, repeats, batch_size, work_dir):
    """Classic, then Connect, each in a fresh process (one process cannot hold both kinds of local session)."""
    results = {}
    for kind in ('classic', 'connect'):
        command = [sys.executable, __file__, '--session-kind', kind, '--rows', str(rows), '--repeats', str(repeats),
                   '--batch-size', str(batch_size), '--work-dir', work_dir]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f'the {kind} session run failed:\n{done.stderr[-3000:]}')
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def sessions_table(results, rows, batch_size):
    classic, connect = results['classic'], results['connect']
    return '\n'.join([
        '| case | classic | Spark Connect | Connect / classic |', '|---|---:|---:|---:|',
        f"| make_spark_converter (s), {rows:,} rows x 10 columns | {classic['convert']:.2f} | "
        f"{connect['convert']:.2f} | {connect['convert'] / classic['convert']:.2f} |",
        f"| make_torch_dataloader bs{batch_size}: first batch (s) | {classic['first_batch']:.3f} | "
        f"{connect['first_batch']:.3f} | {connect['first_batch'] / classic['first_batch']:.2f} |"])


def table(result, rows, batch_size):
    lines = ['| case | ours | limit | ours / limit | original 0.13.1, 1M rows |', '|---|---:|---:|---:|---:|',
             f"| make_spark_converter (s), {rows:,} rows x 10 columns | {result['convert']:.2f} | "
             f"{result['write']:.2f} (Spark write alone) | {result['convert'] / result['write']:.2f} | "
             f"{ORIGINAL['make_spark_converter (s)']} |",
             f"| make_spark_converter again, same plan (s) | {result['reuse']:.3f} | | | |",
             f"| make_torch_dataloader bs{batch_size} epoch rows/s | {result['epoch']:,.0f} | {result['raw']:,.0f} "
             f"(pyarrow -> torch loop) | {result['epoch'] / result['raw']:.2f} | "
             f"{ORIGINAL['make_torch_dataloader bs1024 epoch rows/s']} |"]
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rows', type=int, default=1_000_000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--batch-size', type=int, default=1024)
    parser.add_argument('--quick', action='store_true', help='100,000 rows, one repeat')
    parser.add_argument('--sessions', action='store_true',
                        help='compare a classic session with a Spark Connect session instead')
    parser.add_argument('--session-kind', choices=('classic', 'connect'), help=argparse.SUPPRESS)
    parser.add_argument('--work-dir', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows, repeats = (100_000, 1) if args.quick else (args.rows, args.repeats)
    if args.session_kind:  # one side of --sessions, in its own process: print the medians as JSON
        print(json.dumps(run_session(args.session_kind, rows, repeats, args.batch_size, args.work_dir)))
        return
    work_dir = tempfile.mkdtemp(prefix='converter-bench-')
    try:
        if args.sessions:
            print(sessions_table(run_sessions(rows, repeats, args.batch_size, work_dir), rows, args.batch_size))
            return
        result = run(rows, repeats, args.batch_size, work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(table(result, rows, args.batch_size))


if __name__ == '__main__':
    main()
