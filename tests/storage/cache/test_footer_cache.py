"""A reader's local disk cache keeps the footers of a remote store: a later reader plans without asking for them."""

from __future__ import annotations

import datetime
import os
import pickle
import threading

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.cache import FileStamp, FooterCache, LocalDiskCache, NullCache
from petastorm.fs._handler import StorageHandler
from petastorm.store.data_files import DataFiles
from petastorm.test_util.s3_server import S3DirectoryServer

BUCKET = 'footers'


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


def _write_store(server: S3DirectoryServer, name: str, files: int = 3, rows: int = 200) -> str:
    directory = os.path.join(server.root, BUCKET, name)
    os.makedirs(directory)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({'id': ids, 'x': ids * 0.5}), os.path.join(directory, f'part-{i}.parquet'),
                       row_group_size=rows // 2)
    return f's3://{BUCKET}/{name}'


def _client(server: S3DirectoryServer, client: str) -> dict:
    if client == 's3fs':
        s3fs = pytest.importorskip('s3fs')
        return {'filesystem': s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options())}
    return {'storage_options': server.storage_options()}  # pyarrow's own client


def _ids(url: str, cache_dir: str, cache_type: str, **client) -> list[int]:
    with make_batch_reader(url, cache_type=cache_type, cache_location=cache_dir, cache_size_limit=1 << 30,
                           cache_row_size_estimate=100, cache_extra_settings={'cleanup': False}, workers_count=2,
                           shuffle_row_groups=False, **client) as reader:
        return sorted(int(i) for batch in reader for i in batch.id)


def _data_file_requests(server: S3DirectoryServer) -> dict[str, int]:
    return {name: count for name, count in server.stats().objects.items() if name.endswith('.parquet')}


@pytest.mark.parametrize('cache_type', ['local-disk', 'local-disk-decoded'])
@pytest.mark.parametrize('client', ['options', 's3fs'])
def test_a_second_reader_asks_the_store_for_no_footer_and_no_row_group(server, tmp_path, client, cache_type):
    url = _write_store(server, f'{client}-{cache_type}')
    cache_dir = str(tmp_path / 'cache')
    server.reset_stats()
    assert _ids(url, cache_dir, cache_type, **_client(server, client)) == list(range(600))
    first = _data_file_requests(server)
    assert sorted(first) == [f'{BUCKET}/{client}-{cache_type}/part-{i}.parquet' for i in range(3)]
    server.reset_stats()
    assert _ids(url, cache_dir, cache_type, **_client(server, client)) == list(range(600))
    # One listing told it that no file had changed: their footers and row groups come from the cache.
    assert server.stats().requests == {'LIST': 1}


def test_a_file_rewritten_after_the_first_reader_has_its_new_footer_read(server, tmp_path):
    url = _write_store(server, 'rewritten')
    cache_dir = str(tmp_path / 'cache')
    assert _ids(url, cache_dir, 'local-disk', **_client(server, 'options')) == list(range(600))
    # A file of more rows under the same name: another size, another key (a stale footer would lose rows).
    path = os.path.join(server.root, BUCKET, 'rewritten', 'part-1.parquet')
    ids = np.arange(1000, 1300, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids * 0.5}), path, row_group_size=100)
    server.reset_stats()
    expected = sorted([*range(200), *range(400, 600), *range(1000, 1300)])
    assert _ids(url, cache_dir, 'local-disk', **_client(server, 'options')) == expected
    assert sorted(_data_file_requests(server)) == [f'{BUCKET}/rewritten/part-1.parquet']


def _footer_of(path: str) -> pq.FileMetaData:
    return pq.read_metadata(path)


@pytest.fixture
def local_file(tmp_path):
    path = str(tmp_path / 'one.parquet')
    pq.write_table(pa.table({'a': np.arange(50)}), path, row_group_size=10)
    return path


def test_a_kept_footer_is_the_footer_read(tmp_path, local_file):
    cache = LocalDiskCache(str(tmp_path / 'cache'), 1 << 20, 100)
    footers = FooterCache(cache, 'ds', {local_file: FileStamp(10, 20)})
    reads = []

    def read():
        reads.append(1)
        return _footer_of(local_file)

    first, second = footers.footer(local_file, read), footers.footer(local_file, read)
    assert len(reads) == 1
    assert second.num_rows == first.num_rows == 50
    assert second.num_row_groups == 5
    assert second.schema.to_arrow_schema() == first.schema.to_arrow_schema()
    assert second.row_group(3).column(0).statistics.min == 30


def test_a_file_without_a_full_stamp_is_read_every_time(tmp_path, local_file):
    cache = LocalDiskCache(str(tmp_path / 'cache'), 1 << 20, 100)
    footers = FooterCache(cache, 'ds', {local_file: FileStamp(10, None)})
    reads = []

    def read():
        reads.append(1)
        return _footer_of(local_file)

    footers.footer(local_file, read)
    footers.footer(local_file, read)
    footers.footer('unlisted', read)
    assert len(reads) == 3


def test_an_entry_that_is_not_a_footer_is_read_again_from_the_store(local_file):
    class Garbage(NullCache):
        def get(self, key, fill_cache_func):
            return b'PAR1 this is not a footer PAR1'

    footers = FooterCache(Garbage(), 'ds', {local_file: FileStamp(10, 20)})
    assert footers.footer(local_file, lambda: _footer_of(local_file)).num_rows == 50


def test_data_files_keep_their_footer_store_when_pickled_and_local_disk_never_uses_one(tmp_path, local_file):
    footers = FooterCache(NullCache(), 'ds', {})
    remote = DataFiles(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), {}, footers)
    assert pickle.loads(pickle.dumps(remote)).footers.dataset == 'ds'
    assert DataFiles(pafs.LocalFileSystem(), {}, footers).footers is None


@pytest.mark.parametrize('info', [
    {'LastModified': datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)},  # s3fs
    {'last_modified': datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)},  # adlfs
    {'updated': '2026-01-02T03:04:05Z'},  # gcsfs
    {'updated': '2026-01-02T03:04:05'},  # naive times are UTC
])
def test_fsspec_listings_give_the_modification_time_the_cache_keys_use(info):
    # Without it, a file rewritten with the same size would keep its cached footer and row groups.
    listed = StorageHandler._create_file_info(_Handler(), 'b/k.parquet', {'type': 'file', 'size': 7, **info})
    assert listed.size == 7
    assert listed.mtime == datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)


def test_an_fsspec_listing_without_a_time_has_none():
    listed = StorageHandler._create_file_info(_Handler(), 'b/k', {'type': 'file', 'size': 7, 'updated': 'soon'})
    assert listed.mtime is None
    assert listed.size == 7


class _Handler:
    """What _create_file_info uses of a handler: its client (none here: no version tags) and where it keeps them."""

    def __init__(self) -> None:
        self.fs = None
        self._sizes_lock = threading.Lock()
        self._etags: dict[str, str] = {}
