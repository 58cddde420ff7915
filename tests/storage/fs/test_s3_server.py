"""The loopback S3 server and the delay proxy of petastorm.test_util, driven by the clients users have.

pyarrow's ``S3FileSystem`` (``endpoint_override``, ``scheme='http'``), s3fs and plain HTTP requests check what the
server answers (objects, ranges, listings, writes, errors, counters); the proxy is checked to add at least the
latency and bandwidth limits it is configured with (lower bounds only: a loaded machine only adds time). Then a
petastorm store is read through both readers from ``s3://`` URLs and compared with the same store read from disk.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.test_util.delay_proxy import DelayProxy
from petastorm.test_util.s3_server import S3DirectoryServer
from petastorm.unischema import Unischema, UnischemaField

s3fs = pytest.importorskip('s3fs')

from support.s3_loopback import arrow_s3  # noqa: E402

BUCKET = 'bucket'
PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes whose every offset is recognisable
ROWS = 120

StoreSchema = Unischema('StoreSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('matrix', np.float32, (3, 5), NdarrayCodec(), False),
])


def _row(i: int) -> dict:
    return {'id': i, 'label': f'label-{i}', 'matrix': np.full((3, 5), i / 7, np.float32)}


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp('objects')
    with S3DirectoryServer(str(root), buckets=(BUCKET,)) as running:
        yield running


@pytest.fixture
def objects(server):
    """The bucket's directory, emptied before the test; the server's counters reset."""
    directory = os.path.join(server.root, BUCKET)
    for dirpath, dirnames, filenames in os.walk(directory, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            os.rmdir(os.path.join(dirpath, name))
    server.reset_stats()
    return directory


def _put_file(directory: str, key: str, data: bytes) -> None:
    path = os.path.join(directory, *key.split('/'))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as out:
        out.write(data)


def _request(port: int, method: str, target: str, headers: dict | None = None,
             body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
    try:
        connection.request(method, target, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _s3fs(endpoint: str) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(key='k', secret='s', endpoint_url=endpoint, skip_instance_cache=True,
                             use_listings_cache=False)


# -- objects --------------------------------------------------------------------------------------------------------


def test_pyarrow_reads_objects_and_byte_ranges(server, objects):
    _put_file(objects, 'dir/payload.bin', PAYLOAD)
    fs = arrow_s3(server.endpoint)
    info = fs.get_file_info(f'{BUCKET}/dir/payload.bin')
    assert (info.type, info.size) == (pafs.FileType.File, len(PAYLOAD))
    with fs.open_input_file(f'{BUCKET}/dir/payload.bin') as f:
        assert f.size() == len(PAYLOAD)
        assert f.read_at(100, 5000) == PAYLOAD[5000:5100]
        assert f.read_at(10, len(PAYLOAD) - 10) == PAYLOAD[-10:]
    with fs.open_input_stream(f'{BUCKET}/dir/payload.bin') as f:
        assert f.read() == PAYLOAD
    stats = server.stats()
    assert stats.ranged_gets >= 2
    assert stats.requests['GET'] >= 3
    assert stats.bytes_sent >= 100 + 10 + len(PAYLOAD)
    assert fs.get_file_info(f'{BUCKET}/dir/absent.bin').type == pafs.FileType.NotFound


def test_s3fs_reads_objects_and_byte_ranges(server, objects):
    _put_file(objects, 'payload.bin', PAYLOAD)
    fs = _s3fs(server.endpoint)
    assert fs.info(f'{BUCKET}/payload.bin')['size'] == len(PAYLOAD)
    assert fs.cat_file(f'{BUCKET}/payload.bin', start=300, end=777) == PAYLOAD[300:777]
    assert fs.cat_file(f'{BUCKET}/payload.bin', start=-7) == PAYLOAD[-7:]
    assert fs.cat_file(f'{BUCKET}/payload.bin') == PAYLOAD
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f'{BUCKET}/absent.bin')


@pytest.mark.parametrize(('header', 'start', 'stop'), [
    ('bytes=10-19', 10, 20),
    ('bytes=10240-', None, None),  # starts at the end: unsatisfiable
    ('bytes=10000-', 10000, 10240),
    ('bytes=-16', 10224, 10240),
    ('bytes=0-999999', 0, 10240),  # an end past the object is cut to it
    ('bytes=-0', None, None),
])
def test_range_answers_follow_http(server, objects, header, start, stop):
    _put_file(objects, 'r.bin', PAYLOAD)
    status, headers, body = _request(server.port, 'GET', f'/{BUCKET}/r.bin', {'Range': header})
    if start is None:
        assert status == 416
        assert headers['content-range'] == f'bytes */{len(PAYLOAD)}'
        assert b'<Code>InvalidRange</Code>' in body
        return
    assert status == 206
    assert headers['content-range'] == f'bytes {start}-{stop - 1}/{len(PAYLOAD)}'
    assert body == PAYLOAD[start:stop]


def test_head_get_etags_and_errors(server, objects):
    _put_file(objects, 'e.bin', PAYLOAD)
    status, head, body = _request(server.port, 'HEAD', f'/{BUCKET}/e.bin')
    assert (status, body, int(head['content-length'])) == (200, b'', len(PAYLOAD))
    etag = head['etag']
    assert _request(server.port, 'GET', f'/{BUCKET}/e.bin', {'If-Match': etag})[0] == 200
    status, _, body = _request(server.port, 'GET', f'/{BUCKET}/e.bin', {'If-Match': '"another"', 'Range': 'bytes=0-9'})
    assert status == 412
    assert b'<Code>PreconditionFailed</Code>' in body
    assert _request(server.port, 'GET', f'/{BUCKET}/e.bin', {'If-None-Match': etag})[0] == 304
    # An object rewritten in place gets another ETag, so a reader holding the old one notices.
    time.sleep(0.01)
    _put_file(objects, 'e.bin', PAYLOAD[::-1])
    assert _request(server.port, 'HEAD', f'/{BUCKET}/e.bin')[1]['etag'] != etag
    status, _, body = _request(server.port, 'GET', f'/{BUCKET}/absent.bin')
    assert (status, b'<Code>NoSuchKey</Code>' in body) == (404, True)
    status, _, body = _request(server.port, 'GET', '/no-such-bucket/key')
    assert (status, b'<Code>NoSuchBucket</Code>' in body) == (404, True)
    assert _request(server.port, 'HEAD', '/no-such-bucket')[0] == 404
    assert _request(server.port, 'GET', f'/{BUCKET}/../../etc/passwd')[0] in (400, 404)
    status, _, body = _request(server.port, 'POST', f'/{BUCKET}/e.bin?restore')
    assert (status, b'NotImplemented' in body) == (501, True)


# -- listing --------------------------------------------------------------------------------------------------------


def _list_v2(port: int, **query: str) -> ElementTree.Element:
    target = f'/{BUCKET}?list-type=2&' + '&'.join(f'{k.replace("_", "-")}={v}' for k, v in query.items())
    status, _, body = _request(port, 'GET', target)
    assert status == 200, body
    return ElementTree.fromstring(body)


def _texts(element: ElementTree.Element, path: str) -> list[str]:
    """The texts at ``Tag`` or ``Parent/Child`` in a listing answer."""
    ns = '{http://s3.amazonaws.com/doc/2006-03-01/}'
    outer, _, inner = path.partition('/')
    return [(e.find(ns + inner) if inner else e).text for e in element.iter(ns + outer)]


KEYS = sorted([f'data/part-{i:02d}.parquet' for i in range(23)] + ['data/_common_metadata', 'data/x=1/a.parquet',
                                                                    'data/x=2/b.parquet', 'other/z.bin', 'top.bin'])


def test_list_objects_v2_prefix_delimiter_and_continuation(server, objects):
    for key in KEYS:
        _put_file(objects, key, b'k')
    seen, token, pages = [], None, 0
    while True:
        page = _list_v2(server.port, prefix='data/', max_keys='10',
                        **({'continuation_token': token} if token else {}))
        seen += _texts(page, 'Contents/Key')
        pages += 1
        truncated = page.find('{http://s3.amazonaws.com/doc/2006-03-01/}IsTruncated').text == 'true'
        if not truncated:
            break
        token = page.find('{http://s3.amazonaws.com/doc/2006-03-01/}NextContinuationToken').text
    assert seen == [k for k in KEYS if k.startswith('data/')]
    assert pages == 3
    page = _list_v2(server.port, prefix='data/', delimiter='/')
    assert _texts(page, 'CommonPrefixes/Prefix') == ['data/x=1/', 'data/x=2/']
    assert _texts(page, 'Contents/Key') == [k for k in KEYS if k.startswith('data/') and k.count('/') == 1]
    page = _list_v2(server.port, delimiter='/')
    assert _texts(page, 'CommonPrefixes/Prefix') == ['data/', 'other/']
    assert _texts(page, 'Contents/Key') == ['top.bin']
    # Common prefixes count against max-keys and are not repeated on the next page.
    first = _list_v2(server.port, delimiter='/', max_keys='1')
    second = _list_v2(server.port, delimiter='/', max_keys='5', continuation_token=_texts(
        first, 'NextContinuationToken')[0])
    assert _texts(first, 'CommonPrefixes/Prefix') == ['data/']
    assert _texts(second, 'CommonPrefixes/Prefix') == ['other/']
    assert _texts(_list_v2(server.port, start_after='data/x=2/b.parquet'), 'Contents/Key') == ['other/z.bin',
                                                                                             'top.bin']
    assert server.stats().requests['LIST'] == pages + 5


def test_listings_agree_with_the_directory_through_pyarrow_and_s3fs(server, objects):
    for key in KEYS:
        _put_file(objects, key, b'k' * 3)
    arrow = arrow_s3(server.endpoint)
    infos = arrow.get_file_info(pafs.FileSelector(f'{BUCKET}/data', recursive=True))
    assert sorted(i.path for i in infos if i.type == pafs.FileType.File) == [
        f'{BUCKET}/{k}' for k in KEYS if k.startswith('data/')]
    assert {i.path for i in infos if i.type == pafs.FileType.Directory} == {f'{BUCKET}/data/x=1',
                                                                           f'{BUCKET}/data/x=2'}
    assert arrow.get_file_info(f'{BUCKET}/data').type == pafs.FileType.Directory
    fs = _s3fs(server.endpoint)
    assert fs.find(f'{BUCKET}/data') == [f'{BUCKET}/{k}' for k in KEYS if k.startswith('data/')]
    assert sorted(fs.ls(f'{BUCKET}')) == [f'{BUCKET}/data', f'{BUCKET}/other', f'{BUCKET}/top.bin']
    assert fs.info(f'{BUCKET}/data/x=1')['type'] == 'directory'
    listed = {entry['name']: entry for entry in fs.ls(f'{BUCKET}/data', detail=True)}
    head = fs.info(f'{BUCKET}/data/part-00.parquet')
    assert listed[f'{BUCKET}/data/part-00.parquet']['ETag'] == head['ETag']  # one ETag for listing and HEAD


# -- writes ---------------------------------------------------------------------------------------------------------


def test_writes_of_pyarrow_and_s3fs_land_in_the_directory(server, objects):
    arrow = arrow_s3(server.endpoint)
    with arrow.open_output_stream(f'{BUCKET}/w/arrow.bin') as out:  # pyarrow always uploads in parts
        out.write(PAYLOAD)
    fs = _s3fs(server.endpoint)
    fs.pipe(f'{BUCKET}/w/s3fs-small.bin', PAYLOAD)  # one PUT
    big = np.random.default_rng(0).integers(0, 255, 6 << 20, dtype=np.uint8).tobytes()
    with fs.open(f'{BUCKET}/w/s3fs-big.bin', 'wb', block_size=5 << 20) as out:  # two parts
        out.write(big)
    for name, data in [('arrow.bin', PAYLOAD), ('s3fs-small.bin', PAYLOAD), ('s3fs-big.bin', big)]:
        with open(os.path.join(objects, 'w', name), 'rb') as f:
            assert f.read() == data, name
    assert server.stats().requests['PUT'] >= 1 + 3 + 3  # the small PUT; create, part(s) and complete, twice
    # The ETag a PUT answers is the one later reads see.
    status, headers, _ = _request(server.port, 'PUT', f'/{BUCKET}/w/raw.bin', body=b'raw body')
    assert status == 200
    assert _request(server.port, 'HEAD', f'/{BUCKET}/w/raw.bin')[1]['etag'] == headers['etag']
    fs.copy(f'{BUCKET}/w/raw.bin', f'{BUCKET}/w/copied/raw.bin')  # CopyObject, what a staged write's move sends
    arrow.copy_file(f'{BUCKET}/w/raw.bin', f'{BUCKET}/w/copied/by-arrow.bin')
    assert fs.cat(f'{BUCKET}/w/copied/raw.bin') == fs.cat(f'{BUCKET}/w/copied/by-arrow.bin') == b'raw body'
    arrow.delete_file(f'{BUCKET}/w/arrow.bin')
    fs.rm([f'{BUCKET}/w/s3fs-small.bin', f'{BUCKET}/w/s3fs-big.bin', f'{BUCKET}/w/copied/raw.bin',
           f'{BUCKET}/w/copied/by-arrow.bin'])
    assert sorted(os.listdir(os.path.join(objects, 'w'))) in (['raw.bin'], ['copied', 'raw.bin'])
    assert fs.find(f'{BUCKET}/w') == [f'{BUCKET}/w/raw.bin']
    assert not os.path.exists(os.path.join(server.root, '.s3tmp-uploads')) or not os.listdir(
        os.path.join(server.root, '.s3tmp-uploads'))  # no part left behind


def test_an_aborted_or_unknown_upload_leaves_nothing(server, objects):
    status, _, body = _request(server.port, 'POST', f'/{BUCKET}/u.bin?uploads')
    assert status == 200
    upload = re.search(rb'<UploadId>(\w+)</UploadId>', body).group(1).decode()
    assert _request(server.port, 'PUT', f'/{BUCKET}/u.bin?partNumber=1&uploadId={upload}', body=b'part')[0] == 200
    assert _request(server.port, 'DELETE', f'/{BUCKET}/u.bin?uploadId={upload}')[0] == 204
    status, _, body = _request(server.port, 'POST', f'/{BUCKET}/u.bin?uploadId={upload}',
                               body=b'<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part>'
                                    b'</CompleteMultipartUpload>')
    assert (status, b'NoSuchUpload' in body) == (404, True)
    assert not os.path.exists(os.path.join(objects, 'u.bin'))


# -- counters -------------------------------------------------------------------------------------------------------


def test_counters_count_requests_and_body_bytes_and_the_stats_endpoint_resets_them(server, objects):
    _put_file(objects, 'c.bin', PAYLOAD)
    _request(server.port, 'GET', f'/{BUCKET}/c.bin', {'Range': 'bytes=0-99'})
    _request(server.port, 'GET', f'/{BUCKET}/c.bin')
    _request(server.port, 'HEAD', f'/{BUCKET}/c.bin')
    _request(server.port, 'GET', f'/{BUCKET}?list-type=2')
    status, _, body = _request(server.port, 'GET', '/_stats')
    expected = {'requests': {'GET': 2, 'HEAD': 1, 'LIST': 1}, 'bytes_sent': 100 + len(PAYLOAD), 'ranged_gets': 1,
                'total_requests': 4, 'objects': {f'{BUCKET}/c.bin': 3}, 'throttled': 0}
    assert (status, json.loads(body)) == (200, expected)
    assert json.loads(_request(server.port, 'POST', '/_stats')[2]) == expected  # read and reset
    assert server.stats().total_requests == 0


def test_the_server_runs_as_a_process_and_prints_its_endpoint(tmp_path):
    (tmp_path / BUCKET).mkdir()
    (tmp_path / BUCKET / 'p.bin').write_bytes(PAYLOAD)
    process = subprocess.Popen([sys.executable, '-m', 'petastorm.test_util.s3_server', '--root', str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        port = int(re.fullmatch(r'listening on http://127\.0\.0\.1:(\d+)\n', line).group(1))
        assert _request(port, 'GET', f'/{BUCKET}/p.bin', {'Range': 'bytes=5-9'})[2] == PAYLOAD[5:10]
        assert json.loads(_request(port, 'GET', '/_stats')[2])['bytes_sent'] == 5
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


def test_the_server_started_as_docs_storage_md_says_serves_its_blocks(tmp_path):
    import socket

    from petastorm import make_reader, write_dataset
    from support.feature_store import Schema, feature_row

    with socket.socket() as probe:  # the page's --port 9000, on a free port here
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, '-m', 'petastorm.test_util.s3_server', '--root', str(tmp_path),
                                '--port', str(port), '--bucket', 'bucket'], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == f'listening on http://127.0.0.1:{port}\n'
        s3 = {'key': 'AKIA...', 'secret': '...', 'endpoint_url': f'http://127.0.0.1:{port}'}  # any key is taken
        write_dataset('s3://bucket/ds', Schema, [feature_row(0)], storage_options=s3)
        with make_reader('s3://bucket/ds', storage_options=s3) as reader:
            assert sum(1 for _ in reader) == 1
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


# -- the delay proxy ------------------------------------------------------------------------------------------------

DELAY = 0.04


def _timed_heads(port: int, count: int) -> list[float]:
    """Seconds of each of ``count`` HEAD requests on one connection (the first one opens it)."""
    connection = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
    seconds = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            connection.request('HEAD', f'/{BUCKET}/d.bin')
            response = connection.getresponse()
            response.read()
            seconds.append(time.perf_counter() - started)
            assert response.status == 200
    finally:
        connection.close()
    return seconds


def test_the_proxy_adds_its_one_way_delay_to_each_direction_and_a_round_trip_to_connecting(server, objects):
    _put_file(objects, 'd.bin', PAYLOAD)
    with DelayProxy(('127.0.0.1', server.port), delay=DELAY) as proxy:
        first, *others = _timed_heads(proxy.port, 3)
        stats = proxy.stats()
    assert first >= 4 * DELAY  # the handshake's round trip, then the request's
    assert min(others) >= 2 * DELAY  # an open connection: one round trip per request
    assert stats.connections == 1
    assert stats.bytes_up > 0
    assert stats.bytes_down > 0


def test_the_proxy_caps_bandwidth_and_the_window_of_a_connection(server, objects):
    size = 600_000
    _put_file(objects, 'big.bin', bytes(size))
    with DelayProxy(('127.0.0.1', server.port), bandwidth=2_000_000) as proxy:
        started = time.perf_counter()
        status, _, body = _request(proxy.port, 'GET', f'/{BUCKET}/big.bin')
        capped = time.perf_counter() - started
        assert proxy.stats().bytes_down >= size
    assert (status, len(body)) == (200, size)
    assert capped >= size / 2_000_000
    window, delay = 64 << 10, 0.01
    with DelayProxy(('127.0.0.1', server.port), delay=delay, window=window) as proxy:
        started = time.perf_counter()
        assert len(_request(proxy.port, 'GET', f'/{BUCKET}/big.bin')[2]) == size
        windowed = time.perf_counter() - started
    # At most one window per round trip: the body alone takes size / window - 1 round trips.
    assert windowed >= (size // window - 1) * 2 * delay


def test_the_proxy_delays_pyarrow_and_s3fs_requests(server, objects):
    _put_file(objects, 'd.bin', PAYLOAD)
    with DelayProxy(('127.0.0.1', server.port), delay=DELAY) as proxy:
        arrow = arrow_s3(proxy.endpoint)
        arrow.get_file_info(f'{BUCKET}/d.bin')  # connects
        started = time.perf_counter()
        with arrow.open_input_file(f'{BUCKET}/d.bin') as f:  # a HEAD, then a ranged GET
            assert f.read_at(10, 20) == PAYLOAD[20:30]
        assert time.perf_counter() - started >= 2 * 2 * DELAY
        fs = _s3fs(proxy.endpoint)
        fs.info(f'{BUCKET}/d.bin')
        started = time.perf_counter()
        assert fs.cat_file(f'{BUCKET}/d.bin', start=0, end=4) == PAYLOAD[:4]
        assert time.perf_counter() - started >= 2 * DELAY


def test_the_proxy_refuses_a_negative_delay():
    with pytest.raises(ValueError, match='delay'):
        DelayProxy(('127.0.0.1', 1), delay=-1)


# -- a petastorm store read from s3:// -------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def store(server):
    """A petastorm store written to the server's directory: its s3:// URL and its file:// URL."""
    local = f'file://{server.root}/{BUCKET}-store/ds'
    os.makedirs(f'{server.root}/{BUCKET}-store', exist_ok=True)
    write_dataset(local, StoreSchema, (_row(i) for i in range(ROWS)), row_group_size_mb=0.002, file_size_mb=0.006)
    return f's3://{BUCKET}-store/ds', local


def _rows_of(url: str, **kwargs) -> dict[int, tuple]:
    with make_reader(url, reader_pool_type='thread', workers_count=2, **kwargs) as reader:
        rows = [(int(r.id), str(r.label), r.matrix.copy()) for r in reader]
    assert len(rows) == len({r[0] for r in rows})
    return {r[0]: r for r in rows}


def _batch_ids(url: str, **kwargs) -> list[int]:
    with make_batch_reader(url, reader_pool_type='thread', workers_count=2, schema_fields=['id', 'label'],
                           **kwargs) as reader:
        return sorted(int(i) for batch in reader for i in batch.id)


def _assert_same_rows(remote: dict, local: dict) -> None:
    assert sorted(remote) == sorted(local) == list(range(ROWS))
    for key, (_, label, matrix) in local.items():
        assert remote[key][1] == label
        np.testing.assert_array_equal(remote[key][2], matrix)


@pytest.mark.filterwarnings('ignore:Please use make_reader')
def test_a_store_reads_the_same_from_s3_through_storage_options_and_pyarrow(server, store):
    remote_url, local_url = store
    local = _rows_of(local_url)
    server.reset_stats()
    _assert_same_rows(_rows_of(remote_url, storage_options=server.storage_options()), local)
    assert server.stats().ranged_gets > 0
    _assert_same_rows(_rows_of(remote_url, filesystem=arrow_s3(server.endpoint)), local)
    assert _batch_ids(remote_url, storage_options=server.storage_options()) == list(range(ROWS))
    assert _batch_ids(remote_url, filesystem=arrow_s3(server.endpoint)) == list(range(ROWS))


@pytest.mark.filterwarnings('ignore:Please use make_reader')
def test_a_store_written_to_s3_through_the_proxy_reads_back(server, store):
    _, local_url = store
    with DelayProxy(('127.0.0.1', server.port), delay=0.002) as proxy:
        options = server.storage_options(proxy.endpoint)
        url = f's3://{BUCKET}/written'
        write_dataset(url, StoreSchema, (_row(i) for i in range(ROWS)), row_group_size_mb=0.002,
                      file_size_mb=0.006, storage_options=options, mode='overwrite')
        assert os.path.isfile(os.path.join(server.root, BUCKET, 'written', '_common_metadata'))
        _assert_same_rows(_rows_of(url, storage_options=options), _rows_of(local_url))
        assert proxy.stats().bytes_down > 0
