"""s3:// against a real S3-compatible HTTP server on loopback (moto's server mode), through a fault-injecting proxy:
reading, and failing clearly.

The datasets are written with our writer and read back with both readers and both pool kinds, with
``storage_options`` carrying the endpoint. The proxy logs every request, which shows that reads are byte ranges,
and injects 503s, dropped connections and cut bodies, which the reads survive with every row delivered once.
Refused credentials and endpoints fail at once, naming the URL and never the secret. The server, the proxy and
the dataset are fixtures of ``tests/storage/conftest.py``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import ScalarCodec
from petastorm.errors import StorageCredentialsError, StorageError, StoragePermissionError
from petastorm.unischema import Unischema, UnischemaField
from support.s3_datasets import ROWS, S3Schema, read_ids, s3_row
from support.s3_loopback import BUCKET, SECRET_KEY, FaultPlan, MotoServer

s3fs = pytest.importorskip('s3fs')
pytest.importorskip('moto')

WIDE_ROWS = 40_000

WideSchema = Unischema('WideSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    *(UnischemaField(f'x{i}', np.float64, (), ScalarCodec(pa.float64()), False) for i in range(4)),
])


@pytest.fixture(scope='session')
def wide_dataset(moto):
    """A scalar store on S3 with one file of several row groups and five columns of about 320 KB each."""
    url = f's3://{BUCKET}/wide-dataset'
    rng = np.random.default_rng(0)
    table = pa.table({'id': np.arange(WIDE_ROWS), **{f'x{i}': rng.random(WIDE_ROWS) for i in range(4)}})
    result = write_dataset(url, WideSchema, table, row_group_size_mb=0.5, compression=None,
                           storage_options=moto.storage_options())
    assert len(result.files) == 1
    return url


@pytest.mark.parametrize('pool', ['thread', 'process'])
@pytest.mark.parametrize('reader', ['make_reader', 'make_batch_reader'])
@pytest.mark.filterwarnings('ignore:Please use make_reader')
def test_written_dataset_reads_back_through_every_reader_and_pool(moto, clean_proxy, s3_dataset, reader, pool):
    ids = read_ids(s3_dataset, moto.storage_options(clean_proxy.endpoint), reader, pool)
    assert sorted(ids) == list(range(ROWS))
    assert clean_proxy.requests  # the reads went over HTTP, through the proxy


def test_rows_decode_identically_from_s3(moto, s3_dataset):
    with make_reader(s3_dataset, storage_options=moto.storage_options(), reader_pool_type='dummy',
                     shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert [row.id for row in rows] == list(range(ROWS))
    for row in rows:
        assert row.label == f'row-{row.id}'
        np.testing.assert_array_equal(row.matrix, np.full((4, 8), row.id, np.float32))


@pytest.mark.filterwarnings('ignore:Please use make_reader')
@pytest.mark.parametrize('client', ['pyarrow', 's3fs'])
def test_column_projection_fetches_byte_ranges_not_whole_files(moto, clean_proxy, wide_dataset, client):
    options = moto.storage_options(clean_proxy.endpoint)
    if client == 's3fs':
        options['config_kwargs'] = {'read_timeout': 60}  # an option only s3fs takes
    with make_batch_reader(wide_dataset, schema_fields=['x2'], storage_options=options, reader_pool_type='thread',
                           workers_count=2) as reader:
        assert sum(len(batch.x2) for batch in reader) == WIDE_ROWS
    data = [r for r in clean_proxy.requests if r.method == 'GET' and r.path.split('?')[0].endswith('.parquet')]
    assert data
    assert all(r.range is not None for r in data), [r for r in data if r.range is None]
    size = s3fs.S3FileSystem(**moto.storage_options(), skip_instance_cache=True).size(
        f'{wide_dataset[5:]}/{data[0].path.split("?")[0].rsplit("/", 1)[1]}')
    fetched = sum(r.body_bytes for r in data)
    assert fetched < 0.35 * size, f'fetched {fetched} bytes of a {size}-byte file to read one column of five'
    # The footer is read once; s3fs's tail read asks for one byte past the listed end (a file that grew since would
    # answer with it), pyarrow's client reads up to the last byte.
    last = size if client == 's3fs' else size - 1
    tails = [r for r in data if re.fullmatch(rf'bytes=\d+-{last}', r.range)]
    assert len(tails) == 1, f'the footer was fetched {len(tails)} times'


@pytest.mark.parametrize(('reader', 'pool'), [
    ('make_reader', 'thread'),
    ('make_reader', 'process'),
    ('make_batch_reader', 'thread'),
])
@pytest.mark.filterwarnings('ignore:Please use make_reader')
def test_reads_survive_503s_dropped_connections_and_cut_bodies(moto, clean_proxy, s3_dataset, reader, pool):
    clean_proxy.reset(FaultPlan(every=2, kinds=('503', 'drop', 'truncate')))
    ids = read_ids(s3_dataset, moto.storage_options(clean_proxy.endpoint), reader, pool)
    assert sorted(ids) == list(range(ROWS))  # every row, exactly once
    assert set(clean_proxy.plan.injected) == {'503', 'drop', 'truncate'}, clean_proxy.plan.injected


def test_our_retries_recover_when_the_s3_client_does_not_retry(moto, clean_proxy, s3_dataset):
    clean_proxy.reset(FaultPlan(kinds=('500',), methods=('GET',), first_try_only=True))
    options = moto.storage_options(clean_proxy.endpoint, config_kwargs={'retries': {'max_attempts': 1}})
    assert sorted(read_ids(s3_dataset, options, 'make_reader', 'thread')) == list(range(ROWS))
    assert clean_proxy.plan.injected['500'] > 0


def test_missing_paths_are_file_not_found_naming_the_url(moto):
    options = moto.storage_options()
    for url in (f's3://{BUCKET}/no-such-dataset', 's3://no-such-bucket/dataset'):
        with pytest.raises(FileNotFoundError, match=re.escape(url)):
            make_reader(url, storage_options=options)


@pytest.fixture(scope='module')
def strict_moto():
    """A second server that checks credentials: it knows no key, so every request is refused."""
    with MotoServer(enforce_auth=True) as server:
        yield server


def _assert_secret_hidden(error: BaseException) -> None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        assert SECRET_KEY not in f'{error!s} {error!r} {error.args!r}', f'secret shown by {type(error).__name__}'
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def test_refused_credentials_are_a_clear_error_without_the_secret(strict_moto):
    url = f's3://{BUCKET}/dataset'
    options = strict_moto.storage_options()
    with pytest.raises(PermissionError, match=re.escape(url)) as raised:
        make_reader(url, storage_options=options)
    assert isinstance(raised.value, (StorageCredentialsError, StoragePermissionError))
    assert 'credentials' in str(raised.value)
    _assert_secret_hidden(raised.value)
    with pytest.raises(StorageCredentialsError, match='refused the credentials') as raised:
        make_batch_reader(f's3://{BUCKET}/', storage_options=options).stop()
    assert 'InvalidAccessKeyId' in str(raised.value)
    _assert_secret_hidden(raised.value)
    with pytest.raises(OSError, match=re.escape(url)) as raised:
        write_dataset(url, S3Schema, (s3_row(i) for i in range(3)), storage_options=options)
    _assert_secret_hidden(raised.value)


def test_unreachable_endpoint_fails_with_the_url_and_without_the_secret(moto):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]  # nothing listens there once the socket is closed
    options = moto.storage_options(f'http://127.0.0.1:{port}', config_kwargs={'retries': {'max_attempts': 1}})
    with pytest.raises(StorageError, match=re.escape(f's3://{BUCKET}/dataset')) as raised:
        make_reader(f's3://{BUCKET}/dataset', storage_options=options)
    _assert_secret_hidden(raised.value)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


_OPENERS = {
    'make_reader': lambda url, options: make_reader(url, storage_options=options),
    'make_batch_reader': lambda url, options: make_batch_reader(url, storage_options=options),
    'write_dataset': lambda url, options: write_dataset(url, S3Schema, (s3_row(i) for i in range(3)),
                                                       storage_options=options),
}


@pytest.mark.parametrize('call', sorted(_OPENERS))
def test_a_refused_endpoint_fails_at_once_with_the_client_s_own_retries_on(moto, call):
    endpoint = f'http://127.0.0.1:{_closed_port()}'
    options = moto.storage_options(endpoint)  # botocore's retries as configured by default
    url = f's3://{BUCKET}/dataset'
    started = time.monotonic()
    with pytest.raises(StorageError, match=re.escape(f'cannot reach {url}: the S3 endpoint {endpoint} refused the '
                                                     f'connection')) as raised:
        _OPENERS[call](url, options)
    assert time.monotonic() - started < 5
    _assert_secret_hidden(raised.value)


@pytest.mark.parametrize('call', ['make_batch_reader', 'write_dataset'])
def test_an_https_endpoint_for_an_http_server_is_a_configuration_error_at_once(moto, call):
    # Before, the clients retried the failed TLS handshakes for a minute and said "try again later".
    https = moto.endpoint.replace('http://', 'https://')
    started = time.monotonic()
    with pytest.raises(StorageError, match=re.escape(f'the S3 endpoint {https} does not speak TLS')) as raised:
        _OPENERS[call](f's3://{BUCKET}/dataset', moto.storage_options(https))
    assert f"use endpoint_url '{moto.endpoint}'" in str(raised.value)
    assert time.monotonic() - started < 5
    _assert_secret_hidden(raised.value)


def test_a_refused_connection_is_not_retried_by_our_layer(moto, caplog):
    endpoint = f'http://127.0.0.1:{_closed_port()}'
    fs = s3fs.S3FileSystem(**moto.storage_options(endpoint, config_kwargs={'retries': {'total_max_attempts': 1}}),
                           skip_instance_cache=True)
    with caplog.at_level('WARNING', logger='petastorm'), \
            pytest.raises(StorageError, match='refused the connection.*Nothing listens at that address'):
        make_reader(f's3://{BUCKET}/dataset', filesystem=fs)  # a given filesystem: no check of the endpoint first
    assert 'retry' not in caplog.text


def test_each_retry_is_a_warning_naming_the_url(moto, clean_proxy, s3_dataset, caplog):
    clean_proxy.reset(FaultPlan(kinds=('500',), methods=('GET',), first_try_only=True))
    # botocore's max_attempts counts retries; total_max_attempts=1 leaves every retry to our layer.
    options = moto.storage_options(clean_proxy.endpoint, config_kwargs={'retries': {'total_max_attempts': 1}})
    with caplog.at_level('WARNING', logger='petastorm.fs'):
        assert sorted(read_ids(s3_dataset, options, 'make_reader', 'dummy')) == list(range(ROWS))
    retries = [r for r in caplog.records if 'failed with a transient error' in r.getMessage()]
    assert retries
    assert all(r.levelname == 'WARNING' for r in retries)
    assert all(s3_dataset in r.getMessage() for r in retries)
    assert SECRET_KEY not in caplog.text


@pytest.mark.slow
def test_storage_benchmark_prints_the_s3_to_local_ratio():
    script = Path(__file__).resolve().parents[3] / 'benchmarks' / 'storage_bench.py'
    completed = subprocess.run([sys.executable, str(script), '--quick'], capture_output=True, text=True,
                               timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr
    match = re.search(r'^s3 / local time ratio: (\d+\.\d+)', completed.stdout, re.MULTILINE)
    assert match, completed.stdout
    assert float(match.group(1)) > 0
