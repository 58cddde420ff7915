"""One plan for a job: the ranks of a job, the processes of a node and later runs share what planning read.

Planning a plain Parquet store without a ``_metadata`` summary reads every data file's footer. When each of N
ranks plans alone, a job sends N times the requests of one reader before its first step (12.8 million for 64
ranks over 100,000 files), and the object store throttles it. The plan is the same for every rank (sharding
happens after it), so it is made once and shared, as the bytes of :mod:`petastorm.store.saved_plan`:

* through ``torch.distributed``, when every rank of the job makes this reader: ``cur_shard='auto'`` found the
  rank there, or ``cur_shard``/``shard_count`` are the initialized group's rank and world size. When every
  footer must be read and the ranks listed the same files, each rank reads the footers of the files it will
  likely read (:mod:`petastorm.plan.likely_readers`) and sends them to rank 0, which plans and broadcasts the
  plan: the footers are read once, by every rank at once, and a rank reads the rows of the files whose footers it
  read without asking for them again. Otherwise rank 0 plans alone (reading the footers, or taking the plan from
  the sources below) and broadcasts it; the other ranks read no footer. A rank that makes its reader late gets
  the same plan: the exchanges wait for it. If a rank fails to read its footers, or rank 0 to plan, every rank
  raises, naming that rank's error.
* through the reader's local disk cache (``cache_type='local-disk'``): the processes of one node that share a
  cache directory plan once (the cache fills each key once, the others wait for it and read it).
* through a plan file (``plan_file=``): written by the first reader, read by later runs instead of every footer
  while the store's listing is the one the plan was made from; a store that changed is planned again and the file
  rewritten.

The store's listing (one request per thousand files) tells whether a saved plan still holds. The ranks of a job
list it once: rank 0 lists the store's directory and broadcasts the listing, and the other ranks open the store
with it (:func:`open_for_the_job`; the directories under it, a partitioned store's, each rank lists itself). The
ranks of one job read the same files: a rank whose listing still differs from rank 0's takes rank 0's. What is not
shared: ``filters`` are pruned with the footers' statistics, which each rank then reads itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from petastorm.cache import CacheBase, NullCache
from petastorm.errors import PetastormError
from petastorm.metadata.schemas import stored_or_inferred_schema
from petastorm.plan.likely_readers import likely_readers
from petastorm.reading.job_bytes import Sent, all_gather_fixed, broadcast_bytes, gather_bytes
from petastorm.reading.options import ReaderOptions
from petastorm.store.footers import footer_threads, metadata_row_counts, read_footers, store_data_files
from petastorm.store.listing import Look, StoreListing, decode_listing, encode_listing, look_at
from petastorm.store.model import ParquetStore
from petastorm.store.plain import PlainStore
from petastorm.store.saved_plan import (
    PlanMismatch,
    adopt_footers,
    adopt_plan,
    encode_footers,
    encode_plan,
    listing_digest,
)

__all__ = ['open_for_the_job', 'plans_alone', 'reads_the_footers', 'share_plan']

#: footers a rank of a job reads at a time, at least, when the ranks share the reading: together they read about
#: as many at a time as one reader (an object store throttles a prefix that many ranks ask at once), but never
#: fewer than this each.
_LEAST_FOOTER_THREADS = 8


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
    if _ranks_share_the_footers(distributed, options, dataset, cache):
        return _planned_by_every_rank(distributed, options, dataset)
    if distributed.get_rank() == 0:
        try:
            dataset, data = _planned_here(options, dataset, cache)
        except BaseException as err:
            broadcast_bytes(distributed, _failure(distributed, 'failed to plan the store', err), failed=True)
            raise
        broadcast_bytes(distributed, data)
        return dataset
    return adopt_plan(dataset, _rank_zero_plan(distributed), take_listing=True)


def open_for_the_job(options: ReaderOptions, opener: Callable[[Look], ParquetStore]) -> ParquetStore:
    """The store ``opener`` opens, listed once for the job: rank 0 lists it and broadcasts its listing.

    ``opener`` opens the store with the function it is given to list the URL's directory. The other ranks open it
    with rank 0's listing instead of listing it too (64 ranks listing 100,000 files are 6,400 listing requests at
    once, which a store answers slowly). When rank 0 did not list a directory (a file list, a table named by a
    file) or failed to open the store, every rank opens it itself, and meets the same error itself. A collective.
    """
    distributed = _job_group(options)
    if distributed is None:
        return opener(look_at)
    if distributed.get_rank() == 0:
        looked: list[StoreListing] = []

        def look(filesystem: pafs.FileSystem, root: str) -> StoreListing:
            looked.append(look_at(filesystem, root))
            return looked[-1]

        try:
            dataset = opener(look)
        except BaseException:
            broadcast_bytes(distributed, b'')
            raise
        broadcast_bytes(distributed, encode_listing(looked[0]) if looked else b'')
        return dataset
    sent = broadcast_bytes(distributed, None).data
    given = decode_listing(sent) if sent else None

    def look_given(filesystem: pafs.FileSystem, root: str) -> StoreListing:
        return given if given is not None and given.root == root else look_at(filesystem, root)

    return opener(look_given)


def plans_alone(options: ReaderOptions, cache: CacheBase) -> bool:
    """Whether a reader of ``options`` plans alone: nothing shares a plan with it (no job, cache or plan file)."""
    return _job_group(options) is None and _no_saved_plan(options, cache)


def reads_the_footers(options: ReaderOptions, cache: CacheBase) -> bool:
    """Whether a reader of ``options`` plans from the store's footers itself, no plan being handed to it.

    It plans alone, or it is rank 0 of a job (which plans from every footer, read by it or, in shares, by the
    ranks) and no cache or plan file is shared.
    """
    if not _no_saved_plan(options, cache):
        return False
    distributed = _job_group(options)
    return distributed is None or distributed.get_rank() == 0


def _no_saved_plan(options: ReaderOptions, cache: CacheBase) -> bool:
    """Whether no plan is saved for the reader to take: neither a plan file nor a local disk cache."""
    return options.plan_file is None and isinstance(cache, NullCache)


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


def _ranks_share_the_footers(distributed: Any, options: ReaderOptions, dataset: PlainStore,
                             cache: CacheBase) -> bool:
    """Whether every rank reads a share of the footers (a collective: every rank asks).

    So they do when each would plan from the footers (the store has no summary, its metadata no row counts,
    nothing but the job shares a plan) and every rank listed the same files.
    """
    try:
        able = _no_saved_plan(options, cache) and _planned_from_footers(dataset)
    except PetastormError:
        able = False  # malformed metadata: rank 0 plans alone, and its error reaches every rank
    mine = bytes([able]) + bytes.fromhex(listing_digest(dataset))
    return able and all(theirs == mine for theirs in all_gather_fixed(distributed, mine))


def _planned_from_footers(dataset: PlainStore) -> bool:
    """Whether planning the store reads every footer (neither a summary nor our row-group map gives the rows)."""
    summary_absent = dataset.has_summary is False or dataset.metadata_path is None or dataset.root is None
    return summary_absent and dataset.reads.row_counts is None and metadata_row_counts(dataset) is None


def _planned_by_every_rank(distributed: Any, options: ReaderOptions, dataset: PlainStore) -> ParquetStore:
    """The store planned by the ranks together.

    Each reads the footers of the files it will likely read (see :mod:`petastorm.plan.likely_readers`) and sends
    them to rank 0, which plans and broadcasts the plan. A rank then reads the rows of the files whose footers it
    read without asking for their footers again, so that the job's requests are about one reader's, and the
    footers are read by every rank at once.
    """
    share, error = _share_of_the_footers(distributed, options, dataset)
    shares = gather_bytes(distributed, share, failed=error is not None)
    if shares is not None:
        return _planned_from_shares(distributed, dataset, shares, error)
    if error is not None:
        broadcast_bytes(distributed, None)  # rank 0 sends every rank the failure
        raise error
    return adopt_plan(dataset, _rank_zero_plan(distributed))


def _share_of_the_footers(distributed: Any, options: ReaderOptions,
                          dataset: PlainStore) -> tuple[bytes, BaseException | None]:
    """This rank's share of the footers as bytes, read through the store's data files (which keep them open).

    A failure is returned with its text for the other ranks instead (every rank must take part in the exchanges).
    """
    try:
        readers = likely_readers([dataset.file_sizes.get(path) for path in dataset.files], options.shard,
                                 seed=options.seed, shuffle_row_groups=options.shuffle_row_groups,
                                 drop_partitions=options.shuffle_row_drop_partitions).tolist()
        mine = [path for path, reader in zip(dataset.files, readers, strict=True)
                if reader == distributed.get_rank()]
        threads = max(_LEAST_FOOTER_THREADS, footer_threads(dataset.filesystem) // distributed.get_world_size())
        footers = read_footers(dataset.filesystem, mine, store_data_files(dataset), threads)
        return encode_footers(dataset, footers), None
    except BaseException as err:
        return _failure(distributed, "failed to read its share of the store's footers", err), err


def _planned_from_shares(distributed: Any, dataset: PlainStore, shares: list[Sent],
                         error: BaseException | None) -> ParquetStore:
    """Rank 0: the store planned from every rank's share of the footers, the plan (or a failure) broadcast."""
    failed = next((sent for sent in shares if sent.failed), None)
    if failed is not None:
        broadcast_bytes(distributed, failed.data, failed=True)
        if error is not None:
            raise error
        raise PetastormError(failed.data.decode(errors='replace'))
    try:
        adopt_footers(dataset, [sent.data for sent in shares])
        data = _plan(dataset)
    except BaseException as err:
        broadcast_bytes(distributed, _failure(distributed, 'failed to plan the store', err), failed=True)
        raise
    broadcast_bytes(distributed, data)
    return dataset


def _failure(distributed: Any, what: str, err: BaseException) -> bytes:
    """The text the other ranks raise when this rank failed to do ``what`` (never empty)."""
    return (f'rank {distributed.get_rank()} of the job {what}, so this rank cannot read it: '
            f'{type(err).__name__}: {err}').encode()


def _rank_zero_plan(distributed: Any) -> bytes:
    """The plan rank 0 broadcasts.

    Raises:
        PetastormError: rank 0 failed to plan (naming its error).
    """
    plan = broadcast_bytes(distributed, None)
    if plan.failed:
        raise PetastormError(plan.data.decode(errors='replace'))
    return plan.data
