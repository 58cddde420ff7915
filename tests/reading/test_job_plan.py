"""One plan for a job: ranks of real gloo jobs, processes and later runs share the footers' plan of a plain store.

A store without a ``_metadata`` summary is planned from every file's footer. The ranks of a job share one plan:
each rank reads the footers of the files it will read, rank 0 plans from all of them and the others receive the
plan, so the job's requests, counted at the loopback S3 server, are about one reader's; every row is read once
across the ranks; a rank that makes its reader late gets the same plan; a rank that cannot read a footer fails
every rank; a plan file spares later runs the footers until the store's listing changes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.errors import PetastormMetadataError
from petastorm.store.saved_plan import PlanMismatch, adopt_plan, encode_plan
from petastorm.test_util.s3_server import S3DirectoryServer

pytest.importorskip('torch')
pytest.importorskip('s3fs')

from support.rank_processes import run_ranks  # noqa: E402

BUCKET = 'jobs'
FILES = 24
ROWS = 10
SCRIPT = os.path.join(os.path.dirname(__file__), 'job_plan_rank.py')


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


def _store(server, name: str, files: int = FILES) -> str:
    directory = os.path.join(server.root, BUCKET, name)
    os.makedirs(directory)
    for index in range(files):
        _write_file(directory, index)
    return f's3://{BUCKET}/{name}'


def _write_file(directory: str, index: int) -> None:
    pq.write_table(pa.table({'id': np.arange(index * ROWS, (index + 1) * ROWS, dtype=np.int64)}),
                   os.path.join(directory, f'part-{index:03d}.parquet'))


def _results(outputs: list[str]) -> list[dict]:
    return [json.loads(line.split('RESULT ', 1)[1]) for output in outputs for line in output.splitlines()
            if line.startswith('RESULT ')]


def _one_reader_requests(server, url: str) -> int:
    """The requests of one reader reading the whole store, planning included."""
    server.reset_stats()
    with make_batch_reader(url, reader_pool_type='thread', workers_count=2,
                           storage_options=server.storage_options()) as reader:
        ids = sorted(int(i) for batch in reader for i in batch.id)
    assert len(ids) == len(set(ids))
    return server.stats().total_requests


@pytest.mark.parametrize(('world', 'mode'), [(2, 'rows'), (4, 'rows'), (3, 'row_groups')])
def test_the_ranks_of_a_job_plan_once_and_read_every_row_once(server, world, mode):
    url = _store(server, f'job{world}-{mode}')
    single = _one_reader_requests(server, url)
    server.reset_stats()
    results = _results(run_ranks(SCRIPT, [server.endpoint, url, '--shard-mode', mode], world))
    job = server.stats()
    assert len({r['plan'] for r in results}) == 1
    assert len(results) == world
    ids = sorted(i for r in results for i in r['ids'])
    assert ids == list(range(FILES * ROWS))  # every row once across the ranks
    # Rank 0 lists the store for the job; each rank reads the footers of the files it will read and then their
    # rows: every footer is read once, by one rank, and so is every file's row group, but for the files a share
    # begins or ends in. When rank 0 read every footer, the other ranks asked for the size of each file of theirs
    # (a HEAD each); each rank planning alone would add two requests per file per rank.
    assert job.requests['LIST'] == 1
    assert job.requests.get('HEAD', 0) == 0, job.requests
    assert job.requests['GET'] <= 2 * FILES + world - 1, job.requests
    assert job.total_requests <= single + 2 * (world - 1), (job.requests, single)


def test_a_rank_that_makes_its_reader_late_gets_the_same_plan(server):
    url = _store(server, 'late')
    results = _results(run_ranks(SCRIPT, [server.endpoint, url, '--late'], 2))
    assert len({r['plan'] for r in results}) == 1
    assert sorted(i for r in results for i in r['ids']) == list(range(FILES * ROWS))


def test_a_rank_that_cannot_read_a_footer_of_its_share_fails_every_rank_naming_the_file(server):
    url = _store(server, 'damaged', files=8)
    with open(os.path.join(server.root, BUCKET, 'damaged', 'part-005.parquet'), 'wb') as damaged:
        damaged.write(b'not parquet at all' * 100)
    results = sorted(_results(run_ranks(SCRIPT, [server.endpoint, url, '--catch'], 2)), key=lambda r: r['rank'])
    assert [r.get('error') for r in results].count('CorruptFooterError') == 1, results
    owner = next(r['rank'] for r in results if r['error'] == 'CorruptFooterError')
    other = results[1 - owner]
    assert other['error'] == 'PetastormError'
    assert f"rank {owner} of the job failed to read its share of the store's footers" in other['message']
    for result in results:
        assert 'part-005.parquet' in result['message']
        assert 'not a readable Parquet file' in result['message']


def test_a_store_that_is_not_there_fails_every_rank_with_the_error_it_meets_itself(server):
    url = f's3://{BUCKET}/not-there'
    results = _results(run_ranks(SCRIPT, [server.endpoint, url, '--catch'], 2))
    assert [r.get('error') for r in results] == ['StorageNotFoundError'] * 2, results


def _planning_requests(server, url: str, plan_file: str) -> tuple[dict, list[int]]:
    server.reset_stats()
    with make_batch_reader(url, reader_pool_type='dummy', storage_options=server.storage_options(),
                           plan_file=plan_file) as reader:
        requests = dict(server.stats().requests)
        ids = sorted(int(i) for batch in reader for i in batch.id)
    return requests, ids


def test_a_plan_file_spares_later_readers_the_footers_until_the_listing_changes(server, tmp_path):
    url = _store(server, 'planned', files=6)
    plan_file = str(tmp_path / 'plans' / 'planned.arrow')
    first, ids = _planning_requests(server, url, plan_file)
    assert first.get('GET', 0) >= 6
    assert ids == list(range(60))
    again, ids = _planning_requests(server, url, plan_file)
    assert again == {'LIST': 1}
    assert ids == list(range(60))
    _write_file(os.path.join(server.root, BUCKET, 'planned'), 6)
    changed, ids = _planning_requests(server, url, plan_file)
    assert changed.get('GET', 0) >= 7
    assert ids == list(range(70))
    assert _planning_requests(server, url, plan_file)[0] == {'LIST': 1}  # and the rewritten plan holds


def test_a_plan_made_from_another_listing_is_refused(server, tmp_path):
    url = _store(server, 'refused', files=3)
    with make_batch_reader(url, reader_pool_type='dummy', storage_options=server.storage_options()) as reader:
        data = encode_plan(reader.dataset)
        list(reader)
    _write_file(os.path.join(server.root, BUCKET, 'refused'), 3)
    with make_batch_reader(url, reader_pool_type='dummy', storage_options=server.storage_options()) as reader:
        with pytest.raises(PlanMismatch, match='another listing'):
            adopt_plan(reader.dataset, data)
        taken = adopt_plan(reader.dataset, data, take_listing=True)
        assert len(taken.files) == 3
        assert len(reader.dataset.files) == 4
    with pytest.raises(PetastormMetadataError, match='not readable'):
        adopt_plan(taken, b'not a plan')


def test_a_job_with_a_plan_file_reads_a_changed_store_whole(server, tmp_path):
    url = _store(server, 'job-file', files=8)
    plan_file = str(tmp_path / 'job.plan')
    results = _results(run_ranks(SCRIPT, [server.endpoint, url, '--plan-file', plan_file], 2))
    assert sorted(i for r in results for i in r['ids']) == list(range(80))
    _write_file(os.path.join(server.root, BUCKET, 'job-file'), 8)
    results = _results(run_ranks(SCRIPT, [server.endpoint, url, '--plan-file', plan_file], 2))
    assert len({r['plan'] for r in results}) == 1
    assert sorted(i for r in results for i in r['ids']) == list(range(90))


def test_the_footers_read_for_a_plan_come_with_it_within_their_budget(server, monkeypatch):
    url = _store(server, 'footers', files=4)
    with make_batch_reader(url, reader_pool_type='dummy', storage_options=server.storage_options()) as reader:
        with_footers = encode_plan(reader.dataset)
        monkeypatch.setattr('petastorm.store.saved_plan.FOOTER_BUDGET', 100)
        without = encode_plan(reader.dataset)
        list(reader)
    assert len(with_footers) > len(without)
    with make_batch_reader(url, reader_pool_type='dummy', storage_options=server.storage_options()) as reader:
        adopted = adopt_plan(reader.dataset, with_footers)
        assert set(adopted.reads.footer_bytes) == set(adopted.files)


def test_readers_sharing_a_local_disk_cache_plan_once(server, tmp_path, monkeypatch):
    from petastorm.reading import job_plan

    url = _store(server, 'cached', files=5)
    planned = []
    original = job_plan._plan
    monkeypatch.setattr(job_plan, '_plan', lambda dataset: planned.append(1) or original(dataset))
    cache = {'cache_type': 'local-disk', 'cache_location': str(tmp_path / 'cache'), 'cache_size_limit': 1 << 30,
             'cache_row_size_estimate': 100, 'cache_extra_settings': {'cleanup': False}}
    for _ in range(2):
        server.reset_stats()
        with make_batch_reader(url, reader_pool_type='dummy', storage_options=server.storage_options(),
                               **cache) as reader:
            requests = dict(server.stats().requests)
            assert sorted(int(i) for batch in reader for i in batch.id) == list(range(50))
    assert planned == [1]  # the second reader took the plan from the cache
    assert requests == {'LIST': 1}


class _Group:
    """A stand-in for an initialized ``torch.distributed`` of two ranks (only what the rule asks of it)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return self.rank


@pytest.mark.parametrize(('rank', 'plan_file', 'cached', 'expected'), [
    (None, None, False, True),  # alone
    (0, None, False, True),  # rank 0 of a job reads every footer, the first one beside the metadata
    (1, None, False, False),  # rank 1 is handed rank 0's plan
    (0, 'plan.bin', False, False),  # a plan file may hand rank 0 its plan
    (None, None, True, False),  # so may the node's cache
])
def test_the_readers_that_read_the_footers_themselves(monkeypatch, tmp_path, rank, plan_file, cached, expected):
    import sys
    from types import SimpleNamespace

    from petastorm.cache import NullCache
    from petastorm.local_disk_cache import LocalDiskCache
    from petastorm.reading.job_plan import reads_the_footers

    if rank is not None:
        monkeypatch.setitem(sys.modules, 'torch.distributed', _Group(rank))
    else:
        monkeypatch.delitem(sys.modules, 'torch.distributed', raising=False)
    options = SimpleNamespace(plan_file=plan_file, shard_source='torch.distributed', shard_count=2, cur_shard=rank)
    cache = LocalDiskCache(str(tmp_path / 'cache'), 1 << 20, None) if cached else NullCache()
    assert reads_the_footers(options, cache) is expected


class _Gathering(_Group):
    """A group whose ``all_gather`` gives this rank's bytes and the other rank's (``theirs``: a changed copy)."""

    def __init__(self, theirs) -> None:
        super().__init__(0)
        self.theirs = theirs

    def get_backend(self) -> str:
        return 'gloo'

    def all_gather(self, received, tensor) -> None:
        import torch

        received[0].copy_(tensor)
        received[1].copy_(torch.frombuffer(bytearray(self.theirs(tensor.numpy().tobytes())), dtype=torch.uint8))


@pytest.mark.parametrize(('theirs', 'plan_file', 'summary', 'expected'), [
    (lambda mine: mine, None, False, True),  # the same listing: the footers are read in shares
    (lambda mine: mine[:-1] + bytes([mine[-1] ^ 1]), None, False, False),  # another listing: rank 0 plans alone
    (lambda mine: bytes([0]) + mine[1:], None, False, False),  # the other rank has a plan file or a cache
    (lambda mine: mine, 'plan.bin', False, False),  # this one has: rank 0 plans (from the file) alone
    (lambda mine: mine, None, True, False),  # a _metadata summary plans the store: rank 0 reads it alone
])
def test_the_ranks_read_the_footers_in_shares_only_when_all_of_them_can(tmp_path, theirs, plan_file, summary,
                                                                         expected):
    from types import SimpleNamespace

    from petastorm.cache import NullCache
    from petastorm.reading.job_plan import _ranks_share_the_footers
    from petastorm.store.opening import open_any_store

    footers = []
    for index in range(3):
        _write_file(str(tmp_path), index)
        footers.append(pq.read_metadata(str(tmp_path / f'part-{index:03d}.parquet')))
        footers[-1].set_file_path(f'part-{index:03d}.parquet')
    if summary:
        schema = pq.read_schema(str(tmp_path / 'part-000.parquet'))
        pq.write_metadata(schema, str(tmp_path / '_common_metadata'))
        pq.write_metadata(schema, str(tmp_path / '_metadata'), metadata_collector=footers)
    dataset = open_any_store(str(tmp_path))
    options = SimpleNamespace(plan_file=plan_file)
    assert _ranks_share_the_footers(_Gathering(theirs), options, dataset, NullCache()) is expected
