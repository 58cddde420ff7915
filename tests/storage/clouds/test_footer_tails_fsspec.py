"""Stores of many files read through s3fs and adlfs (options only those clients take) have their footers read at
once (:mod:`petastorm.store.footer_tails`), against the loopback S3 server and Azurite, each behind the logging
proxy: one ranged read of each file's end, which also serves its row groups, every row once; an object rewritten
since the listing (same size, other bytes) is refused naming its URL, because each read names the listed ETag.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.errors import DataFileChangedError
from petastorm.fs import resolve_url
from petastorm.store.footer_tails import TOGETHER_FROM
from petastorm.store.footers import store_footers
from petastorm.store.opening import open_any_store
from support.s3_loopback import BUCKET

pytestmark = pytest.mark.timeout(180)

FILES = TOGETHER_FROM + 8
ROWS = 10


def _parquet(first: int, tag: str = 'a') -> bytes:
    """A small file of ``ROWS`` ids from ``first``; ``tag`` changes its bytes, never its size."""
    table = pa.table({'id': np.arange(first, first + ROWS)}).replace_schema_metadata({'tag': tag})
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    return buffer.getvalue().to_pybytes()


@dataclass
class Client:
    """A store's URL root, the options that choose the fsspec client, and the proxy that logs its requests."""

    name: str
    root: str
    extra: dict[str, Any]
    server: Any
    proxy: Any

    def options(self, through_proxy: bool = False) -> dict[str, Any]:
        return self.server.storage_options(self.proxy.endpoint if through_proxy else None, **self.extra)

    def reads_of_data_files(self) -> list:
        return [r for r in self.proxy.requests if r.method == 'GET' and '.parquet' in r.path]


@pytest.fixture(params=['s3fs', 'adlfs'])
def client(request) -> Client:
    if request.param == 's3fs':
        moto, proxy = request.getfixturevalue('moto'), request.getfixturevalue('proxy')
        made = Client('s3fs', f's3://{BUCKET}', {'config_kwargs': {'read_timeout': 60}}, moto, proxy)
    else:
        azurite = request.getfixturevalue('azurite')
        made = Client('adlfs', f'abfs://{azurite.root}', {'location_mode': 'primary'}, azurite.server, azurite.proxy)
    made.proxy.reset()
    yield made
    made.proxy.reset()


def _store(client: Client, files: dict[str, bytes]) -> str:
    url = f'{client.root}/{uuid.uuid4().hex[:12]}'
    filesystem, path = resolve_url(url, client.options())
    for name, data in files.items():
        with filesystem.open_output_stream(f'{path}/{name}') as out:
            out.write(data)
    return url


def _many(client: Client) -> str:
    return _store(client, {f'part-{i:03d}.parquet': _parquet(i * ROWS) for i in range(FILES)})


def test_many_footers_are_read_at_once_one_ranged_read_a_file_which_serves_the_row_groups(client):
    url = _many(client)
    store = open_any_store(url, storage_options=client.options())
    assert isinstance(store.filesystem, pa.fs.PyFileSystem)  # the fsspec client, through our handler
    assert type(store.filesystem.handler.fs).__module__.split('.')[0] == client.name
    footers = store_footers(store)
    assert sorted(footer.num_rows for footer in footers.values()) == [ROWS] * FILES
    assert len(store.reads.data_files.known_footers) == FILES  # read together, before any single read
    client.proxy.reset()
    with make_batch_reader(url, storage_options=client.options(through_proxy=True), reader_pool_type='thread',
                           workers_count=4) as reader:
        ids = [int(i) for batch in reader for i in batch.id]
    assert sorted(ids) == list(range(FILES * ROWS))
    reads = client.reads_of_data_files()
    # Each file's end is read once (the whole of a small file) and serves both its footer and its row group.
    assert len(reads) == FILES, [r.path for r in reads]
    assert len({r.path.split('?')[0] for r in reads}) == FILES


def test_an_object_rewritten_after_the_listing_is_refused_naming_its_url(client):
    url = _many(client)
    store = open_any_store(url, storage_options=client.options())
    rewritten = _parquet(5 * ROWS, tag='b')
    assert len(rewritten) == len(_parquet(5 * ROWS))  # the listed size still holds: only the version tells
    filesystem, path = resolve_url(url, client.options())
    with filesystem.open_output_stream(f'{path}/part-005.parquet') as out:
        out.write(rewritten)
    with pytest.raises(DataFileChangedError) as raised:
        store_footers(store)
    assert f'{url}/part-005.parquet' in str(raised.value)
