"""One plan for a job: the ranks of a job, the processes of a node and later runs share what planning read.

Planning a plain Parquet store without a ``_metadata`` summary reads every data file's footer. When each of N
ranks plans alone, a job sends N times the requests of one reader before its first step (12.8 million for 64
ranks over 100,000 files), and the object store throttles it. The plan is the same for every rank (sharding
happens after it), so it is made once and shared, as the bytes of :mod:`petastorm.store.saved_plan`:

* through ``torch.distributed``, when every rank of the job makes this reader: ``cur_shard='auto'`` found the
  rank there, or ``cur_shard``/``shard_count`` are the initialized group's rank and world size. Rank 0 plans
  (reading the footers, or taking the plan from the sources below) and broadcasts the bytes; the other ranks wait
  for them and read no footer. A rank that makes its reader late gets the same plan: the broadcast waits for it.
  If rank 0 fails to plan, every rank raises, naming rank 0's error.
* through the reader's local disk cache (``cache_type='local-disk'``): the processes of one node that share a
  cache directory plan once (the cache fills each key once, the others wait for it and read it).
* through a plan file (``plan_file=``): written by the first reader, read by later runs instead of every footer
  while the store's listing is the one the plan was made from; a store that changed is planned again and the file
  rewritten.

Each rank still lists the store (one request per thousand files); the listing tells whether a saved plan still
holds. The ranks of one job read the same files: a rank whose listing differs from rank 0's takes rank 0's.
What is not shared: ``filters`` are pruned with the footers' statistics, which each rank then reads itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from typing import Any

from petastorm.cache import CacheBase, NullCache
from petastorm.errors import PetastormError
from petastorm.metadata.schemas import stored_or_inferred_schema
from petastorm.reading.options import ReaderOptions
from petastorm.store.model import ParquetStore
from petastorm.store.plain import PlainStore
from petastorm.store.saved_plan import PlanMismatch, adopt_plan, encode_plan, listing_digest

__all__ = ['plans_alone', 'reads_the_footers', 'share_plan']


def share_plan(options: ReaderOptions, dataset: ParquetStore, cache: CacheBase) -> ParquetStore:
    """The store with its plan taken from the job, the node's cache or the plan file, when one of them has it.

    A store that is not plain Parquet (a table's log plans it) or has no files is returned as it is, and so is
    one that nothing shares (one reader, no cache, no plan file): it plans as it always did.
    """
    if not isinstance(dataset, PlainStore) or not dataset.files:
        return dataset
    if plans_alone(options, cache):
        return dataset
    distributed = _job_group(options)
    if distributed is None:
        return _planned_here(options, dataset, cache)[0]
    if distributed.get_rank() == 0:
        try:
            dataset, data = _planned_here(options, dataset, cache)
        except BaseException as err:
            _broadcast(distributed, f'{type(err).__name__}: {err}'.encode(), failed=True)
            raise
        _broadcast(distributed, data)
        return dataset
    return adopt_plan(dataset, _broadcast(distributed, None), take_listing=True)


def plans_alone(options: ReaderOptions, cache: CacheBase) -> bool:
    """Whether a reader of ``options`` plans alone: nothing shares a plan with it (no job, cache or plan file)."""
    return _job_group(options) is None and options.plan_file is None and isinstance(cache, NullCache)


def reads_the_footers(options: ReaderOptions, cache: CacheBase) -> bool:
    """Whether a reader of ``options`` reads the store's footers itself when it plans, no plan being handed to it.

    It plans alone, or it is rank 0 of a job and no cache or plan file is shared.
    """
    if options.plan_file is not None or not isinstance(cache, NullCache):
        return False
    distributed = _job_group(options)
    return distributed is None or distributed.get_rank() == 0


def _job_group(options: ReaderOptions) -> Any:
    """``torch.distributed`` when every rank of an initialized group of two or more makes this reader, else None."""
    distributed = sys.modules.get('torch.distributed')  # looked up, never imported: see plan.shard
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    world = distributed.get_world_size()
    if world < 2:
        return None
    every_rank = options.shard_source == 'torch.distributed' or (
        options.shard_count == world and options.cur_shard == distributed.get_rank())
    return distributed if every_rank else None


def _planned_here(options: ReaderOptions, dataset: ParquetStore, cache: CacheBase) -> tuple[ParquetStore, bytes]:
    """The store with its plan, and the plan's bytes: from the plan file, the cache, or the footers read now."""
    if options.plan_file is not None:
        saved = _read_plan_file(options.plan_file)
        if saved is not None:
            with contextlib.suppress(PlanMismatch):  # a stale plan: planned again below, and the file rewritten
                return adopt_plan(dataset, saved), saved
    if isinstance(cache, NullCache):
        data = _plan(dataset)
    else:
        key = json.dumps([str(dataset.url), listing_digest(dataset), 'plan'])
        data = cache.get(key, lambda: _plan(dataset))
        if dataset.reads.row_counts is None and dataset.reads.footers is None:
            dataset = adopt_plan(dataset, data)  # another process planned it
    if options.plan_file is not None:
        _write_plan_file(options.plan_file, data)
    return dataset, data


def _plan(dataset: ParquetStore) -> bytes:
    """Plan the store here: its schema (inferred from the footers when its metadata has none), its row groups."""
    stored_or_inferred_schema(dataset)
    return encode_plan(dataset)


def _read_plan_file(path: str) -> bytes | None:
    try:
        with open(path, 'rb') as file:
            return file.read()
    except FileNotFoundError:
        return None


def _write_plan_file(path: str, data: bytes) -> None:
    """Write the plan file whole or not at all (a reader reading it meanwhile sees the old one or the new one)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix='.plan-', dir=directory)
    try:
        with os.fdopen(handle, 'wb') as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _broadcast(distributed: Any, data: bytes | None, failed: bool = False) -> bytes:
    """Rank 0's ``data`` on every rank of the default group (two tensor broadcasts: its length, then its bytes).

    Raises:
        PetastormError: rank 0 failed to plan (``failed``; ``data`` is its error).
    """
    torch = sys.modules['torch']
    device = torch.device('cuda', torch.cuda.current_device()) if distributed.get_backend() == 'nccl' else \
        torch.device('cpu')
    if data is not None:
        header = torch.tensor([-len(data) if failed else len(data)], dtype=torch.int64, device=device)
    else:
        header = torch.zeros(1, dtype=torch.int64, device=device)
    distributed.broadcast(header, src=0)
    length = int(header.item())
    if data is not None:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else \
            torch.empty(0, dtype=torch.uint8, device=device)
    else:
        payload = torch.empty(abs(length), dtype=torch.uint8, device=device)
    if length:
        distributed.broadcast(payload, src=0)
    received = payload.cpu().numpy().tobytes()
    if length < 0:
        raise PetastormError(f'rank 0 of the job failed to plan the store, so this rank cannot read it: '
                             f'{received.decode(errors="replace")}')
    return received
