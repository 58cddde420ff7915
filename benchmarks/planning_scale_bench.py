"""Planning a store of 1,000,000 row groups (100,000 files of 10): seconds and memory, without any storage.

The store is synthesized in memory: a plain store whose listing names 100,000 files and whose saved plan (see
``petastorm.store.saved_plan``) gives 10 row groups of 100 rows each, so what is measured is planning itself: the
plan's bytes encoded and adopted (what a job's ranks and a plan file exchange), the row groups listed as pieces,
selected, and laid out for one shard of 64 (``shard_mode`` by row groups and by rows), with the first epoch's
order drawn and shard 0's scheduled items in it. Each step is timed, then run again under ``tracemalloc`` for its
peak Python allocation; the process's resident size is printed at the end, then the whole of one reader's
planning in each mode (the synthesized listing left out): its seconds, what it holds and its peak allocation.

Usage:
    python benchmarks/planning_scale_bench.py [--files 100000] [--row-groups 10] [--shards 64]
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import pyarrow.fs as pafs

from petastorm.plan import ShardSpec, make_layout, select_row_groups
from petastorm.plan.layout import Stage
from petastorm.store.plain import PlainStore
from petastorm.store.saved_plan import adopt_plan, encode_plan
from petastorm.unischema import Unischema


def _store(files: int, row_groups: int) -> PlainStore:
    paths = tuple(f'/bucket/store/part-{index:06d}.parquet' for index in range(files))
    store = PlainStore(pafs.LocalFileSystem(), 's3://bucket/store', '/bucket/store', paths,
                       file_sizes=dict.fromkeys(paths, 1 << 20),
                       file_mtimes={path: 1_700_000_000 * 10**9 + index for index, path in enumerate(paths)})
    store.reads.row_counts = {path: [100] * row_groups for path in paths}
    return store


def _measure(name: str, step):
    """Run ``step`` twice: timed, then under ``tracemalloc`` (which slows it) for its peak allocation."""
    started = time.perf_counter()
    step()
    seconds = time.perf_counter() - started
    tracemalloc.start()
    result = step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f'| {name} | {seconds:.2f} | {peak / 2**20:.0f} |', flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--files', type=int, default=100_000)
    parser.add_argument('--row-groups', type=int, default=10)
    parser.add_argument('--shards', type=int, default=64)
    args = parser.parse_args()
    print(f'### Planning {args.files:,} files of {args.row_groups} row groups, shard 0 of {args.shards}\n')
    print('| step | seconds | peak MB allocated |')
    print('|---|---:|---:|')
    store = _measure('synthesize the listing', lambda: _store(args.files, args.row_groups))
    data = _measure('encode the plan (Arrow IPC)', lambda: encode_plan(store))
    fresh = _store(args.files, args.row_groups)
    _measure('adopt the plan', lambda: adopt_plan(fresh, data))
    pieces = _measure('list the row groups (pieces)', fresh.row_groups)
    selected = _measure('select', lambda: select_row_groups(pieces, Unischema('S', [])))
    for mode in ('row_groups', 'rows'):
        layout = _measure(f'lay out shard 0 ({mode})', lambda mode=mode: make_layout(
            pieces, selected, ShardSpec(0, args.shards, mode), seed=1, shuffle_row_groups=True, shuffle_rows=False,
            drop_partitions=1))
        _measure(f'order of epoch 0 ({mode})', lambda layout=layout: layout.ordered(0))
        _measure(f"shard 0's items of epoch 0 ({mode})", lambda layout=layout: layout.units(Stage(0)))
    print(f'\nplan bytes: {len(data) / 2**20:.1f} MB; row groups: {len(pieces):,}; resident size at the end: '
          f'{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB')
    for mode in ('row_groups', 'rows'):
        _whole_plan(data, args, mode)


def _whole_plan(data: bytes, args: argparse.Namespace, mode: str) -> None:
    """Every step of one reader's planning from the plan's bytes to its shard's items of the first epoch, timed,
    then under ``tracemalloc``: what the reader holds at the end and the peak on the way (the steps above each
    count only what they allocate)."""
    def plan(fresh: PlainStore) -> tuple:
        started = time.perf_counter()
        adopt_plan(fresh, data)
        pieces = fresh.row_groups()
        layout = make_layout(pieces, select_row_groups(pieces, Unischema('S', [])),
                             ShardSpec(0, args.shards, mode), seed=1, shuffle_row_groups=True, shuffle_rows=False,
                             drop_partitions=1)
        held = (fresh, pieces, layout, layout.units(Stage(0)))  # units() draws the order of the epoch
        return held, time.perf_counter() - started

    _, seconds = plan(_store(args.files, args.row_groups))
    fresh = _store(args.files, args.row_groups)
    tracemalloc.start()
    held, _ = plan(fresh)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del held
    print(f'whole plan ({mode}): {seconds:.2f} s; held at the end {current / 2**20:.0f} MB, peak '
          f'{peak / 2**20:.0f} MB allocated')


if __name__ == '__main__':
    main()
