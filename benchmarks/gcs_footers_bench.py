"""Footers of many small files on GCS (fake-gcs-server behind the delay proxy), read by 64 threads in two ways.

* ``python``: ``GcsFileSystem.open_input_file`` and ``pyarrow.parquet.read_metadata`` on the ``NativeFile``, as
  the store layer reads a footer. pyarrow's ``GcsRandomAccessFile`` starts a download of the whole object the first
  time it is asked whether it is closed, and ``NativeFile.closed`` (which every ``NativeFile`` method asks first)
  does that holding the GIL: the threads take turns, one round trip each.
* ``fragment``: ``pyarrow.dataset``'s ``ParquetFileFormat.make_fragment`` with the size the listing gave, then
  ``ensure_complete_metadata``: C++ opens the file (no metadata request) and reads the footer without the GIL.

Usage:
    python benchmarks/gcs_footers_bench.py [--files 2000] [--delays 0,10] [--threads 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from remote_services import _proxies, exit_on_terminate  # noqa: E402

from support.cloud_emulators import FakeGcs  # noqa: E402

BUCKET = 'footers'


def write_files(root: str, files: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(root, BUCKET), exist_ok=True)
    for index in range(files):
        ids = np.arange(index * 100, (index + 1) * 100)
        pq.write_table(pa.table({'id': ids, 'x': ids * 0.5}), os.path.join(root, BUCKET, f'part-{index:05d}.parquet'))


def read_footers(endpoint: str, way: str, threads: int) -> tuple[int, float]:
    """(rows the footers count, seconds) for every footer of the bucket, read ``way``."""
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    filesystem = pafs.GcsFileSystem(anonymous=True, scheme='http', endpoint_override=endpoint, project_id='bench')
    infos = [info for info in filesystem.get_file_info(pafs.FileSelector(BUCKET)) if info.is_file]
    started = time.perf_counter()
    parquet = ds.ParquetFileFormat()

    def through_python(info) -> int:
        with filesystem.open_input_file(info.path) as handle:
            return pq.read_metadata(handle).num_rows

    def through_fragment(info) -> int:
        fragment = parquet.make_fragment(info.path, filesystem=filesystem, file_size=info.size)
        fragment.ensure_complete_metadata()
        return fragment.metadata.num_rows

    with ThreadPoolExecutor(threads) as pool:
        rows = sum(pool.map(through_python if way == 'python' else through_fragment, infos))
    return rows, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--files', type=int, default=2000)
    parser.add_argument('--delays', default='0,10', help='one-way delays in ms')
    parser.add_argument('--threads', type=int, default=64)
    args = parser.parse_args()
    exit_on_terminate()
    delays = [int(d) for d in args.delays.split(',')]
    with tempfile.TemporaryDirectory(prefix='gcs-footers-') as root, ExitStack() as stack:
        write_files(root, args.files)
        server = stack.enter_context(FakeGcs(data=root))
        proxies, _ = _proxies(f'127.0.0.1:{server.port}', delays, stack)
        print('| one-way delay | footers | from Python (NativeFile) s | pyarrow.dataset fragments s |')
        print('|---:|---:|---:|---:|')
        for delay in delays:
            endpoint = proxies[delay].split('://', 1)[1]
            (rows, python_s), (_, fragment_s) = (read_footers(endpoint, way, args.threads)
                                                 for way in ('python', 'fragment'))
            assert rows == args.files * 100, rows
            print(f'| {delay} ms | {args.files:,} | {python_s:.2f} | {fragment_s:.2f} |', flush=True)


if __name__ == '__main__':
    main()
