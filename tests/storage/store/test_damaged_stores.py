"""Damaged and vanished stores on S3 (and on disk): every fault is an error that names the URL, raised early.

The stores sit in the directory of a loopback S3 server (petastorm.test_util.s3_server), so a test damages a file
by writing to disk and both S3 clients users have, s3fs (``storage_options``) and pyarrow's ``S3FileSystem``
(``filesystem=``), see the damage. Throttling and dropped connections come from the fault-injecting proxy of
``support.s3_loopback`` in front of the server; the reads that survive them deliver every row exactly once.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.errors import (
    CorruptDataError,
    CorruptFooterError,
    DataFileChangedError,
    MissingDataFilesError,
    PetastormMetadataError,
    StorageError,
)
from petastorm.test_util.s3_server import S3DirectoryServer

pytest.importorskip('s3fs')

from reliability.helpers import SMALL_ROWS, write_small_dataset  # noqa: E402
from support.s3_loopback import FaultPlan, FaultProxy, arrow_s3  # noqa: E402

BUCKET = 'damaged'
#: storage_options (which pyarrow's own client reads when it can), an s3fs filesystem (our fsspec layer: ETags, size
#: checks on tail reads, retries request by request), a pyarrow filesystem given as filesystem=.
CLIENTS = ['options', 's3fs', 'pyarrow']

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings('ignore:Please use make_reader')]


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


@pytest.fixture(scope='module')
def pristine(tmp_path_factory) -> pathlib.Path:
    """A petastorm store of SMALL_ROWS rows in several files, on disk, copied by each test that damages it."""
    root = tmp_path_factory.mktemp('pristine') / 'store'
    write_small_dataset(f'file://{root}')
    return root


class Store:
    """A fresh copy of the pristine store in the server's bucket: its URL, directory and data files."""

    def __init__(self, server: S3DirectoryServer, pristine: pathlib.Path, name: str):
        self.dir = pathlib.Path(server.root) / BUCKET / name
        shutil.copytree(pristine, self.dir)
        self.url = f's3://{BUCKET}/{name}'
        self.files = sorted(p for p in self.dir.iterdir() if p.suffix == '.parquet')

    def url_of(self, path: pathlib.Path) -> str:
        return f'{self.url}/{path.name}'


@pytest.fixture
def store(server, pristine, request) -> Store:
    return Store(server, pristine, request.node.name.replace('[', '-').replace(']', ''))


def _client(server, client: str, endpoint: str | None = None, client_retries: bool = True, **s3fs_options) -> dict:
    """The reader arguments for one of the S3 clients of CLIENTS (``client_retries=False``: the client's retries off).

    ``s3fs_options`` are storage_options, given to s3fs itself for ``'s3fs'``.
    """
    if client == 'options':
        if not client_retries:
            s3fs_options['config_kwargs'] = {'retries': {'total_max_attempts': 1}}
        return {'storage_options': server.storage_options(endpoint, **s3fs_options)}
    if client == 's3fs':
        import s3fs

        return {'filesystem': s3fs.S3FileSystem(skip_instance_cache=True,
                                                **server.storage_options(endpoint, **s3fs_options))}
    retries = {} if client_retries else {'retry_strategy': pafs.AwsStandardS3RetryStrategy(max_attempts=1)}
    return {'filesystem': arrow_s3(endpoint or server.endpoint, **retries)}


def _ids(reader) -> list[int]:
    with reader:
        if reader.batched_output:
            return [int(i) for batch in reader for i in batch.id]
        return [int(row.id) for row in reader]


def _truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


# -- damaged data files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize('client', CLIENTS)
def test_a_truncated_data_file_is_corrupt_data_naming_its_url(server, store, client):
    victim = store.files[-1]
    _truncate(victim)
    reader = make_reader(store.url, reader_pool_type='thread', workers_count=2, **_client(server, client))
    with pytest.raises(CorruptDataError) as raised:
        _ids(reader)
    assert store.url_of(victim) in str(raised.value)
    assert 'row group' in str(raised.value)
    assert isinstance(raised.value.__cause__, pa.ArrowException)


@pytest.mark.parametrize('client', CLIENTS)
def test_a_plain_store_with_a_truncated_file_is_refused_at_planning_naming_its_url(server, tmp_path, client):
    directory = pathlib.Path(server.root) / BUCKET / f'plain-{client}'
    directory.mkdir()
    pq.write_table(pa.table({'id': np.arange(10)}), directory / 'a.parquet')
    pq.write_table(pa.table({'id': np.arange(10, 20)}), directory / 'b.parquet')
    _truncate(directory / 'b.parquet')
    with pytest.raises(CorruptFooterError) as raised:  # no metadata: planning reads the footers
        make_batch_reader(f's3://{BUCKET}/plain-{client}', **_client(server, client))
    assert f's3://{BUCKET}/plain-{client}/b.parquet' in str(raised.value)
    assert 'Parquet' in str(raised.value)
    assert isinstance(raised.value, CorruptDataError)
    assert isinstance(raised.value, PetastormMetadataError)


@pytest.mark.parametrize('client', CLIENTS)
def test_a_truncated_first_file_of_our_dataset_is_refused_when_the_reader_is_made(server, store, client):
    # A reader alone reads the first file's footer while the metadata is (storage_options): that read fails, and the
    # reader's own read of the footer, next, raises the error naming the file.
    _truncate(store.files[0])
    with pytest.raises(CorruptFooterError) as raised:
        make_reader(store.url, reader_pool_type='dummy', **_client(server, client))
    assert store.url_of(store.files[0]) in str(raised.value)
    assert isinstance(raised.value.__cause__, pa.ArrowException)


# -- vanished data files --------------------------------------------------------------------------------------------


@pytest.mark.parametrize('client', CLIENTS)
@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_metadata_naming_deleted_files_is_an_error_at_planning_naming_them(server, store, client, factory):
    for victim in store.files[1:]:
        victim.unlink()
    with pytest.raises(MissingDataFilesError) as raised:
        factory(store.url, **_client(server, client))
    message = str(raised.value)
    assert all(store.url_of(victim) in message for victim in store.files[1:])
    assert store.url_of(store.files[0]) not in message
    assert f'{store.url}/_common_metadata' in message
    assert raised.value.urls == tuple(store.url_of(victim) for victim in store.files[1:])


def test_a_store_whose_data_files_were_never_uploaded_is_not_an_empty_dataset(server, pristine, tmp_path):
    directory = pathlib.Path(server.root) / BUCKET / 'metadata-only'
    directory.mkdir()
    shutil.copy(pristine / '_common_metadata', directory / '_common_metadata')
    with pytest.raises(MissingDataFilesError, match='never uploaded'):
        make_reader(f's3://{BUCKET}/metadata-only', storage_options=server.storage_options())


def test_a_summary_metadata_file_naming_missing_files_is_an_error(tmp_path):
    # Spark and pyarrow write _metadata: the row groups of every file, with the file's relative path.
    collected = []
    for name, first in [('a.parquet', 0), ('b.parquet', 10)]:
        pq.write_table(pa.table({'id': np.arange(first, first + 10)}), tmp_path / name,
                       metadata_collector=collected)
        collected[-1].set_file_path(name)
    pq.write_metadata(pa.schema([('id', pa.int64())]), tmp_path / '_metadata', metadata_collector=collected)
    with make_batch_reader(f'file://{tmp_path}', reader_pool_type='dummy') as reader:
        assert sorted(int(i) for batch in reader for i in batch.id) == list(range(20))
    (tmp_path / 'b.parquet').unlink()
    with pytest.raises(MissingDataFilesError, match=f'file://{tmp_path}/b.parquet'):
        make_batch_reader(f'file://{tmp_path}')


# -- files that change between planning and reading ------------------------------------------------------------------


def _first_row_then_rest(reader, change) -> BaseException:
    with reader:
        iterator = iter(reader)
        next(iterator)
        change()
        with pytest.raises(DataFileChangedError) as raised:
            for _ in iterator:
                pass
    return raised.value


@pytest.mark.parametrize('client', CLIENTS)
@pytest.mark.parametrize('change', ['appended', 'shifted'])
def test_a_file_rewritten_with_another_size_after_planning_is_detected(server, store, client, change):
    if change == 'appended' and client != 's3fs':
        # pyarrow's client reads a file by its listed size without asking its size: the listed bytes of a file
        # appended to are still the file that was planned, and are read as it (a file rewritten otherwise fails
        # to read at its listed size, and the size asked then tells).
        pytest.skip("pyarrow's client reads the listed bytes of a file appended to")
    victim = store.files[-1]
    reader = make_reader(store.url, reader_pool_type='dummy', shuffle_row_groups=False, **_client(server, client))
    rewrite = (lambda data: data + b'appended') if change == 'appended' else (lambda data: b'shifted' + data)
    error = _first_row_then_rest(reader, lambda: victim.write_bytes(rewrite(victim.read_bytes())))
    assert store.url_of(victim) in str(error)
    assert 'changed' in str(error)


def test_an_s3_object_rewritten_with_the_same_size_is_detected_by_s3fs(server, store):
    # by its ETag, sent as If-Match with every read (pyarrow's client can send no such header: it compares sizes)
    client = 's3fs'
    victim = store.files[-1]
    stat = victim.stat()

    def rewrite_in_place():  # same bytes, same size, a later modification time: another ETag
        victim.write_bytes(victim.read_bytes())
        os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    reader = make_reader(store.url, reader_pool_type='dummy', shuffle_row_groups=False, **_client(server, client))
    error = _first_row_then_rest(reader, rewrite_in_place)
    assert store.url_of(victim) in str(error)
    assert 'ETag' in str(error)


@pytest.mark.parametrize('change', ['grew', 'shrank'])
def test_a_changed_file_is_detected_on_a_store_without_etags(change, tmp_path):
    # fsspec's memory filesystem gives no ETag: the size, checked on the read of each file's tail, tells.
    url = f'memory://changed-{change}-{tmp_path.name}'
    written = write_small_dataset(url)
    fs = fsspec.filesystem('memory')
    victim = sorted(written.files)[-1].removeprefix('memory://')
    data = fs.cat_file(victim)
    reader = make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False)
    changed = data + b'more bytes' if change == 'grew' else data[:len(data) // 2]
    error = _first_row_then_rest(reader, lambda: fs.pipe_file(victim, changed))
    assert victim in str(error)
    assert f'had {len(data)} bytes' in str(error)


def test_a_local_file_rewritten_after_planning_is_detected(tmp_path):
    written = write_small_dataset(f'file://{tmp_path}')
    victim = pathlib.Path(sorted(written.files)[-1].removeprefix('file://'))
    reader = make_reader(f'file://{tmp_path}', reader_pool_type='thread', workers_count=1, results_queue_size=1,
                         shuffle_row_groups=False)
    error = _first_row_then_rest(reader, lambda: victim.write_bytes(victim.read_bytes()[:-100] + b'x' * 50))
    assert str(victim) in str(error)


# -- throttling and dropped connections ------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def faults(server):
    with FaultProxy(server.port) as proxy:
        yield proxy


@pytest.mark.parametrize(('client', 'client_retries', 'every', 'factory', 'pool'), [
    # botocore retries nothing: every retry is our layer's, request by request. Every request fails once (a reader
    # makes few requests, too few for every third to reach each kind of fault), and its retry succeeds.
    ('s3fs', False, None, make_reader, 'thread'),
    ('s3fs', False, None, make_batch_reader, 'thread'),
    ('s3fs', False, None, make_reader, 'process'),
    # the AWS SDK's own retries, as users have them (it waits seconds after a dropped connection)
    ('pyarrow', True, 4, make_batch_reader, 'thread'),
    ('options', True, 4, make_reader, 'thread'),
])
def test_reads_retry_throttling_and_dropped_connections_with_every_row_once(server, store, faults, client,
                                                                           client_retries, every, factory, pool):
    options = _client(server, client, faults.endpoint, client_retries=client_retries,
                      config_kwargs={'retries': {'total_max_attempts': 1}})
    plan = FaultPlan(every=every, kinds=('503', 'drop', 'truncate'), methods=('GET',)) if every else \
        FaultPlan(first_try_only=True, kinds=('503', 'drop', 'truncate'), methods=('GET',))
    faults.reset(plan)
    try:
        ids = _ids(factory(store.url, reader_pool_type=pool, workers_count=2, **options))
        injected = dict(faults.plan.injected)
    finally:
        faults.reset()
    assert sorted(ids) == list(range(SMALL_ROWS))  # nothing lost, nothing doubled
    assert set(injected) == {'503', 'drop', 'truncate'}, injected


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_a_pyarrow_filesystem_without_retries_gets_ours_with_every_row_once(server, store, faults, factory,
                                                                            caplog):
    # pyarrow's client gives up at once: the planning and each row group's read are retried whole by our layer.
    # One reading thread makes the faults fall on the same requests each run.
    options = _client(server, 'pyarrow', faults.endpoint, client_retries=False)
    faults.reset(FaultPlan(every=7, kinds=('503', 'drop', 'truncate'), methods=('GET',)))
    try:
        with caplog.at_level('WARNING', logger='petastorm'):
            ids = _ids(factory(store.url, reader_pool_type='dummy', **options))
        injected = dict(faults.plan.injected)
    finally:
        faults.reset()
    assert sorted(ids) == list(range(SMALL_ROWS))
    assert set(injected) == {'503', 'drop', 'truncate'}, injected
    retried = [r.getMessage() for r in caplog.records if 'transient error' in r.getMessage()]
    assert len(retried) >= injected['503']  # (curl itself reconnects once when a kept-alive connection dropped)
    assert all(store.url in message for message in retried)


@pytest.mark.parametrize('client', CLIENTS)
def test_a_store_that_keeps_throttling_fails_with_a_storage_error_naming_the_url(server, store, faults, client,
                                                                                  monkeypatch):
    # Throttling is waited out for minutes; a storage that never stops throttling fails when the patience is over.
    monkeypatch.setattr('petastorm.fs._retry.THROTTLED_PATIENCE', 0.5)
    options = _client(server, client, faults.endpoint, client_retries=False,
                      config_kwargs={'retries': {'total_max_attempts': 1}})
    reader = make_reader(store.url, reader_pool_type='dummy', **options)
    faults.reset(FaultPlan(every=1, kinds=('503',), methods=('GET',)))
    try:
        with pytest.raises(StorageError) as raised:
            _ids(reader)
    finally:
        faults.reset()
    assert not isinstance(raised.value, CorruptDataError)
    assert store.url in str(raised.value)
    assert 'attempts' in str(raised.value)
