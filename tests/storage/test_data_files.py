"""Row groups of files on pyarrow's own S3 client, one request each: petastorm.metadata.data_files.DataFiles."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm.errors import DataFileChangedError, StorageNotFoundError
from petastorm.metadata.data_files import DataFiles, reads_by_fragments
from petastorm.test_util.s3_server import S3DirectoryServer

BUCKET = 'files'


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


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
    info = fs.get_file_info(path)
    return DataFiles(fs, {path: info.size}, {path: info.mtime_ns})


def test_a_row_group_is_one_request_once_the_footer_is_known(server):
    fs = _s3(server)
    path = _write(server, 'plain.parquet')
    files = _listed(fs, path)
    server.reset_stats()
    assert files.footer(path).num_row_groups == 4
    assert server.stats().requests == {'GET': 1}
    server.reset_stats()
    first = files.read_row_group(path, 1, ['x', 'id'])
    # the first read of the file checks its size and time beside the read: a HEAD, but no round trip more
    assert server.stats().requests == {'GET': 1, 'HEAD': 1}
    server.reset_stats()
    second = files.read_row_group(path, 2, ['id'])
    assert server.stats().requests == {'GET': 1}
    assert first.column_names == ['x', 'id']
    assert first.column('id').to_pylist() == list(range(10_000, 20_000))
    assert second.column('id').to_pylist() == list(range(20_000, 30_000))


def test_struct_leaves_come_in_their_struct_as_parquet_reads_them(server):
    fs = _s3(server)
    path = _write(server, 'nested.parquet')
    table = _listed(fs, path).read_row_group(path, 0, ['s.a'])
    assert table.equals(pq.ParquetFile(os.path.join(server.root, path)).read_row_group(0, columns=['s.a']))


def test_a_worker_process_gets_the_listing_and_reads_the_footer_itself(server):
    fs = _s3(server)
    path = _write(server, 'shipped.parquet')
    files = _listed(fs, path)
    files.footer(path)
    in_worker = pickle.loads(pickle.dumps(files))
    assert in_worker.sizes == files.sizes
    assert in_worker.mtimes == files.mtimes
    server.reset_stats()
    assert in_worker.read_row_group(path, 1, ['id']).num_rows == 10_000
    assert server.stats().requests == {'GET': 2, 'HEAD': 1}  # its footer, the row group, the check


@pytest.mark.parametrize('change', ['other size', 'same size'])
def test_a_file_changed_since_the_listing_is_refused(server, change):
    fs = _s3(server)
    path = _write(server, f'changed-{change.replace(" ", "-")}.parquet')
    files = _listed(fs, path)
    local = os.path.join(server.root, path)
    if change == 'other size':
        _write(server, os.path.basename(path), rows=50_000)
    else:
        time.sleep(1.1)  # S3 times have seconds: the rewrite must land in a later one
        with open(local, 'rb') as source:
            data = source.read()
        with open(local, 'wb') as target:
            target.write(data)
    with pytest.raises(DataFileChangedError, match=f's3://{path}'):
        files.read_row_group(path, 0, ['id'])


def test_a_file_gone_since_the_listing_is_not_found(server):
    fs = _s3(server)
    path = _write(server, 'gone.parquet')
    files = _listed(fs, path)
    files.footer(path)
    os.remove(os.path.join(server.root, path))
    with pytest.raises((StorageNotFoundError, FileNotFoundError)):
        files.read_row_group(path, 0, ['id'])


def test_only_pyarrows_remote_filesystems_read_by_fragments(server):
    from petastorm.fs import resolve_url

    assert reads_by_fragments(_s3(server))
    assert not reads_by_fragments(pafs.LocalFileSystem())
    ours, _ = resolve_url(f's3://{BUCKET}', {'key': 'k', 'secret': 's', 'endpoint_url': server.endpoint,
                                             'config_kwargs': {'read_timeout': 30}})
    assert not reads_by_fragments(ours)  # s3fs through our layer keeps sizes and footers itself
