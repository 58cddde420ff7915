"""Which S3 client reads a URL, and what users see of the difference: the same rows, errors that name the URL."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.errors import StorageNotFoundError
from petastorm.fs import resolve_url
from petastorm.test_util.s3_server import S3DirectoryServer
from petastorm.unischema import Unischema, UnischemaField

pytest.importorskip('s3fs')

BUCKET = 'clients'
SCHEMA = Unischema('Clients', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                               UnischemaField('vec', np.float32, (2,), NdarrayCodec(), False)])


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


def _rows(count: int):
    return ({'id': i, 'vec': np.full(2, i, np.float32)} for i in range(count))


@pytest.mark.parametrize(('options', 'client'), [
    ({}, pafs.S3FileSystem),
    ({'config_kwargs': {'read_timeout': 30}}, pafs.PyFileSystem),  # an option only s3fs takes
])
def test_both_clients_write_and_read_the_same_rows(server, options, client):
    storage_options = server.storage_options(**options)
    url = f's3://{BUCKET}/{client.__name__}'
    assert isinstance(resolve_url(url, storage_options)[0], client)
    write_dataset(url, SCHEMA, _rows(50), storage_options=storage_options, row_group_size_mb=0.0005)
    with make_reader(url, storage_options=storage_options, reader_pool_type='thread', workers_count=3) as reader:
        assert sorted(int(row.id) for row in reader) == list(range(50))
    with make_batch_reader(url, storage_options=storage_options, reader_pool_type='process',
                           workers_count=2) as reader:
        assert sorted(int(i) for batch in reader for i in batch.id) == list(range(50))


def test_writing_into_a_bucket_that_does_not_exist_names_the_url(server):
    url = 's3://no-such-bucket/dataset'
    with pytest.raises(StorageNotFoundError, match=url):
        write_dataset(url, SCHEMA, _rows(3), storage_options=server.storage_options())
    assert not os.path.exists(os.path.join(server.root, 'no-such-bucket'))
