"""Row groups of files on pyarrow's own S3 client, one request each: petastorm.store.data_files.DataFiles."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm.errors import DataFileChangedError
from petastorm.store.data_files import DataFiles
from petastorm.store.plain_or_sized import (
    PLAIN_LISTING_SECONDS,
    PLAIN_OPENS,
    SMALL_STORE_FILES,
    keeps_files_open,
    plain_opens,
)
from petastorm.store.sized_files import prepare_sized_reads
from petastorm.test_util.s3_server import S3DirectoryServer

BUCKET = 'files'


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


@pytest.fixture(autouse=True)
def _reads_by_size_ready():
    """``pyarrow.dataset`` imported, as a test run that imported it earlier has it: the files of these small stores
    are then read by their listed size, the way a store of many files is (tests of the plain way patch this)."""
    prepare_sized_reads()


def _s3(server: S3DirectoryServer) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=f'127.0.0.1:{server.port}', scheme='http', access_key='k',
                             secret_key='s', region='us-east-1')


def _write(server: S3DirectoryServer, name: str, rows: int = 40_000, row_group: int = 10_000) -> str:
    """A file of 4 row groups, big enough that its footer and its row groups are separate requests."""
    table = pa.table({'id': np.arange(rows, dtype=np.int64), 'x': np.arange(rows) * 0.5,
                      's': pa.array([{'a': i, 'b': str(i)} for i in range(rows)])})
    pq.write_table(table, os.path.join(server.root, BUCKET, name), row_group_size=row_group)
    return f'{BUCKET}/{name}'


def _listed(fs: pafs.FileSystem, path: str) -> DataFiles:
    return DataFiles(fs, {path: fs.get_file_info(path).size})


def _opened(server: S3DirectoryServer, name: str) -> tuple[str, DataFiles]:
    """A new file, listed and opened (its footer read), with the server's counters reset after."""
    path = _write(server, name)
    files = _listed(_s3(server), path)
    files.footer(path)
    server.reset_stats()
    return path, files


def test_a_file_is_opened_once_and_each_row_group_is_one_request(server):
    fs = _s3(server)
    path = _write(server, 'plain.parquet')
    files = _listed(fs, path)
    server.reset_stats()
    assert files.footer(path).num_row_groups == 4
    assert server.stats().requests == {'GET': 1}  # its footer, at the end of the listed size: no HEAD
    server.reset_stats()
    first = files.read_row_group(path, 1, ['x', 'id'])
    second = files.read_row_group(path, 2, ['id'])
    assert server.stats().requests == {'GET': 2}
    assert first.column_names == ['x', 'id']
    assert first.column('id').to_pylist() == list(range(10_000, 20_000))
    assert second.column('id').to_pylist() == list(range(20_000, 30_000))


def test_threads_share_the_open_file(server):
    from concurrent.futures import ThreadPoolExecutor

    fs = _s3(server)
    path = _write(server, 'shared.parquet')
    files = _listed(fs, path)
    with ThreadPoolExecutor(4) as pool:
        tables = list(pool.map(lambda index: files.read_row_group(path, index % 4, ['id']), range(16)))
    assert [t.column('id')[0].as_py() for t in tables] == [10_000 * (index % 4) for index in range(16)]


def test_struct_leaves_come_in_their_struct(server):
    fs = _s3(server)
    path = _write(server, 'nested.parquet')
    table = _listed(fs, path).read_row_group(path, 0, ['s.a'])
    assert table.equals(pq.ParquetFile(os.path.join(server.root, path)).read_row_group(0, columns=['s.a']))


def test_a_worker_process_gets_the_listing_and_opens_the_file_itself(server):
    fs = _s3(server)
    path = _write(server, 'shipped.parquet')
    files = _listed(fs, path)
    files.footer(path)
    in_worker = pickle.loads(pickle.dumps(files))
    assert in_worker.sizes == files.sizes
    server.reset_stats()
    assert in_worker.read_row_group(path, 1, ['id']).num_rows == 10_000
    assert server.stats().requests == {'GET': 2}  # its footer, the row group: its size is the listed one


def test_a_file_of_another_size_than_listed_is_refused(server):
    fs = _s3(server)
    path = _write(server, 'changed.parquet')
    files = _listed(fs, path)
    _write(server, 'changed.parquet', rows=50_000)
    with pytest.raises(DataFileChangedError, match=f's3://{path}'):
        files.read_row_group(path, 0, ['id'])


@pytest.mark.parametrize('rows', [30_000, 50_000])
def test_a_footer_of_a_file_that_changed_since_listed_is_refused(server, rows):
    fs = _s3(server)
    path = _write(server, f'changed-{rows}.parquet')
    files = _listed(fs, path)
    _write(server, f'changed-{rows}.parquet', rows=rows)  # smaller, larger: the listed end is not a footer
    with pytest.raises(DataFileChangedError, match=f's3://{path}.*had {files.sizes[path]} bytes when listed'):
        files.footer(path)


def test_a_file_that_changed_after_its_footer_was_read_is_refused(server):
    path, files = _opened(server, 'changed-later.parquet')
    _write(server, 'changed-later.parquet', rows=20_000)  # its row groups 2 and 3 are past the new end
    with pytest.raises(DataFileChangedError, match=f's3://{path}'):
        files.read_row_group(path, 3, ['id', 'x'])
    assert server.stats().requests['HEAD'] == 1  # the size, asked once the read failed


def test_a_file_gone_since_listed_is_not_found(server):
    fs = _s3(server)
    path = _write(server, 'gone.parquet')
    files = _listed(fs, path)
    os.remove(os.path.join(server.root, path))
    with pytest.raises(FileNotFoundError, match=f's3://{path} no longer exists'):
        files.footer(path)


@pytest.mark.parametrize('columns', [['s.b', 'x', 's.a', 'id', 'x'], ['s'], ['s.a'], []])
def test_row_groups_by_listed_size_are_what_parquet_file_reads(server, columns):
    path, files = _opened(server, f'columns-{len(columns)}.parquet')
    table = files.read_row_group(path, 2, columns)
    assert table.equals(pq.ParquetFile(os.path.join(server.root, path)).read_row_group(2, columns=columns))
    assert table.num_rows == 10_000
    # Some leaves of a struct are read through an open file (a HEAD), the others by the listed size; no column
    # needs no request.
    expected = {'HEAD': 1, 'GET': 1} if columns == ['s.a'] else {'GET': 1} if columns else {}
    assert server.stats().requests == expected


def test_only_pyarrows_remote_filesystems_keep_files_open(server):
    pytest.importorskip('s3fs')
    from petastorm.fs import resolve_url

    assert keeps_files_open(_s3(server))
    assert not keeps_files_open(pafs.LocalFileSystem())
    ours, _ = resolve_url(f's3://{BUCKET}', {'key': 'k', 'secret': 's', 'endpoint_url': server.endpoint,
                                             'config_kwargs': {'read_timeout': 30}})
    assert not keeps_files_open(ours)  # s3fs through our layer keeps sizes and footer bytes itself


def _far(server: S3DirectoryServer, proxy) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=proxy.endpoint.split('://')[1], scheme='http', access_key='k',
                             secret_key='s', region='us-east-1')


def test_far_away_row_groups_are_fetched_ahead_and_read_once(server):
    import threading
    import time

    from petastorm.test_util.delay_proxy import DelayProxy

    path = _write(server, 'ahead.parquet')
    with DelayProxy(('127.0.0.1', server.port), delay=0.03) as proxy:
        fs = _far(server, proxy)
        files = _listed(fs, path)
        files.footer(path)  # opening the file shows a round trip of 60 ms
        server.reset_stats()
        files.prefetch(path, 1, ['id'])
        files.prefetch(path, 2, ['id'])
        time.sleep(1.0)
        assert server.stats().requests == {'GET': 2}  # fetched before anyone read them
        assert files.read_row_group(path, 2, ['id']).column('id')[0].as_py() == 20_000
        assert files.read_row_group(path, 1, ['id']).column('id')[0].as_py() == 10_000
        assert server.stats().requests == {'GET': 2}  # and not fetched again
        files.close()
    assert not [t for t in threading.enumerate() if t.name.startswith('petastorm-fetch')]


def test_near_row_groups_are_not_fetched_ahead(server, monkeypatch):
    import time

    from petastorm.store import data_files

    # Row groups past the small reads' size: a loaded machine's loopback may answer in more than their round trip.
    monkeypatch.setattr(data_files, 'SMALL_READ_BYTES', 0)
    path, files = _opened(server, 'near.parquet')
    files.prefetch(path, 1, ['id'])
    time.sleep(0.3)
    assert server.stats().requests == {}
    files.close()


@pytest.mark.parametrize(('round_trip', 'small', 'large'), [(0.002, False, False), (0.02, True, False),
                                                            (0.05, True, True)], ids=['loopback', '20 ms', '50 ms'])
def test_small_row_groups_are_fetched_ahead_from_a_shorter_round_trip(server, round_trip, small, large):
    from petastorm.store import data_files

    fs = _s3(server)
    little = _write(server, 'little.parquet', rows=400, row_group=100)  # row groups of about 2 KB
    big = _write(server, 'big.parquet', rows=400_000, row_group=200_000)  # of about 4 MB
    unopened = _write(server, 'unopened.parquet', rows=400, row_group=100)
    files = DataFiles(fs, {path: fs.get_file_info(path).size for path in (little, big, unopened)})
    for path in (little, big):
        files.footer(path)
    assert files.sizes[unopened] <= data_files.SMALL_READ_BYTES < files.sizes[big]
    files._round_trip = round_trip  # what opening the files showed
    assert files._fetches_ahead(little, 1, ['id', 'x', 's']) == small
    assert files._fetches_ahead(unopened, 1, ['id']) == small  # its listed size bounds its row groups
    assert files._fetches_ahead(big, 1, ['id', 'x', 's']) == large
    files.close()


@pytest.mark.parametrize(('rows', 'in_flight'), [(100, 16), (300_000, 4)], ids=['small files', 'large files'])
def test_a_reader_20_ms_away_fetches_small_files_ahead_with_a_wider_window(server, rows, in_flight):
    from petastorm import make_batch_reader
    from petastorm.store.data_files import SMALL_READ_BYTES
    from petastorm.test_util.delay_proxy import DelayProxy

    folder = f'files-of-{rows}'
    os.makedirs(os.path.join(server.root, BUCKET, folder))
    count = 12 if rows == 100 else 2
    paths = [_write(server, f'{folder}/part-{index:02}.parquet', rows=rows, row_group=rows) for index in range(count)]
    sizes = [os.path.getsize(os.path.join(server.root, path)) for path in paths]
    assert all((size <= SMALL_READ_BYTES) == (rows == 100) for size in sizes)
    with DelayProxy(('127.0.0.1', server.port), delay=0.01) as proxy, \
            make_batch_reader(f's3://{BUCKET}/{folder}', filesystem=_far(server, proxy), reader_pool_type='thread',
                              workers_count=2, schema_fields=['id', 'x']) as reader:
        ids = sorted(int(i) for batch in reader for i in batch.id)
        # Small files: eight items a worker, so that their round trips overlap; large ones: two, as near.
        assert reader.diagnostics['max_in_flight'] == in_flight
    assert ids == sorted(list(range(rows)) * count)
    if rows == 100:  # (large ones are fetched ahead too where a loaded machine's round trip reaches 40 ms)
        assert reader.read_context.data_files.fetched_ahead > 0


def test_a_reader_far_away_fetches_ahead_and_joins_its_threads(server):
    import threading

    from petastorm import make_batch_reader
    from petastorm.test_util.delay_proxy import DelayProxy

    os.makedirs(os.path.join(server.root, BUCKET, 'far'))
    for index in range(3):
        _write(server, f'far/part-{index}.parquet')
    with DelayProxy(('127.0.0.1', server.port), delay=0.03) as proxy, \
            make_batch_reader(f's3://{BUCKET}/far', filesystem=_far(server, proxy), reader_pool_type='thread',
                              workers_count=2, schema_fields=['id']) as reader:
        ids = sorted(int(i) for batch in reader for i in batch.id)
    assert ids == sorted(list(range(40_000)) * 3)
    assert reader.read_context.data_files.fetched_ahead > 0
    assert not [t for t in threading.enumerate() if t.name.startswith('petastorm-fetch')]


def test_the_parts_of_a_split_item_share_one_read_of_their_row_group(server):
    from concurrent.futures import ThreadPoolExecutor

    path, files = _opened(server, 'split.parquet')
    with ThreadPoolExecutor(2) as pool:  # the two parts at once, as the thread pool reads them
        tables = list(pool.map(lambda _: files.read_row_group(path, 3, ['id'], readers=2), range(2)))
    assert tables[0] is tables[1]
    assert tables[0].column('id')[0].as_py() == 30_000
    assert server.stats().requests == {'GET': 1}
    # One after the other (the dummy pool), then the next read of it is a read of its own.
    assert files.read_row_group(path, 1, ['id'], readers=2) is files.read_row_group(path, 1, ['id'], readers=2)
    files.read_row_group(path, 1, ['id'])
    assert server.stats().requests == {'GET': 3}


def test_a_failed_shared_read_fails_its_parts_and_a_retry_reads_again(server, monkeypatch):
    fs = _s3(server)
    path = _write(server, 'flaky.parquet')
    files = _listed(fs, path)
    real, calls = files._read_row_group, []

    def failing_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise OSError('connection reset')
        return real(*args)

    monkeypatch.setattr(files, '_read_row_group', failing_once)
    with pytest.raises(OSError, match='connection reset'):
        files.read_row_group(path, 0, ['id'], readers=2)
    retried = files.read_row_group(path, 0, ['id'], readers=2)  # the first part's retry: a read of its own
    assert retried.column('id')[0].as_py() == 0
    assert len(calls) == 2


@pytest.mark.parametrize('delay', [0, 0.03], ids=['near', 'far, fetching ahead'])
def test_a_loaders_split_first_item_asks_the_store_what_a_whole_one_does(server, delay, monkeypatch):
    from contextlib import nullcontext

    from petastorm import make_batch_reader
    from petastorm.store import data_files
    from petastorm.test_util.delay_proxy import DelayProxy

    monkeypatch.setattr(data_files, 'SMALL_READ_BYTES', 0)  # fetched ahead for the long round trip alone

    folder = f'loader-{delay}'
    os.makedirs(os.path.join(server.root, BUCKET, folder))
    _write(server, f'{folder}/part-0.parquet')
    requests, sizes = [], []
    for first_rows in (None, 100):
        with DelayProxy(('127.0.0.1', server.port), delay=delay) if delay else nullcontext() as proxy:
            server.reset_stats()
            filesystem = _far(server, proxy) if delay else _s3(server)
            with make_batch_reader(f's3://{BUCKET}/{folder}', filesystem=filesystem, reader_pool_type='thread',
                                   workers_count=2, schema_fields=['id'], shuffle_row_groups=False) as reader:
                batches = list(reader.column_batches(first_rows))
                fetched_ahead = reader.read_context.data_files.fetched_ahead
            requests.append(server.stats().requests)
            sizes.append([batch.num_rows for batch in batches])
    assert sizes == [[10_000] * 4, [100, 9_900] + [10_000] * 3]
    assert requests[0] == requests[1]
    assert (fetched_ahead > 0) == bool(delay)


def test_a_footer_that_came_with_the_plan_is_not_read_again(server):
    # Reading by the listed size would read the footer again (pyarrow's fragments take none given): opening the
    # file costs the same one request, a HEAD, and checks its size first.
    fs = _s3(server)
    path = _write(server, 'planned.parquet')
    files = _listed(fs, path)
    sink = pa.BufferOutputStream()
    pq.ParquetFile(os.path.join(server.root, path)).metadata.write_metadata_file(sink)
    files.known_footers[path] = sink.getvalue().to_pybytes()
    server.reset_stats()
    assert files.footer(path).num_row_groups == 4
    assert server.stats().requests == {}
    assert files.read_row_group(path, 3, ['id']).column('id')[0].as_py() == 30_000
    assert server.stats().requests == {'HEAD': 1, 'GET': 1}


def test_azure_footers_are_one_request_and_row_groups_need_no_head():
    # pyarrow's Azure client asks a blob's size on every open by path, as its S3 client does.
    from petastorm.fs import resolve_url
    from support.cloud_emulators import Azurite, azurite_missing
    from support.s3_loopback import FaultProxy

    if azurite_missing():
        pytest.skip(azurite_missing())
    with Azurite() as server, FaultProxy(server.port) as proxy:
        direct = resolve_url('abfs://sized', server.storage_options())[0]
        direct.create_dir('sized')
        with direct.open_output_stream('sized/f.parquet') as out:
            pq.write_table(pa.table({'id': np.arange(4_000)}), out, row_group_size=1_000)
        fs = resolve_url('abfs://sized', server.storage_options(proxy.endpoint))[0]
        assert keeps_files_open(fs)
        files = _listed(fs, 'sized/f.parquet')
        proxy.reset()
        assert files.footer('sized/f.parquet').num_row_groups == 4
        assert files.read_row_group('sized/f.parquet', 2, ['id']).column('id')[0].as_py() == 2_000
        assert [request.method for request in proxy.requests] == ['GET', 'GET']  # the footer, the row group
        with direct.open_output_stream('sized/f.parquet') as out:  # rewritten with another size
            pq.write_table(pa.table({'id': np.arange(3_000)}), out, row_group_size=1_000)
        with pytest.raises(DataFileChangedError, match='sized/f.parquet'):
            DataFiles(fs, dict(files.sizes)).footer('sized/f.parquet')


def test_the_first_files_open_plainly_and_reads_of_open_files_do_not_wait_for_the_import(server, monkeypatch):
    """Before ``pyarrow.dataset`` is imported, ``open_plainly_first`` opens the next few files with a HEAD each;
    the file after them imports it, and meanwhile row groups of the files already open are read (the import is
    not made under the lock their reads take)."""
    import threading

    from petastorm.store import data_files, plain_or_sized

    importing, release = threading.Event(), threading.Event()

    def slow_import():
        importing.set()
        assert release.wait(30)

    monkeypatch.setattr(data_files, 'sized_reads_ready', lambda: False)
    monkeypatch.setattr(plain_or_sized, 'PLAIN_OPENS', 2)
    monkeypatch.setattr(data_files, 'prepare_sized_reads', slow_import)
    fs = _s3(server)
    paths = [_write(server, f'plain-first-{index}.parquet', rows=20, row_group=10) for index in range(3)]
    files = DataFiles(fs, {path: fs.get_file_info(path).size for path in paths})
    files.open_plainly_first()
    server.reset_stats()
    for path in paths[:2]:
        files.footer(path)
    assert server.stats().requests == {'HEAD': 2, 'GET': 2}
    third = threading.Thread(target=files.footer, args=(paths[2],))
    third.start()
    try:
        assert importing.wait(30)
        read = threading.Thread(target=files.read_row_group, args=(paths[0], 1, ['id']))
        read.start()
        read.join(10)
        assert not read.is_alive(), 'a row group of an open file waited for the import'
    finally:
        release.set()
        third.join()
    server.reset_stats()
    assert files.footer(paths[2]).num_row_groups == 2
    assert files.read_row_group(paths[2], 0, ['id'])['id'].to_pylist() == list(range(10))
    assert 'HEAD' not in server.stats().requests  # the third file was read by its listed size


@pytest.mark.parametrize('count', [PLAIN_OPENS, PLAIN_OPENS + 1])
def test_a_store_of_a_few_files_is_read_without_importing_pyarrow_dataset(server, monkeypatch, count):
    """A store of at most ``PLAIN_OPENS`` files opens each of them the plain way (a HEAD each): reading them by
    their listed size would first import ``pyarrow.dataset`` and pandas (0.2 s of CPU), more than such a store's
    round trips. One file more and the files are read by their listed size, without a HEAD."""
    from petastorm.store import data_files

    imports = []
    monkeypatch.setattr(data_files, 'sized_reads_ready', lambda: bool(imports))
    monkeypatch.setattr(data_files, 'prepare_sized_reads', lambda: imports.append(True))
    fs = _s3(server)
    paths = [_write(server, f'few-{count}-{index}.parquet', rows=20, row_group=10) for index in range(count)]
    files = DataFiles(fs, {path: fs.get_file_info(path).size for path in paths})
    server.reset_stats()
    for path in paths:
        assert files.footer(path).num_row_groups == 2
        assert files.read_row_group(path, 1, ['id'])['id'].to_pylist() == list(range(10, 20))
    requests = server.stats().requests
    if count <= PLAIN_OPENS:
        assert not imports
        assert requests == {'HEAD': count, 'GET': 2 * count}
    else:
        assert imports
        assert 'HEAD' not in requests
        assert requests == {'GET': 2 * count}


@pytest.mark.parametrize(('files', 'listing_seconds', 'plain'), [
    (PLAIN_OPENS, None, PLAIN_OPENS),  # a few files: plain wherever the store is
    (PLAIN_OPENS, 5.0, PLAIN_OPENS),
    (PLAIN_OPENS + 1, None, 0),  # more, and the listing was not timed: the import
    (PLAIN_OPENS + 1, PLAIN_LISTING_SECONDS / 10, PLAIN_OPENS + 1),
    (SMALL_STORE_FILES, PLAIN_LISTING_SECONDS / 10, SMALL_STORE_FILES),
    (SMALL_STORE_FILES + 1, PLAIN_LISTING_SECONDS / 10, 0),  # too many HEAD requests
    (SMALL_STORE_FILES, PLAIN_LISTING_SECONDS, 0),  # too far: the HEAD requests cost more than the import
])
def test_plain_opens_weigh_the_head_requests_against_the_import(files, listing_seconds, plain):
    assert plain_opens(files, listing_seconds) == plain


def test_a_small_store_listed_quickly_is_read_the_plain_way(server, monkeypatch):
    """A store of more than ``PLAIN_OPENS`` files on a server near enough (its listing's request came back within
    ``PLAIN_LISTING_SECONDS``) is read with a HEAD per file, not by listed size after importing ``pyarrow.dataset``;
    the same store behind a slow listing is read by listed size. The listing's time reaches the store's data
    files, and their pickled copies in worker processes."""
    from petastorm.store import data_files, plain_or_sized
    from petastorm.store.footers import read_footers, store_data_files
    from petastorm.store.opening import open_any_store

    imports = []
    monkeypatch.setattr(data_files, 'sized_reads_ready', lambda: bool(imports))
    monkeypatch.setattr(data_files, 'prepare_sized_reads', lambda: imports.append(True))
    # However loaded the machine running the test, a listing of the loopback server is near.
    monkeypatch.setattr(plain_or_sized, 'PLAIN_LISTING_SECONDS', 60.0)
    count = PLAIN_OPENS + 4
    os.makedirs(os.path.join(server.root, BUCKET, 'near'))
    for index in range(count):
        _write(server, f'near/part-{index}.parquet', rows=20, row_group=10)
    store = open_any_store(f's3://{BUCKET}/near', filesystem=_s3(server))
    assert store.listing_seconds is not None
    assert store.listing_seconds < plain_or_sized.PLAIN_LISTING_SECONDS
    files = store_data_files(store)
    assert pickle.loads(pickle.dumps(files)).listing_seconds == store.listing_seconds
    server.reset_stats()
    assert [footer.num_rows for footer in read_footers(files.filesystem, list(store.files), files).values()] == \
        [20] * count
    for path in store.files:
        assert files.read_row_group(path, 1, ['id'])['id'].to_pylist() == list(range(10, 20))
    assert not imports
    assert server.stats().requests == {'HEAD': count, 'GET': 2 * count}

    far = DataFiles(files.filesystem, files.sizes, listing_seconds=plain_or_sized.PLAIN_LISTING_SECONDS * 2)
    server.reset_stats()
    for path in store.files:
        assert far.read_row_group(path, 1, ['id'])['id'].to_pylist() == list(range(10, 20))
    assert imports
    assert server.stats().requests == {'GET': 2 * count}
