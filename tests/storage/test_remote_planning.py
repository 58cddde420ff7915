"""What planning a read costs on an object store, counted in requests at a loopback S3 server.

Each request to a remote store is a round trip (tens of milliseconds to a far region), so planning asks as few
questions as the layout allows: one listing says whether the directory is a table, which metadata files it has and
(without subdirectories) which data files; a partitioned store is listed once more, recursively; footers are read
only when the metadata does not give the row counts.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.test_util.s3_server import S3DirectoryServer
from petastorm.unischema import Unischema, UnischemaField

pytest.importorskip('s3fs')

BUCKET = 'planning'
SCHEMA = Unischema('Planned', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                               UnischemaField('vec', np.float32, (3,), NdarrayCodec(), False)])


@pytest.fixture(scope='module')
def server(tmp_path_factory):
    with S3DirectoryServer(str(tmp_path_factory.mktemp('objects')), buckets=(BUCKET,)) as running:
        yield running


def _plain_files(directory: str, count: int, rows: int = 10) -> None:
    os.makedirs(directory)
    for index in range(count):
        pq.write_table(pa.table({'x': np.arange(index * rows, (index + 1) * rows)}),
                       os.path.join(directory, f'part-{index}.parquet'))


def _planning_requests(server: S3DirectoryServer, factory, name: str, field: str = 'x') -> tuple[dict, list[int]]:
    """The requests made while the reader was made, and the values of ``field`` it then read, sorted."""
    server.reset_stats()
    with factory(f's3://{BUCKET}/{name}', storage_options=server.storage_options(), reader_pool_type='dummy') as reader:
        requests = dict(server.stats().requests)
        values = sorted(int(v) for batch in reader for v in np.atleast_1d(getattr(batch, field)))
    return requests, values


def test_a_flat_store_is_planned_from_one_listing_and_its_footers(server):
    _plain_files(os.path.join(server.root, BUCKET, 'flat'), 3)
    requests, values = _planning_requests(server, make_batch_reader, 'flat')
    # One listing (no HEAD, no probe for _delta_log, metadata/, _common_metadata or _metadata), the three footers.
    assert requests == {'LIST': 1, 'GET': 3}
    assert values == list(range(30))


def test_a_partitioned_store_is_listed_once_more_recursively(server):
    root = os.path.join(server.root, BUCKET, 'partitioned')
    for key in (1, 2):
        _plain_files(os.path.join(root, f'k={key}'), 1)
    requests, values = _planning_requests(server, make_batch_reader, 'partitioned')
    assert requests == {'LIST': 2, 'GET': 2}
    assert values == sorted(list(range(10)) * 2)


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_our_dataset_is_planned_from_its_metadata_and_one_footer(server, factory):
    # Its _common_metadata gives the schema and every file's row counts; one footer shows that the files hold the
    # schema's columns (a clear error before any worker starts, otherwise).
    name = f'ours-{factory.__name__}'
    write_dataset(f'file://{os.path.join(server.root, BUCKET, name)}', SCHEMA,
                  ({'id': i, 'vec': np.full(3, i, np.float32)} for i in range(200)), row_group_size_mb=0.001)
    requests, values = _planning_requests(server, factory, name, 'id')
    assert requests == {'LIST': 1, 'GET': 2}
    assert values == list(range(200))


def test_a_new_reader_sees_files_another_process_added(server):
    # The S3 client keeps listings for the life of the process; a reader must list the store anew.
    directory = os.path.join(server.root, BUCKET, 'growing')
    _plain_files(directory, 1)
    assert _planning_requests(server, make_batch_reader, 'growing')[1] == list(range(10))
    pq.write_table(pa.table({'x': np.arange(10, 15)}), os.path.join(directory, 'part-1.parquet'))
    assert _planning_requests(server, make_batch_reader, 'growing')[1] == list(range(15))
    os.remove(os.path.join(directory, 'part-0.parquet'))
    assert _planning_requests(server, make_batch_reader, 'growing')[1] == list(range(10, 15))


def _summarized_store(directory: str, files: int) -> None:
    """Plain Parquet files with a ``_metadata`` summary of all their row groups and a ``_common_metadata``."""
    os.makedirs(directory)
    collected: list = []
    for index in range(files):
        table = pa.table({'x': np.arange(index * 10, (index + 1) * 10, dtype=np.int64)})
        name = f'part-{index:03d}.parquet'
        pq.write_table(table, os.path.join(directory, name), metadata_collector=collected)
        collected[-1].set_file_path(name)
    pq.write_metadata(table.schema, os.path.join(directory, '_common_metadata'))
    pq.write_metadata(table.schema, os.path.join(directory, '_metadata'), metadata_collector=collected)


def test_a_summary_plans_the_store_without_a_footer_whatever_its_file_count(server):
    _summarized_store(os.path.join(server.root, BUCKET, 'summarized'), 40)
    requests, values = _planning_requests(server, make_batch_reader, 'summarized')
    assert requests == {'LIST': 1, 'GET': 2}  # _common_metadata and _metadata
    assert values == list(range(400))


def test_filters_are_pruned_with_the_summary_and_only_matching_files_are_read(server):
    _summarized_store(os.path.join(server.root, BUCKET, 'pruned'), 40)
    server.reset_stats()
    with make_batch_reader(f's3://{BUCKET}/pruned', storage_options=server.storage_options(),
                           reader_pool_type='dummy', filters=[('x', '<', 25)]) as reader:
        values = sorted(int(v) for batch in reader for v in batch.x)
    assert values == list(range(25))
    # the 2 metadata files (pyarrow's pruning reads the small summary again from the footer cache), then only the 3
    # files that may hold x < 25
    assert server.stats().requests == {'LIST': 1, 'GET': 2 + 3}


def test_a_summary_that_misses_a_file_leaves_the_footers_to_say(server):
    directory = os.path.join(server.root, BUCKET, 'outgrown')
    _summarized_store(directory, 3)
    pq.write_table(pa.table({'x': np.arange(30, 35)}), os.path.join(directory, 'part-003.parquet'))
    requests, values = _planning_requests(server, make_batch_reader, 'outgrown')
    assert requests == {'LIST': 1, 'GET': 2 + 4}
    assert values == list(range(35))


def test_footers_are_read_many_at_a_time(server):
    # Without metadata, every footer is a round trip: they are read 64 at a time (the S3 client keeps as many
    # connections), so that planning takes files / 64 round trips. Each concurrent request needs its own connection.
    from petastorm.test_util.delay_proxy import DelayProxy

    _plain_files(os.path.join(server.root, BUCKET, 'many'), 200, rows=1)
    with DelayProxy(('127.0.0.1', server.port), delay=0.02) as proxy, \
            make_batch_reader(f's3://{BUCKET}/many', storage_options=server.storage_options(proxy.endpoint),
                              reader_pool_type='dummy') as reader:
        connections = proxy.stats().connections
        assert sum(len(batch.x) for batch in reader) == 200
    assert connections > 32
