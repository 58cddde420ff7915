"""Throttling met with patience and fewer requests at once: the loopback S3 server refuses past a request rate.

A busy object store answers ``503 SlowDown`` (S3) or ``429`` for a while when asked too much at once. A reader
planning a store of many files sends a storm of footer reads; it must wait the throttling out, send fewer requests
at once while it lasts, and deliver every row once, never fail the job.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.fs._errors import is_throttling, is_transient
from petastorm.fs._throttle import AdaptiveLimit, limit_for
from petastorm.test_util.s3_server import S3DirectoryServer

pytest.importorskip('s3fs')

BUCKET = 'throttled'
FILES = 40
ROWS = 10


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp('objects')
    directory = os.path.join(str(root), BUCKET, 'many')
    os.makedirs(directory)
    for index in range(FILES):
        pq.write_table(pa.table({'x': np.arange(index * ROWS, (index + 1) * ROWS)}),
                       os.path.join(directory, f'part-{index:03d}.parquet'))
    with S3DirectoryServer(str(root)) as running:
        yield running


def test_the_limit_halves_on_throttling_and_grows_back_one_at_a_time():
    limit = AdaptiveLimit(ceiling=16)
    limit.throttled()
    assert limit.limit == 8
    limit.throttled()  # the same burst of refusals: counted, not halved again
    assert (limit.limit, limit.throttled_count) == (8, 2)
    time.sleep(0.25)
    limit.throttled()
    assert limit.limit == 4
    assert limit.lowest == 4
    for _ in range(4):
        limit.succeeded()
    assert limit.limit == 5
    for _ in range(200):
        limit.succeeded()
    assert limit.limit == 16  # back to its ceiling, never past it


def test_no_more_requests_than_the_limit_are_on_their_way_at_once():
    limit = AdaptiveLimit(ceiling=3)
    active, most = [0], [0]
    lock = threading.Lock()

    def request():
        with limit.slot(), limit.slot():  # a request made while making another takes no second slot
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.01)
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 3


def test_throttling_is_told_from_other_transient_errors():
    from botocore.exceptions import ClientError

    slow_down = ClientError({'Error': {'Code': 'SlowDown', 'Message': 'Please reduce your request rate.'},
                             'ResponseMetadata': {'HTTPStatusCode': 503}}, 'GetObject')
    too_many = ClientError({'Error': {'Code': 'TooManyRequests'}, 'ResponseMetadata': {'HTTPStatusCode': 429}},
                           'GetObject')
    assert is_throttling(slow_down)
    assert is_throttling(too_many)
    assert is_throttling(OSError('AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.'))
    assert is_transient(ConnectionResetError('reset'))
    assert not is_throttling(ConnectionResetError('reset'))


def _client(server, client: str) -> dict:
    if client == 'options':  # pyarrow's own S3 client, its own retries off: ours meet every refusal
        return {'storage_options': server.storage_options(config_kwargs={'retries': {'total_max_attempts': 1}})}
    import s3fs

    return {'filesystem': s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options(
        config_kwargs={'retries': {'total_max_attempts': 1}}))}


@pytest.mark.parametrize(('client', 'status'), [('options', 503), ('options', 429), ('s3fs', 503)])
def test_a_throttling_store_is_planned_and_read_with_every_row_once(server, client, status, monkeypatch):
    monkeypatch.setattr('petastorm.fs._throttle._LIMITS', {})  # this test's limit, from its ceiling
    limit = limit_for('s3', BUCKET)
    server.reset_stats()
    server.throttle(150, burst=10, status=status)
    try:
        with make_batch_reader(f's3://{BUCKET}/many', reader_pool_type='thread', workers_count=4,
                               **_client(server, client)) as reader:
            values = sorted(int(v) for batch in reader for v in batch.x)
    finally:
        server.throttle(None)
    stats = server.stats()
    assert values == list(range(FILES * ROWS))  # nothing lost, nothing doubled
    assert stats.throttled > 0  # the storm was refused, and waited out
    if client == 'options':  # (s3fs retries throttled requests itself, out of our sight)
        assert limit.throttled_count > 0
        assert limit.lowest < limit.ceiling
