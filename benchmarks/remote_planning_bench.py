"""Time to the first batch from stores of many small files on S3 (or GCS, Azure) behind latency: does planning grow
with the files?

Stores of 1,000 and 10,000 (or 100,000) Parquet files (100 rows of two columns each), plain or with a ``_metadata``
summary (pyarrow's ``write_metadata``; ``--summary no`` for the plain ones only), written once into ``--data-root``
when given (100,000 files in about a minute) and reused by later runs, served by ``petastorm.test_util.s3_server``
behind a ``petastorm.test_util.delay_proxy`` (10 ms one way by default), as in ``remote_bench.py``. For each store,
in a fresh process: ``make_batch_reader`` (ours, thread pool; ``ours-in-order`` with ``shuffle_row_groups=False``,
which reads as ``pyarrow.dataset`` does and does not wait for every footer; ``ours-fsspec`` through the cloud's
fsspec client, s3fs, gcsfs or adlfs, as options only it takes choose it), ``pyarrow.dataset`` scanning the
files (its own lazy planning: it reads a footer only when it reaches the file), Hugging Face ``datasets``
streaming (``hf``: ``load_dataset('parquet', data_files='<store>/*.parquet', streaming=True)`` through s3fs, its
first ``iter(batch_size=256)`` batch), and the raw limit that plans as we do (every footer first, 4 threads). The
table gives the median seconds to the first batch over the rounds and the requests the server answered until then
(with ``--epoch``, each case reads its whole epoch: the table gives its seconds too, and the requests of it).

With ``--ranks 8`` (or 64) it also runs jobs on the stores without a summary: one reader alone (an epoch), then 8
rank processes joined by ``torch.distributed`` (gloo, ``cur_shard='auto'``, ``shard_mode='rows'``, every row
once) reading one epoch between them. The ranks plan once (each reads the footers of the files it will read, rank
0 plans from all of them and broadcasts the plan; rank 0 lists the store for the job): the job's requests are about
those of the one reader, plus the files two shares meet in. The table gives the job's requests against the one
reader's, the slowest rank's first batch, and whether the ranks read every row once (their ids, compared); the
job's line above it gives its requests by kind and the ranks' memory (Linux): the peak of their summed PSS and the
largest rank's private USS. A rank costs about 200 MB of its own, most of it ``import torch`` (its Python modules
and operator registry; the libraries' pages are shared) and pandas, so 64 ranks need about 13 GB: check ``free -g``
first.

With ``--cloud gcs`` or ``--cloud azure`` the stores are loaded into fake-gcs-server or uploaded to Azurite (see
``remote_services.py``), whose proxy counts connections, not requests; jobs of ranks run on S3 only.

Usage:
    python benchmarks/remote_planning_bench.py [--files 1000,10000] [--delay-ms 10] [--rounds 2] [--ranks 8|64]
        [--cloud s3|gcs|azure] [--summary both|no|yes] [--epoch] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import ExitStack

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remote_bench import run_case  # noqa: E402
from remote_services import BUCKET, exit_on_terminate, server_stats, serving  # noqa: E402

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'planning_job_rank.py')

SYSTEMS = ('ours', 'ours-in-order', 'ours-fsspec', 'arrow-dataset', 'hf', 'raw-bytes')
NAMES = {'ours': 'ours', 'ours-in-order': 'ours, shuffle_row_groups=False',
         'ours-fsspec': 'ours through s3fs, gcsfs or adlfs', 'arrow-dataset': 'pyarrow.dataset',
         'hf': 'HF datasets streaming',
         'raw-bytes': 'raw pyarrow, every footer first'}
#: the case of ``remote_cases.py`` that runs a system, where it is not the system's name.
CASES = {'hf': 'hf-plain'}


def write_many(directory: str, files: int, summary: bool) -> None:
    """``files`` files of 100 rows; with ``summary``, a ``_metadata`` of all their row groups and a
    ``_common_metadata``. Written beside ``directory`` and moved there once complete (100,000 files take about a
    minute), so that a store found under ``--data-root`` is a whole one."""
    partial = os.path.join(os.path.dirname(os.path.dirname(directory)), f'.partial-{os.path.basename(directory)}')
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    rng = np.random.default_rng(0)
    collected: list = []
    for index in range(files):
        table = pa.table({'id': np.arange(index * 100, (index + 1) * 100, dtype=np.int64), 'x': rng.random(100)})
        name = f'part-{index:05d}.parquet'
        pq.write_table(table, os.path.join(partial, name), metadata_collector=collected if summary else None)
        if summary:
            collected[-1].set_file_path(name)
    if summary:
        pq.write_metadata(table.schema, os.path.join(partial, '_common_metadata'))
        pq.write_metadata(table.schema, os.path.join(partial, '_metadata'), metadata_collector=collected)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    os.rename(partial, directory)


def prepare_stores(root: str, stores: list[tuple[int, bool]]) -> None:
    """The stores under ``root/bench``: those already there (from an earlier run with this ``--data-root``) are
    kept, the others written."""
    for files, summary in stores:
        directory = os.path.join(root, BUCKET, _name(files, summary))
        if not os.path.isdir(directory):
            started = time.perf_counter()
            write_many(directory, files, summary)
            print(f'  wrote {directory} in {time.perf_counter() - started:.0f} s', flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--files', default='1000,10000')
    parser.add_argument('--cloud', default='s3', help='s3, gcs (fake-gcs-server) or azure (Azurite)')
    parser.add_argument('--delay-ms', type=int, default=10)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--systems', default=','.join(SYSTEMS))
    parser.add_argument('--timeout', type=float, default=600)
    parser.add_argument('--ranks', type=int, default=0, help='also run jobs of this many ranks (0: none)')
    parser.add_argument('--epoch', action='store_true',
                        help="read each case's whole epoch, not only its first batch, and give its seconds too")
    parser.add_argument('--summary', default='both', choices=('both', 'no', 'yes'),
                        help='the stores without a _metadata summary, with one, or both')
    parser.add_argument('--data-root', help='keep the stores in this directory and reuse those already there '
                                            '(default: a temporary directory, removed at the end)')
    args = parser.parse_args()
    exit_on_terminate()
    counts = [int(n) for n in args.files.split(',')]
    systems = args.systems.split(',')
    summaries = {'both': (False, True), 'no': (False,), 'yes': (True,)}[args.summary]
    stores = [(files, summary) for files in counts for summary in summaries]
    results: dict = defaultdict(list)
    with ExitStack() as stack:
        root = args.data_root or stack.enter_context(tempfile.TemporaryDirectory(prefix='planning-bench-'))
        prepare_stores(root, stores)
        with serving(root, [args.delay_ms], args.cloud) as service:
            endpoint, counter = service.proxies[args.delay_ms], service.counters[args.delay_ms]
            cases = [(store, system) for store in stores for system in systems]
            for round_index in range(args.rounds):
                shift = round_index * len(cases) // max(1, args.rounds)
                for (files, summary), system in cases[shift:] + cases[:shift]:
                    result = run_case(sys.executable, CASES.get(system, system), service.url(_name(files, summary)),
                                      endpoint, counter, 4, args.timeout, first_only=not args.epoch)
                    results[files, summary, system].append(result)
                    shown = result.get('error') or f'{result["first_batch"]:.3f} s, {_counted(result)}'
                    if args.epoch and 'error' not in result:
                        shown += f', epoch {result["seconds"]:.3f} s'
                    print(f'  round {round_index + 1}: {files} files, summary {summary}, {system}: {shown}',
                          flush=True)
            jobs = {files: _job_case(service.url(_name(files, False)), endpoint, service.server, args.ranks,
                                     files * 100, args.timeout)
                    for files in counts} if args.ranks > 1 and args.cloud == 's3' and False in summaries else {}
    epoch_head, epoch_rule = (' epoch s |', '---:|') if args.epoch else ('', '')
    print(f'\n### Time to the first batch, {args.cloud} at {args.delay_ms} ms one way\n')
    print(f'| files | _metadata | system | first batch s |{epoch_head} '
          f'{"requests" if args.cloud == "s3" else "connections"} |')
    print(f'|---:|---|---|---:|{epoch_rule}---:|')
    for files, summary in stores:
        for system in systems:
            runs = [r for r in results[files, summary, system] if 'error' not in r]
            if not runs:
                error = results[files, summary, system][0]['error']
                print(f'| {files:,} | {"yes" if summary else "no"} | {NAMES[system]} | failed: {error} | |')
                continue
            epoch = f' {statistics.median(r["seconds"] for r in runs):.3f} |' if args.epoch else ''
            print(f'| {files:,} | {"yes" if summary else "no"} | {NAMES[system]} | '
                  f'{statistics.median(r["first_batch"] for r in runs):.3f} |{epoch} '
                  f'{statistics.median(r["requests"] or r["connections"] for r in runs):,.0f} |')
    if jobs:
        print(f'\n### A job of {args.ranks} ranks against one reader, one epoch, no _metadata, {args.delay_ms} ms\n')
        print('| files | one reader: requests | job: requests | job / reader | slowest first batch s | '
              'every row once |')
        print('|---:|---:|---:|---:|---:|---|')
        for files, job in jobs.items():
            print(f'| {files:,} | {job["single"]:,} | {job["job"]:,} | {job["job"] / job["single"]:.2f} | '
                  f'{job["first_batch"]:.2f} | {job["rows_once"]} |')


def _job_case(url: str, endpoint: str, server: str, ranks: int, rows: int, timeout: float) -> dict:
    """One reader's requests for an epoch, then a job's of ``ranks`` processes (see the module docstring)."""
    server_stats(server, reset=True)
    single, _ = _run_ranks(url, endpoint, 1, timeout)
    single_requests = server_stats(server, reset=True)['total_requests']
    results, memory = _run_ranks(url, endpoint, ranks, timeout)
    job_stats = server_stats(server, reset=True)
    job_requests = job_stats['total_requests']
    print(f'  job of {ranks} on {url}: {job_requests} requests ({job_stats["requests"]}), one reader '
          f'{single_requests}; {memory}', flush=True)
    return {'single': single_requests, 'job': job_requests,
            'first_batch': max(result['first_batch'] for result in results),
            'rows_once': _every_row_once([result['ids'] for result in results], rows)
            and _every_row_once([single[0]['ids']], rows)}


def _every_row_once(shares: list[list[int]], rows: int) -> bool:
    """Whether the ranks' ``id`` values together are each of the store's ``rows`` ids (0 to rows - 1) once."""
    read = np.concatenate([np.asarray(share, dtype=np.int64) for share in shares])
    return len(read) == rows and bool(np.array_equal(np.sort(read), np.arange(rows)))


def _run_ranks(url: str, endpoint: str, world: int, timeout: float) -> tuple[list[dict], RanksMemory]:
    """The rank script in ``world`` processes with torchrun's environment; each one's JSON line, and their memory.
    Their output goes to files, not pipes: a rank's line (its ids) outgrows a pipe's buffer, and a rank blocked
    writing it would hold the others at their last barrier."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    with ExitStack() as files:
        outputs = [tuple(files.enter_context(tempfile.TemporaryFile('w+')) for _ in range(2))
                   for _ in range(world)]
        processes = [subprocess.Popen(
            [sys.executable, RANK_SCRIPT, url, endpoint], stdout=out, stderr=err, text=True,
            env=dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                     MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), OMP_NUM_THREADS='1'))
            for rank, (out, err) in enumerate(outputs)]
        memory = RanksMemory([process.pid for process in processes])
        try:
            for process in processes:
                process.wait(timeout=timeout)
        finally:
            memory.stop()
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        texts = [(_read_back(out), _read_back(err)) for out, err in outputs]
    failed = [err for process, (_, err) in zip(processes, texts, strict=True) if process.returncode]
    if failed:
        raise RuntimeError(f'a rank failed: {failed[0][-2000:]}')
    return [json.loads([line for line in out.splitlines() if line.startswith('{')][-1]) for out, _ in texts], memory


def _read_back(file) -> str:
    file.seek(0)
    return file.read()


class RanksMemory:
    """The memory of a job's rank processes, sampled every second from ``/proc/<pid>/smaps_rollup`` (Linux) until
    :meth:`stop`: the peak of their summed PSS (each shared page split between the processes that map it, so the
    sum is what the job holds) and the largest USS (a rank's private pages: what one more rank costs). RSS counts
    the libraries' pages once per process, which many processes share."""

    def __init__(self, pids: list[int], interval: float = 1.0) -> None:
        self._pids, self._interval = pids, interval
        self.peak_pss_mb = self.peak_uss_mb = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name='ranks-memory', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def __str__(self) -> str:
        if not self.peak_pss_mb:
            return 'memory not sampled (no /proc/<pid>/smaps_rollup)'
        return (f'ranks\' memory at peak {self.peak_pss_mb / 1024:.2f} GB (summed PSS), '
                f'largest rank {self.peak_uss_mb:.0f} MB private (USS)')

    def _sample(self) -> None:
        while not self._stopped.wait(self._interval):
            rollups = [rollup for rollup in map(_smaps_rollup, self._pids) if rollup]
            self.peak_pss_mb = max(self.peak_pss_mb, sum(rollup['Pss'] for rollup in rollups) / 1024)
            self.peak_uss_mb = max([self.peak_uss_mb] + [
                (rollup['Private_Clean'] + rollup['Private_Dirty']) / 1024 for rollup in rollups])


def _smaps_rollup(pid: int) -> dict[str, int] | None:
    """``/proc/<pid>/smaps_rollup``'s sizes in kB, None once the process is gone (or off Linux)."""
    try:
        with open(f'/proc/{pid}/smaps_rollup') as rollup:
            lines = [line.split() for line in rollup]
    except OSError:
        return None
    return {fields[0].rstrip(':'): int(fields[1]) for fields in lines if len(fields) == 3 and fields[2] == 'kB'}


def _counted(result: dict) -> str:
    if result.get('requests') is not None:
        return f'{result["requests"]} requests'
    return f'{result["connections"]} connections'


def _name(files: int, summary: bool) -> str:
    return f'files{files}{"-summary" if summary else ""}'


if __name__ == '__main__':
    main()
