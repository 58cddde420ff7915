"""s3:// through every public API and command-line tool: each takes ``storage_options`` (or a filesystem) and reads
or writes a dataset on moto's S3 server on loopback; and what a worker process pays before its first row.

The server, the fault-injecting proxy that logs the requests, and the dataset are fixtures of
``tests/storage/conftest.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url
from petastorm.fs_utils import FilesystemResolver, get_filesystem_and_path_or_paths
from support.s3_datasets import ROWS, S3Schema, read_ids, s3_row
from support.s3_loopback import BUCKET, SECRET_KEY, FaultProxy

s3fs = pytest.importorskip('s3fs')
pytest.importorskip('moto')


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


def test_storage_options_reach_metadata_and_fs_utils(moto, s3_dataset):
    options = moto.storage_options()
    assert list(get_schema_from_dataset_url(s3_dataset, storage_options=options).fields) == ['id', 'label', 'matrix']
    fs, path = get_filesystem_and_path_or_paths(s3_dataset, storage_options=options)
    assert isinstance(fs, s3fs.S3FileSystem)
    assert fs.exists(f'{path}/_common_metadata')
    resolver = FilesystemResolver(s3_dataset, storage_options=options)
    assert resolver.filesystem().isdir(resolver.get_dataset_path())


def test_filesystem_argument_works_for_writer_and_readers(moto):
    fs = s3fs.S3FileSystem(**moto.storage_options(), skip_instance_cache=True)
    url = f's3://{BUCKET}/written-with-filesystem'
    write_dataset(url, S3Schema, (s3_row(i) for i in range(20)), filesystem=fs)
    with make_reader(url, filesystem=fs, reader_pool_type='dummy') as reader:
        assert sorted(row.id for row in reader) == list(range(20))


def test_make_batch_reader_reads_a_list_of_s3_file_urls(moto, s3_dataset):
    files = sorted(f's3://{path}' for path in _s3(moto).glob(f'{s3_dataset}/*.parquet'))
    assert len(files) > 1
    with make_batch_reader(files[:2], storage_options=moto.storage_options(), reader_pool_type='dummy') as reader:
        ids = [int(i) for batch in reader for i in batch.id]
    assert 0 < len(ids) < ROWS
    assert len(set(ids)) == len(ids)


def test_torch_dataloader_reads_s3(moto, s3_dataset):
    pytest.importorskip('torch')
    from petastorm.pytorch import DataLoader

    with DataLoader(make_reader(s3_dataset, storage_options=moto.storage_options(), reader_pool_type='thread',
                                workers_count=2, schema_fields=['id', 'matrix']), batch_size=64) as loader:
        batches = list(loader)
    ids = sorted(int(i) for batch in batches for i in batch['id'])
    assert ids == list(range(ROWS))
    assert tuple(batches[0]['matrix'].shape[1:]) == (4, 8)


def test_local_disk_cache_of_an_s3_dataset_serves_the_second_epoch(moto, clean_proxy, s3_dataset, tmp_path):
    options = moto.storage_options(clean_proxy.endpoint)
    for epoch in range(2):
        clean_proxy.reset()
        with make_reader(s3_dataset, storage_options=options, reader_pool_type='thread', workers_count=2,
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


def test_generate_petastorm_metadata_on_s3_with_storage_options_and_filesystem(moto, s3_dataset):
    from petastorm.etl.petastorm_generate_metadata import generate_petastorm_metadata

    url = _copy_of(moto, s3_dataset, 'regenerated')
    generate_petastorm_metadata(None, url, use_summary_metadata=True, storage_options=moto.storage_options())
    assert _s3(moto).exists(f'{url}/_metadata')
    _s3(moto).rm(f'{url}/_metadata')
    # Through a ready filesystem: the summary file it writes is what shows that the call reached the store.
    generate_petastorm_metadata(None, url, use_summary_metadata=True, filesystem=_s3(moto))
    assert _s3(moto).exists(f'{url}/_metadata')
    assert sorted(read_ids(url, moto.storage_options(), 'make_reader', 'dummy')) == list(range(ROWS))


def test_generate_metadata_cli_takes_storage_options_from_a_file(moto, s3_dataset, tmp_path, capsys):
    from petastorm.etl.petastorm_generate_metadata import main

    url = _copy_of(moto, s3_dataset, 'cli-regenerated')
    options_file = tmp_path / 'options.json'
    options_file.write_text(json.dumps(moto.storage_options()))
    main(['--dataset_url', url, '--use-summary-metadata', '--storage-options', f'@{options_file}'])
    assert _s3(moto).exists(f'{url}/_metadata')
    with pytest.raises(SystemExit) as exited:  # without the options the server's address is unknown
        main(['--dataset_url', url, '--storage-options', f'@{tmp_path / "missing.json"}'])
    assert exited.value.code == 2
    assert 'missing.json' in capsys.readouterr().err


def test_inspect_cli_describes_an_s3_dataset(moto, s3_dataset, capsys):
    from petastorm.tools.inspect import inspect_dataset, main

    main([s3_dataset, '--json', '--storage-options', json.dumps(moto.storage_options())])
    output = capsys.readouterr()
    description = json.loads(output.out)
    assert description['total_rows'] == ROWS
    assert [f['name'] for f in description['fields']] == ['id', 'label', 'matrix']
    assert SECRET_KEY not in output.out + output.err
    assert inspect_dataset(s3_dataset, filesystem=_s3(moto))['total_rows'] == ROWS


def test_copy_dataset_cli_checks_s3_urls_with_storage_options_before_starting_spark(moto, s3_dataset, capsys):
    from petastorm.tools.copy_dataset import main

    pairs = ','.join(f'{key}={value}' for key, value in moto.storage_options().items())
    with pytest.raises(SystemExit) as exited:
        main([s3_dataset, s3_dataset, '--storage-options', pairs])
    assert exited.value.code == 2
    assert f'target {s3_dataset} already exists' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([f'{s3_dataset}-missing', f'{s3_dataset}-copy', '--storage-options', pairs])
    assert exited.value.code == 2
    assert f'source dataset {s3_dataset}-missing does not exist' in capsys.readouterr().err


def test_throughput_cli_reads_s3_with_storage_options(moto, s3_dataset, capsys):
    from petastorm.benchmark.cli import main

    main([s3_dataset, '-m', '2', '-n', '20', '-p', 'dummy', '--json', '--storage-options',
          json.dumps(moto.storage_options())])
    result = json.loads(capsys.readouterr().out)
    assert result['samples_per_second'] > 0
    assert result['measure_cycles'] == 20


def test_throughput_cli_field_regex_reads_the_s3_schema_with_storage_options(moto, s3_dataset, capsys):
    from petastorm.benchmark.cli import main

    main([s3_dataset, '--field-regex', 'id', '-m', '1', '-n', '5', '-p', 'dummy', '--json', '--storage-options',
          json.dumps(moto.storage_options())])
    assert json.loads(capsys.readouterr().out)['field_regex'] == ['id']


def test_build_rowgroup_index_on_s3_selects_row_groups(moto, s3_dataset):
    from petastorm.etl.rowgroup_indexers import SingleFieldIndexer
    from petastorm.etl.rowgroup_indexing import build_rowgroup_index
    from petastorm.selectors import SingleIndexSelector

    url = _copy_of(moto, s3_dataset, 'indexed')
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
    narrow = S3Schema.create_schema_view(['id', 'label'])
    with materialize_dataset(spark, url, narrow, filesystem_factory=lambda: _s3(moto)), \
            _s3(moto).open(f'{url}/part-0.parquet', 'wb') as out:
        pq.write_table(table, out, row_group_size=20)
    assert list(get_schema_from_dataset_url(url, storage_options=moto.storage_options()).fields) == ['id', 'label']
    with make_reader(url, storage_options=moto.storage_options(), reader_pool_type='dummy') as reader:
        assert sorted(int(row.id) for row in reader) == list(range(50))


def test_a_fresh_interpreter_reads_numeric_and_ndarray_fields_without_importing_pandas(tmp_path):
    # Every process-pool worker is a fresh interpreter: importing pandas there costs each one a quarter of a CPU
    # second before its first row, for nothing when the columns are numbers.
    url = f'file://{tmp_path}'
    write_dataset(url, S3Schema.create_schema_view(['id', 'matrix']),
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
                                                                                          s3_dataset):
    import pickle

    import pyarrow.fs as pafs

    from petastorm.fs import resolve_url

    # s3fs through our layer (a read timeout is an option only s3fs takes)
    fs, root = resolve_url(s3_dataset, moto.storage_options(clean_proxy.endpoint, config_kwargs={'read_timeout': 60}))
    files = [i.path for i in fs.get_file_info(pafs.FileSelector(root)) if i.path.endswith('.parquet')]
    in_worker = pickle.loads(pickle.dumps(fs))
    _settled_requests(clean_proxy)  # the listing's entry is logged after its answer: let it land before the reset
    clean_proxy.reset()
    with in_worker.open_input_file(files[0]) as f:
        assert pq.read_metadata(f).num_rows > 0
    assert [r.method for r in _settled_requests(clean_proxy)] == ['GET']  # the footer, and no HEAD for the size first


def test_spark_converter_reads_an_s3_dataset_through_storage_options(moto, s3_dataset, monkeypatch):
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
    converter = make_spark_converter(s3_dataset)
    assert len(converter) == ROWS
    assert all(url.startswith(f'{s3_dataset}/') for url in converter.file_urls)
    with converter.make_torch_dataloader(batch_size=64, num_epochs=1, schema_fields=['id'],
                                         storage_options=options) as loader:
        ids = sorted(int(i) for batch in loader for i in batch['id'])
    assert ids == list(range(ROWS))



def test_a_rank_given_the_plan_reads_its_share_without_pandas_or_pyarrow_dataset(moto, tmp_path):
    # A job runs a process per rank, each holding what it imports (64 ranks of a node: 64 copies). The ranks that
    # are given the plan (broadcast, or here a plan file) read no footer, so nothing imports pyarrow.dataset, whose
    # import imports pandas: about 45 MB of a process's own. The rank that plans reads the footers by their listed
    # sizes through pyarrow.dataset and imports both (docs/storage.md, "Planning at scale").
    url = f's3://{BUCKET}/rank-share-{uuid.uuid4().hex[:8]}'
    fs = _s3(moto)
    for index in range(3):
        with fs.open(f'{url}/part-{index}.parquet', 'wb') as out:
            pq.write_table(pa.table({'id': np.arange(index * 10, index * 10 + 10, dtype=np.int64)}), out,
                           row_group_size=5)
    options = {'storage_options': moto.storage_options(), 'plan_file': str(tmp_path / 'plan.arrow'),
               'shard_count': 2, 'shard_mode': 'rows', 'shard_remainder': 'spread', 'seed': 1}
    with make_batch_reader(url, cur_shard=0, **options) as planning:
        first = [int(i) for batch in planning for i in batch.id]
    script = ('import json, sys; from petastorm import make_batch_reader\n'
              f'with make_batch_reader({url!r}, cur_shard=1, reader_pool_type="thread", **{options!r}) as reader:\n'
              '    ids = [int(i) for batch in reader for i in batch.id]\n'
              'loaded = sorted(m for m in sys.modules if m.split(".")[0] == "pandas" or m == "pyarrow.dataset")\n'
              'print(json.dumps([ids, loaded[:3]]))\n')
    completed = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    second, loaded = json.loads(completed.stdout)
    assert sorted(first + second) == list(range(30))
    assert loaded == []
