"""What planning a read costs on an object store, counted in requests at a loopback S3 server.

Each request to a remote store is a round trip (tens of milliseconds to a far region), so planning asks as few
questions as the layout allows: one listing says whether the directory is a table, which metadata files it has and
(without subdirectories) which data files; a partitioned store is listed once more, recursively; footers are read
only when the metadata does not give the row counts. Both S3 clients plan alike: pyarrow's (what storage_options
get) and s3fs (given as filesystem=).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset  # noqa: F401 - see below
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.test_util.s3_server import S3DirectoryServer
from petastorm.unischema import Unischema, UnischemaField
from support.s3_loopback import FaultProxy

pytest.importorskip('s3fs')

# pyarrow's client reads a file by its listed size (no HEAD) once pyarrow.dataset is imported; before that, a
# process opens its first few files the plain way (petastorm.store.plain_or_sized), a HEAD each. The counts below
# are those of reads by size, whichever test of the session imported the module first.

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


@pytest.fixture(params=['options', 's3fs'])
def client(request, server) -> dict:
    """The reader arguments of one S3 client: storage_options (pyarrow's client) or an s3fs filesystem."""
    if request.param == 'options':
        return {'storage_options': server.storage_options()}
    import s3fs

    return {'filesystem': s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options())}


def _planning_requests(server: S3DirectoryServer, client: dict, factory, name: str, field: str = 'x',
                       **reader_args) -> tuple[dict, list[int]]:
    """The requests made while the reader was made, and the values of ``field`` it then read, sorted."""
    server.reset_stats()
    with factory(f's3://{BUCKET}/{name}', reader_pool_type='dummy', **client, **reader_args) as reader:
        requests = dict(server.stats().requests)
        values = sorted(int(v) for batch in reader for v in np.atleast_1d(getattr(batch, field)))
    return requests, values


def _expected(request, lists: int, gets: int) -> dict:
    """The requests of planning that lists ``lists`` times and reads ``gets`` footers, one request each: neither
    client asks a file's size (a HEAD), which the listing gave."""
    return {'LIST': lists, 'GET': gets}


def _data_files_read(server: S3DirectoryServer, name: str) -> set[str]:
    """The data files of ``name`` that requests since the last reset asked for."""
    return {obj.rsplit('/', 1)[1] for obj in server.stats().objects
            if obj.startswith(f'{BUCKET}/{name}/') and not obj.rsplit('/', 1)[1].startswith('_')}


def test_a_flat_store_is_planned_from_one_listing_and_its_footers(server, client, request):
    name = f'flat-{request.node.callspec.id}'
    _plain_files(os.path.join(server.root, BUCKET, name), 3)
    requests, values = _planning_requests(server, client, make_batch_reader, name)
    # One listing (no probe for _delta_log, metadata/, _common_metadata or _metadata), the three footers.
    assert requests == _expected(request, 1, 3)
    assert values == list(range(30))


def _name(request, base: str) -> str:
    """A store name of its own for each parametrization (stores are written into the server's directory)."""
    return f'{base}-{request.node.callspec.id}'


def test_a_partitioned_store_is_listed_once_more_recursively(server, client, request):
    name = _name(request, 'partitioned')
    for key in (1, 2):
        _plain_files(os.path.join(server.root, BUCKET, name, f'k={key}'), 1)
    requests, values = _planning_requests(server, client, make_batch_reader, name)
    assert requests == _expected(request, 2, 2)
    assert values == sorted(list(range(10)) * 2)


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_our_dataset_is_planned_from_its_metadata_and_one_footer(server, client, factory, request):
    # Its _common_metadata gives the schema and every file's row counts; one footer shows that the files hold the
    # schema's columns (a clear error before any worker starts, otherwise).
    name = _name(request, 'ours')
    write_dataset(f'file://{os.path.join(server.root, BUCKET, name)}', SCHEMA,
                  ({'id': i, 'vec': np.full(3, i, np.float32)} for i in range(200)), row_group_size_mb=0.001)
    requests, values = _planning_requests(server, client, factory, name, 'id')
    assert requests == _expected(request, 1, 2)
    assert values == list(range(200))


def test_alone_a_reader_reads_the_first_footer_while_the_metadata(server):
    # The first data file's footer is read next in any case (the columns the files hold): far away, reading it while
    # the _common_metadata is read saves a round trip or two. The proxy holds the metadata's requests until the
    # data file is asked for: read one after the other, the metadata would wait the whole hold out.
    name = 'ahead'
    write_dataset(f'file://{os.path.join(server.root, BUCKET, name)}', SCHEMA,
                  ({'id': i, 'vec': np.full(3, i, np.float32)} for i in range(50)), row_group_size_mb=0.001)
    with FaultProxy(server.port) as proxy:
        proxy.hold_until('/_common_metadata', '/part-', timeout=30)
        options = server.storage_options(proxy.endpoint)
        with make_batch_reader(f's3://{BUCKET}/{name}', storage_options=options, reader_pool_type='dummy') as reader:
            ids = sorted(int(i) for batch in reader for i in batch.id)
    assert ids == list(range(50))
    assert proxy.holds, 'the metadata was read'
    assert not any(proxy.holds), 'the metadata was read before the data file was asked for'
    # That footer is still read once: test_our_dataset_is_planned_from_its_metadata_and_one_footer counts it.


def test_a_new_reader_sees_files_another_process_added(server, client, request):
    # The S3 client keeps listings for the life of the process; a reader must list the store anew.
    name = _name(request, 'growing')
    directory = os.path.join(server.root, BUCKET, name)
    _plain_files(directory, 1)
    assert _planning_requests(server, client, make_batch_reader, name)[1] == list(range(10))
    pq.write_table(pa.table({'x': np.arange(10, 15)}), os.path.join(directory, 'part-1.parquet'))
    assert _planning_requests(server, client, make_batch_reader, name)[1] == list(range(15))
    os.remove(os.path.join(directory, 'part-0.parquet'))
    assert _planning_requests(server, client, make_batch_reader, name)[1] == list(range(10, 15))


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


def test_a_summary_plans_the_store_without_a_footer_whatever_its_file_count(server, client, request):
    name = _name(request, 'summarized')
    _summarized_store(os.path.join(server.root, BUCKET, name), 40)
    requests, values = _planning_requests(server, client, make_batch_reader, name)
    assert requests == _expected(request, 1, 2)  # _common_metadata and _metadata
    assert values == list(range(400))


def test_filters_are_pruned_with_the_summary_and_only_matching_files_are_read(server, client, request):
    name = _name(request, 'pruned')
    _summarized_store(os.path.join(server.root, BUCKET, name), 40)
    requests, values = _planning_requests(server, client, make_batch_reader, name, filters=[('x', '<', 25)])
    assert values == list(range(25))
    # the 2 metadata files, and pyarrow's pruning reads the summary again (the s3fs layer's footer cache answers)
    assert requests['LIST'] == 1
    assert requests['GET'] == 2 + ('options' in request.node.callspec.id)
    assert _data_files_read(server, name) == {'part-000.parquet', 'part-001.parquet', 'part-002.parquet'}


def test_a_summary_that_misses_a_file_leaves_the_footers_to_say(server, client, request):
    name = _name(request, 'outgrown')
    directory = os.path.join(server.root, BUCKET, name)
    _summarized_store(directory, 3)
    pq.write_table(pa.table({'x': np.arange(30, 35)}), os.path.join(directory, 'part-003.parquet'))
    requests, values = _planning_requests(server, client, make_batch_reader, name)
    assert requests == _expected(request, 1, 2 + 4)
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
