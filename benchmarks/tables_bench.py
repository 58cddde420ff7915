"""Reading Delta and Iceberg tables, side by side in one run on the same data (medians of rounds).

Tables:
  scalar   5M rows (``--quick``: 500k) of an int64 id, four float32 and an int32 label, in 8 files of 4 row groups,
           as a Delta table (written by deltalake) and as an Iceberg table (pyiceberg, SQL catalog on SQLite).
  image    a Petastorm table of 64x64x3 PNG images and labels (2,000 rows; ``--quick``: 500), written as a Delta
           table by ``write_dataset(table_format='delta')``.
Ways to read a whole epoch, each as numpy columns (images decoded):
  table        ``make_batch_reader(table URL)`` (``make_reader`` for images): the log read, planned and applied
  plain        the same reader on the same Parquet files as plain Parquet (a list of file URLs): no log
  deltalake    ``DeltaTable(...).to_pyarrow_dataset().to_batches()`` with each column converted to numpy
  ray          ``ray.data.read_delta`` / ``read_iceberg`` ``.iter_batches(batch_format='numpy')`` (Ray on 2 CPUs)
  pyiceberg    ``table.scan().to_arrow_batch_reader()`` with each column converted to numpy
Printed per table: epoch seconds (median), rows/s, time to the first batch, and the log's cost: the extra seconds
of setting up a table reader over a plain one, as a share of the table's epoch.

Usage: python benchmarks/tables_bench.py [--quick] [--rounds 3] [--no-ray] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

ImageSchema = Unischema('ImageTable', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('label', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('image', np.uint8, (64, 64, 3), CompressedImageCodec('png'), False),
])
FILES = 8
GROUPS_PER_FILE = 4


def scalar_table(start: int, stop: int) -> pa.Table:
    rng = np.random.default_rng(start)
    n = stop - start
    columns = {'id': np.arange(start, stop, dtype=np.int64), 'label': (np.arange(n) % 10).astype(np.int32)}
    for k in range(4):
        columns[f'x{k}'] = rng.random(n, dtype=np.float32)
    return pa.table(columns)


def write_scalar_tables(root: str, rows: int) -> tuple[str, str]:
    """The Delta table and the Iceberg catalog database of the scalar table, written when missing."""
    import deltalake
    from pyiceberg.catalog.sql import SqlCatalog

    delta = os.path.join(root, 'scalar-delta')
    per_file = rows // FILES
    if not os.path.exists(delta):
        writer = deltalake.WriterProperties(max_row_group_size=per_file // GROUPS_PER_FILE)
        for k in range(FILES):
            deltalake.write_deltalake(delta, scalar_table(k * per_file, (k + 1) * per_file), mode='append',
                                      writer_properties=writer)
    catalog_db = os.path.join(root, 'iceberg.db')
    if not os.path.exists(catalog_db):
        catalog = SqlCatalog('bench', uri=f'sqlite:///{catalog_db}', warehouse=f'file://{root}/iceberg')
        catalog.create_namespace('bench')
        table = catalog.create_table('bench.scalar', schema=scalar_table(0, 1).schema, properties={
            'write.parquet.row-group-limit': str(per_file // GROUPS_PER_FILE)})
        for k in range(FILES):
            table.append(scalar_table(k * per_file, (k + 1) * per_file))
    return delta, catalog_db


def iceberg_catalog(root: str, catalog_db: str):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog('bench', uri=f'sqlite:///{catalog_db}', warehouse=f'file://{root}/iceberg')


def write_image_table(root: str, rows: int) -> str:
    path = os.path.join(root, 'image-delta')
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        base = rng.integers(0, 255, size=(64, 64, 3), dtype=np.uint8)
        write_dataset(f'file://{path}', ImageSchema, ({'id': i, 'label': i % 10, 'image': np.roll(base, i, axis=0)}
                                                     for i in range(rows)),
                      table_format='delta', row_group_size_mb=1, file_size_mb=8, progress=False)
    return path


def _numpy_rows(batches) -> int:
    rows = 0
    for batch in batches:
        columns = [column.to_numpy(zero_copy_only=False) for column in batch.columns]
        rows += len(columns[0])
    return rows


def reader_epoch(source, rows_reader: bool = False, **kwargs) -> tuple[float, float, float, int]:
    """(setup seconds, time to first batch, epoch seconds, rows) of one epoch of our reader."""
    start = time.perf_counter()
    factory = make_reader if rows_reader else make_batch_reader
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        reader = factory(source, workers_count=2, **kwargs)
    setup = time.perf_counter() - start
    rows = 0
    first = None
    with reader:
        if rows_reader:
            from petastorm.pytorch import DataLoader

            for batch in DataLoader(reader, batch_size=64):
                if first is None:
                    first = time.perf_counter() - start
                rows += len(batch['id'])
        else:
            for batch in reader:
                if first is None:
                    first = time.perf_counter() - start
                rows += len(batch.id)
    return setup, first or 0.0, time.perf_counter() - start, rows


def timed(fn) -> tuple[float, float, int]:
    """(time to first batch, epoch seconds, rows) of ``fn``, which yields batches with a row count."""
    start = time.perf_counter()
    first = None
    rows = 0
    for count in fn():
        if first is None:
            first = time.perf_counter() - start
        rows += count
    return first or 0.0, time.perf_counter() - start, rows


def deltalake_scan(path: str):
    import deltalake

    for batch in deltalake.DeltaTable(path).to_pyarrow_dataset().to_batches():
        yield _numpy_rows([batch])


def pyiceberg_scan(table):
    for batch in table.scan().to_arrow_batch_reader():
        yield _numpy_rows([batch])


def ray_scan(dataset):
    for batch in dataset.iter_batches(batch_format='numpy', batch_size=None):
        yield len(next(iter(batch.values())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--no-ray', action='store_true', help='skip the Ray Data readers')
    parser.add_argument('--data-root', default=None)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    suffix = '-quick' if args.quick else ''
    root = args.data_root or os.path.join(tempfile.gettempdir(), f'petastorm-tables-bench{suffix}')
    os.makedirs(root, exist_ok=True)
    rows = 500_000 if args.quick else 5_000_000
    delta, catalog_db = write_scalar_tables(root, rows)
    images = write_image_table(root, 500 if args.quick else 2000)
    iceberg = iceberg_catalog(root, catalog_db).load_table('bench.scalar')
    delta_files = ['file://' + p for p in sorted(glob.glob(os.path.join(delta, '*.parquet')))]
    iceberg_files = [task.file.file_path for task in iceberg.scan().plan_files()]
    image_files = ['file://' + p for p in sorted(glob.glob(os.path.join(images, '*.parquet')))]

    ray = None
    if not args.no_ray:
        import ray as ray_module

        ray = ray_module
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _node_ip_address='127.0.0.1')
        ray.data.DataContext.get_current().enable_progress_bars = False

    ways: dict[str, dict[str, object]] = {
        'scalar Delta': {
            'table': lambda: reader_epoch(f'file://{delta}'),
            'plain': lambda: reader_epoch(delta_files),
            'deltalake': lambda: timed(lambda: deltalake_scan(delta)),
        },
        'scalar Iceberg': {
            'table': lambda: reader_epoch(iceberg),
            'plain': lambda: reader_epoch(iceberg_files),
            'pyiceberg': lambda: timed(lambda: pyiceberg_scan(iceberg)),
        },
        'image Delta': {
            'table': lambda: reader_epoch(f'file://{images}', rows_reader=True),
            'plain': lambda: reader_epoch(image_files, rows_reader=True),
        },
    }
    if ray is not None:
        ways['scalar Delta']['ray'] = lambda: timed(lambda: ray_scan(ray.data.read_delta(delta)))
        ways['scalar Iceberg']['ray'] = lambda: timed(lambda: ray_scan(ray.data.read_iceberg(
            table_identifier='bench.scalar', catalog_kwargs={'name': 'bench', 'type': 'sql',
                                                             'uri': f'sqlite:///{catalog_db}',
                                                             'warehouse': f'file://{root}/iceberg'})))
    results: dict[tuple[str, str], list[tuple]] = {}
    for _ in range(args.rounds + 1):  # the first round warms the page cache and lazy imports: not counted
        for table_name, readers in ways.items():
            for way, run in readers.items():
                results.setdefault((table_name, way), []).append(run())
    if ray is not None:
        ray.shutdown()
    print(f'{args.rounds} rounds, medians; 2 reader workers; {rows} scalar rows, {len(image_files)} image files')
    print(f"{'table':<16}{'reader':<11}{'epoch s':>9}{'rows/s':>12}{'first batch s':>15}{'vs table':>10}"
          f"{'log cost':>10}")
    for table_name, readers in ways.items():
        table_runs = results[(table_name, 'table')][1:]
        table_epoch = statistics.median(r[2] for r in table_runs)
        for way in readers:
            runs = results[(table_name, way)][1:]
            if way in ('table', 'plain'):
                epoch, first, count = (statistics.median(r[2] for r in runs), statistics.median(r[1] for r in runs),
                                       runs[0][3])
            else:
                epoch, first, count = (statistics.median(r[1] for r in runs), statistics.median(r[0] for r in runs),
                                       runs[0][2])
            cost = ''
            if way == 'table':
                plain_runs = results[(table_name, 'plain')][1:]
                extra = statistics.median(r[0] for r in table_runs) - statistics.median(r[0] for r in plain_runs)
                cost = f'{100 * extra / table_epoch:.1f}%'
            print(f'{table_name:<16}{way:<11}{epoch:>9.2f}{count / epoch:>12,.0f}{first:>15.3f}'
                  f'{epoch / table_epoch:>9.2f}x{cost:>10}')


if __name__ == '__main__':
    main()
