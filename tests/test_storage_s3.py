"""s3:// against a real S3-compatible HTTP server on loopback (moto's server mode), through a fault-injecting proxy.

The datasets are written with our writer and read back with both readers and both pool kinds, with
``storage_options`` carrying the endpoint. The proxy logs every request, which shows that reads are byte ranges,
and injects 503s, dropped connections and cut bodies, which the reads survive with every row delivered once.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.errors import StorageCredentialsError, StorageError, StoragePermissionError
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url
from petastorm.fs_utils import FilesystemResolver, get_filesystem_and_path_or_paths
from petastorm.unischema import Unischema, UnischemaField

s3fs = pytest.importorskip('s3fs')
pytest.importorskip('moto')

from support.conftest_s3 import BUCKET, SECRET_KEY, FaultPlan, FaultProxy, MotoServer  # noqa: E402

ROWS = 300
WIDE_ROWS = 40_000

Schema = Unischema('S3Schema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('matrix', np.float32, (4, 8), NdarrayCodec(), False),
])

WideSchema = Unischema('WideSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    *(UnischemaField(f'x{i}', np.float64, (), ScalarCodec(pa.float64()), False) for i in range(4)),
])


def _row(i: int) -> dict:
    return {'id': i, 'label': f'row-{i}', 'matrix': np.full((4, 8), i, np.float32)}


@pytest.fixture(scope='session')
def moto():
    with MotoServer() as server:
        s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True).mkdir(BUCKET)
        yield server


@pytest.fixture(scope='session')
def proxy(moto):
    with FaultProxy(moto.port) as running:
        yield running


@pytest.fixture
def clean_proxy(proxy):
    proxy.reset()
    yield proxy
    proxy.reset()


@pytest.fixture(scope='session')
def dataset(moto):
    """A Petastorm dataset on S3: 300 rows in several files and row groups."""
    url = f's3://{BUCKET}/petastorm-dataset'
    result = write_dataset(url, Schema, (_row(i) for i in range(ROWS)), row_group_size_mb=0.005,
                           file_size_mb=0.02, storage_options=moto.storage_options())
    assert len(result.files) > 1
    return url


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


def _read_ids(url: str, options: dict, reader: str, pool: str, **kwargs) -> list[int]:
    if reader == 'make_reader':
        with make_reader(url, storage_options=options, reader_pool_type=pool, workers_count=3, **kwargs) as rows:
            return [int(row.id) for row in rows]
    with make_batch_reader(url, storage_options=options, reader_pool_type=pool, workers_count=3, **kwargs) as batches:
        return [int(i) for batch in batches for i in batch.id]


@pytest.mark.parametrize('pool', ['thread', 'process'])
@pytest.mark.parametrize('reader', ['make_reader', 'make_batch_reader'])
@pytest.mark.filterwarnings('ignore:Please use make_reader')
def test_written_dataset_reads_back_through_every_reader_and_pool(moto, clean_proxy, dataset, reader, pool):
    ids = _read_ids(dataset, moto.storage_options(clean_proxy.endpoint), reader, pool)
    assert sorted(ids) == list(range(ROWS))
    assert clean_proxy.requests  # the reads went over HTTP, through the proxy


def test_rows_decode_identically_from_s3(moto, dataset):
    with make_reader(dataset, storage_options=moto.storage_options(), reader_pool_type='dummy',
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
def test_reads_survive_503s_dropped_connections_and_cut_bodies(moto, clean_proxy, dataset, reader, pool):
    clean_proxy.reset(FaultPlan(every=2, kinds=('503', 'drop', 'truncate')))
    ids = _read_ids(dataset, moto.storage_options(clean_proxy.endpoint), reader, pool)
    assert sorted(ids) == list(range(ROWS))  # every row, exactly once
    assert set(clean_proxy.plan.injected) == {'503', 'drop', 'truncate'}, clean_proxy.plan.injected


def test_our_retries_recover_when_the_s3_client_does_not_retry(moto, clean_proxy, dataset):
    clean_proxy.reset(FaultPlan(kinds=('500',), methods=('GET',), first_try_only=True))
    options = moto.storage_options(clean_proxy.endpoint, config_kwargs={'retries': {'max_attempts': 1}})
    assert sorted(_read_ids(dataset, options, 'make_reader', 'thread')) == list(range(ROWS))
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
        write_dataset(url, Schema, (_row(i) for i in range(3)), storage_options=options)
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
    'write_dataset': lambda url, options: write_dataset(url, Schema, (_row(i) for i in range(3)),
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


def test_a_refused_connection_is_not_retried_by_our_layer(moto, caplog):
    endpoint = f'http://127.0.0.1:{_closed_port()}'
    fs = s3fs.S3FileSystem(**moto.storage_options(endpoint, config_kwargs={'retries': {'total_max_attempts': 1}}),
                           skip_instance_cache=True)
    with caplog.at_level('WARNING', logger='petastorm'), \
            pytest.raises(StorageError, match='refused the connection.*Nothing listens at that address'):
        make_reader(f's3://{BUCKET}/dataset', filesystem=fs)  # a given filesystem: no check of the endpoint first
    assert 'retry' not in caplog.text


def test_each_retry_is_a_warning_naming_the_url(moto, clean_proxy, dataset, caplog):
    clean_proxy.reset(FaultPlan(kinds=('500',), methods=('GET',), first_try_only=True))
    # botocore's max_attempts counts retries; total_max_attempts=1 leaves every retry to our layer.
    options = moto.storage_options(clean_proxy.endpoint, config_kwargs={'retries': {'total_max_attempts': 1}})
    with caplog.at_level('WARNING', logger='petastorm.fs'):
        assert sorted(_read_ids(dataset, options, 'make_reader', 'dummy')) == list(range(ROWS))
    retries = [r for r in caplog.records if 'failed with a transient error' in r.getMessage()]
    assert retries
    assert all(r.levelname == 'WARNING' for r in retries)
    assert all(dataset in r.getMessage() for r in retries)
    assert SECRET_KEY not in caplog.text


def test_storage_options_reach_metadata_and_fs_utils(moto, dataset):
    options = moto.storage_options()
    assert list(get_schema_from_dataset_url(dataset, storage_options=options).fields) == ['id', 'label', 'matrix']
    fs, path = get_filesystem_and_path_or_paths(dataset, storage_options=options)
    assert isinstance(fs, s3fs.S3FileSystem)
    assert fs.exists(f'{path}/_common_metadata')
    resolver = FilesystemResolver(dataset, storage_options=options)
    assert resolver.filesystem().isdir(resolver.get_dataset_path())


def test_filesystem_argument_works_for_writer_and_readers(moto):
    fs = s3fs.S3FileSystem(**moto.storage_options(), skip_instance_cache=True)
    url = f's3://{BUCKET}/written-with-filesystem'
    write_dataset(url, Schema, (_row(i) for i in range(20)), filesystem=fs)
    with make_reader(url, filesystem=fs, reader_pool_type='dummy') as reader:
        assert sorted(row.id for row in reader) == list(range(20))


@pytest.mark.slow
def test_storage_benchmark_prints_the_s3_to_local_ratio():
    script = Path(__file__).resolve().parent.parent / 'benchmarks' / 'storage_bench.py'
    completed = subprocess.run([sys.executable, str(script), '--quick'], capture_output=True, text=True,
                               timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr
    match = re.search(r'^s3 / local time ratio: (\d+\.\d+)', completed.stdout, re.MULTILINE)
    assert match, completed.stdout
    assert float(match.group(1)) > 0


# -- every public API and command-line tool takes storage_options (or a filesystem) for s3:// -------------------


def _s3(moto):
    return s3fs.S3FileSystem(**moto.storage_options(), skip_instance_cache=True)


def _settled_requests(proxy: FaultProxy) -> list:
    """The proxy's request log once it stops growing: it logs each request just after answering it."""
    seen, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 0.1:
        if len(proxy.requests) != seen:
            seen, stable_since = len(proxy.requests), time.monotonic()
        time.sleep(0.01)
    return list(proxy.requests)


def _copy_of(moto, source_url: str, name: str) -> str:
    """A fresh copy of a dataset on the server, for tests that change it."""
    target = f's3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}'
    _s3(moto).copy(source_url, target, recursive=True)
    return target


def test_make_batch_reader_reads_a_list_of_s3_file_urls(moto, dataset):
    files = sorted(f's3://{path}' for path in _s3(moto).glob(f'{dataset}/*.parquet'))
    assert len(files) > 1
    with make_batch_reader(files[:2], storage_options=moto.storage_options(), reader_pool_type='dummy') as reader:
        ids = [int(i) for batch in reader for i in batch.id]
    assert 0 < len(ids) < ROWS
    assert len(set(ids)) == len(ids)


def test_torch_dataloader_reads_s3(moto, dataset):
    pytest.importorskip('torch')
    from petastorm.pytorch import DataLoader

    with DataLoader(make_reader(dataset, storage_options=moto.storage_options(), reader_pool_type='thread',
                                workers_count=2, schema_fields=['id', 'matrix']), batch_size=64) as loader:
        batches = list(loader)
    ids = sorted(int(i) for batch in batches for i in batch['id'])
    assert ids == list(range(ROWS))
    assert tuple(batches[0]['matrix'].shape[1:]) == (4, 8)


def test_local_disk_cache_of_an_s3_dataset_serves_the_second_epoch(moto, clean_proxy, dataset, tmp_path):
    options = moto.storage_options(clean_proxy.endpoint)
    for epoch in range(2):
        clean_proxy.reset()
        with make_reader(dataset, storage_options=options, reader_pool_type='thread', workers_count=2,
                         cache_type='local-disk', cache_location=str(tmp_path), cache_size_limit=10 ** 8,
                         cache_row_size_estimate=1000, cache_extra_settings={'cleanup': False}) as reader:
            assert sorted(int(row.id) for row in reader) == list(range(ROWS))
        data_reads = [r for r in _settled_requests(clean_proxy) if r.method == 'GET' and r.range]
        if epoch == 0:
            first_epoch_reads = len(data_reads)
    assert first_epoch_reads > 0
    # The second reader still reads the metadata, but every row group comes from the disk cache, which the first
    # reader kept (cleanup=False).
    assert len(data_reads) < first_epoch_reads


def test_generate_petastorm_metadata_on_s3_with_storage_options_and_filesystem(moto, dataset):
    from petastorm.etl.petastorm_generate_metadata import generate_petastorm_metadata

    url = _copy_of(moto, dataset, 'regenerated')
    generate_petastorm_metadata(None, url, use_summary_metadata=True, storage_options=moto.storage_options())
    assert _s3(moto).exists(f'{url}/_metadata')
    _s3(moto).rm(f'{url}/_metadata')
    # Through a ready filesystem: the summary file it writes is what shows that the call reached the store.
    generate_petastorm_metadata(None, url, use_summary_metadata=True, filesystem=_s3(moto))
    assert _s3(moto).exists(f'{url}/_metadata')
    assert sorted(_read_ids(url, moto.storage_options(), 'make_reader', 'dummy')) == list(range(ROWS))


def test_generate_metadata_cli_takes_storage_options_from_a_file(moto, dataset, tmp_path, capsys):
    from petastorm.etl.petastorm_generate_metadata import main

    url = _copy_of(moto, dataset, 'cli-regenerated')
    options_file = tmp_path / 'options.json'
    options_file.write_text(json.dumps(moto.storage_options()))
    main(['--dataset_url', url, '--use-summary-metadata', '--storage-options', f'@{options_file}'])
    assert _s3(moto).exists(f'{url}/_metadata')
    with pytest.raises(SystemExit) as exited:  # without the options the server's address is unknown
        main(['--dataset_url', url, '--storage-options', f'@{tmp_path / "missing.json"}'])
    assert exited.value.code == 2
    assert 'missing.json' in capsys.readouterr().err


def test_inspect_cli_describes_an_s3_dataset(moto, dataset, capsys):
    from petastorm.tools.inspect import inspect_dataset, main

    main([dataset, '--json', '--storage-options', json.dumps(moto.storage_options())])
    output = capsys.readouterr()
    description = json.loads(output.out)
    assert description['total_rows'] == ROWS
    assert [f['name'] for f in description['fields']] == ['id', 'label', 'matrix']
    assert SECRET_KEY not in output.out + output.err
    assert inspect_dataset(dataset, filesystem=_s3(moto))['total_rows'] == ROWS


def test_copy_dataset_cli_checks_s3_urls_with_storage_options_before_starting_spark(moto, dataset, capsys):
    from petastorm.tools.copy_dataset import main

    pairs = ','.join(f'{key}={value}' for key, value in moto.storage_options().items())
    with pytest.raises(SystemExit) as exited:
        main([dataset, dataset, '--storage-options', pairs])
    assert exited.value.code == 2
    assert f'target {dataset} already exists' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([f'{dataset}-missing', f'{dataset}-copy', '--storage-options', pairs])
    assert exited.value.code == 2
    assert f'source dataset {dataset}-missing does not exist' in capsys.readouterr().err


def test_throughput_cli_reads_s3_with_storage_options(moto, dataset, capsys):
    from petastorm.benchmark.cli import main

    main([dataset, '-m', '2', '-n', '20', '-p', 'dummy', '--json', '--storage-options',
          json.dumps(moto.storage_options())])
    result = json.loads(capsys.readouterr().out)
    assert result['samples_per_second'] > 0
    assert result['measure_cycles'] == 20


def test_throughput_cli_field_regex_reads_the_s3_schema_with_storage_options(moto, dataset, capsys):
    from petastorm.benchmark.cli import main

    main([dataset, '--field-regex', 'id', '-m', '1', '-n', '5', '-p', 'dummy', '--json', '--storage-options',
          json.dumps(moto.storage_options())])
    assert json.loads(capsys.readouterr().out)['field_regex'] == ['id']


def test_build_rowgroup_index_on_s3_selects_row_groups(moto, dataset):
    from petastorm.etl.rowgroup_indexers import SingleFieldIndexer
    from petastorm.etl.rowgroup_indexing import build_rowgroup_index
    from petastorm.selectors import SingleIndexSelector

    url = _copy_of(moto, dataset, 'indexed')
    options = moto.storage_options()
    build_rowgroup_index(url, None, [SingleFieldIndexer('id_index', 'id')], storage_options=options)
    with make_reader(url, storage_options=options, reader_pool_type='dummy',
                     rowgroup_selector=SingleIndexSelector('id_index', [7])) as reader:
        ids = [int(row.id) for row in reader]
    assert 7 in ids
    assert len(ids) < ROWS


@pytest.mark.spark
def test_materialize_dataset_writes_metadata_through_the_filesystem_factory(spark, moto):
    from petastorm.etl.dataset_metadata import materialize_dataset

    url = f's3://{BUCKET}/materialized-{uuid.uuid4().hex[:8]}'
    # Spark has no s3a:// filesystem here (no hadoop-aws jars): the body writes the Parquet files with pyarrow.
    table = pa.table({'id': np.arange(50, dtype=np.int64), 'label': [f'row-{i}' for i in range(50)]})
    narrow = Schema.create_schema_view(['id', 'label'])
    with materialize_dataset(spark, url, narrow, filesystem_factory=lambda: _s3(moto)), \
            _s3(moto).open(f'{url}/part-0.parquet', 'wb') as out:
        pq.write_table(table, out, row_group_size=20)
    assert list(get_schema_from_dataset_url(url, storage_options=moto.storage_options()).fields) == ['id', 'label']
    with make_reader(url, storage_options=moto.storage_options(), reader_pool_type='dummy') as reader:
        assert sorted(int(row.id) for row in reader) == list(range(50))


# -- worker start-up ---------------------------------------------------------------------------------------------


def test_a_fresh_interpreter_reads_numeric_and_ndarray_fields_without_importing_pandas(tmp_path):
    # Every process-pool worker is a fresh interpreter: importing pandas there costs each one a quarter of a CPU
    # second before its first row, for nothing when the columns are numbers.
    url = f'file://{tmp_path}'
    write_dataset(url, Schema.create_schema_view(['id', 'matrix']),
                  ({'id': i, 'matrix': np.full((4, 8), i, np.float32)} for i in range(20)))
    script = ('import sys; from petastorm import make_reader\n'
              f'with make_reader({url!r}, reader_pool_type="dummy") as reader:\n'
              '    ids = [int(row.id) for row in reader]\n'
              'print(len(ids), sorted(m for m in sys.modules if m.split(".")[0] == "pandas")[:3])\n')
    completed = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ['20', '[]']


def test_a_pickled_filesystem_carries_listed_file_sizes_so_workers_skip_a_request_per_file(moto, clean_proxy,
                                                                                          dataset):
    import pickle

    import pyarrow.fs as pafs

    from petastorm.fs import resolve_url

    # s3fs through our layer (a read timeout is an option only s3fs takes)
    fs, root = resolve_url(dataset, moto.storage_options(clean_proxy.endpoint, config_kwargs={'read_timeout': 60}))
    files = [i.path for i in fs.get_file_info(pafs.FileSelector(root)) if i.path.endswith('.parquet')]
    in_worker = pickle.loads(pickle.dumps(fs))
    _settled_requests(clean_proxy)  # the listing's entry is logged after its answer: let it land before the reset
    clean_proxy.reset()
    with in_worker.open_input_file(files[0]) as f:
        assert pq.read_metadata(f).num_rows > 0
    assert [r.method for r in _settled_requests(clean_proxy)] == ['GET']  # the footer, and no HEAD for the size first


def test_spark_converter_reads_an_s3_dataset_through_storage_options(moto, dataset, monkeypatch):
    # Spark cannot write s3a:// here (no hadoop-aws jars), so the converter is made from a dataset already on the
    # server. The converter lists and waits for its files itself, through the URL alone: the standard AWS
    # environment variables give it the endpoint and keys; the loader's reader gets them as storage_options.
    pytest.importorskip('torch')
    pytest.importorskip('pyspark')
    from petastorm.spark import make_spark_converter

    options = moto.storage_options()
    monkeypatch.setenv('AWS_ENDPOINT_URL', options['endpoint_url'])
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', options['key'])
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', options['secret'])
    converter = make_spark_converter(dataset)
    assert len(converter) == ROWS
    assert all(url.startswith(f'{dataset}/') for url in converter.file_urls)
    with converter.make_torch_dataloader(batch_size=64, num_epochs=1, schema_fields=['id'],
                                         storage_options=options) as loader:
        ids = sorted(int(i) for batch in loader for i in batch['id'])
    assert ids == list(range(ROWS))
