"""Tables through everything that reads a reader: every pool kind, the torch loaders, TensorFlow, Ray, the caches.

The tables hold deletes (a Delta deletion vector, an Iceberg position delete file), so each path must deliver
exactly the rows of the version: the multiset of ids equals what the table library's own reader returns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader

deltalake = pytest.importorskip('deltalake')
pytest.importorskip('pyiceberg')

from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

from support.tables_util import add_deletion_vector, current_adds, delta_rows, iceberg_position_deletes, iceberg_rows  # noqa: E402,I001


def _ids(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({'id': ids, 'value': (ids * 2.0).astype(np.float32)})


@pytest.fixture(scope='module')
def delta_url(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('delta') / 'table')
    writer = deltalake.WriterProperties(max_row_group_size=50)
    deltalake.write_deltalake(root, _ids(0, 300), configuration={'delta.enableDeletionVectors': 'true'},
                              writer_properties=writer)
    deltalake.write_deltalake(root, _ids(300, 400), mode='append', writer_properties=writer)
    first = min(current_adds(root), key=lambda p: current_adds(root)[p]['modificationTime'])
    add_deletion_vector(root, first, list(range(0, 300, 3)))
    return f'file://{root}'


@pytest.fixture(scope='module')
def iceberg_table(tmp_path_factory):
    directory = tmp_path_factory.mktemp('iceberg')
    catalog = SqlCatalog('loaders', uri=f'sqlite:///{directory}/catalog.db', warehouse=f'file://{directory}')
    catalog.create_namespace('ns')
    table = catalog.create_table('ns.t', schema=_ids(0, 1).schema,
                                 properties={'write.parquet.row-group-limit': '50'})
    table.append(_ids(0, 300))
    (path,) = [task.file.file_path for task in table.scan().plan_files()]
    iceberg_position_deletes(table, {path: list(range(1, 300, 4))})
    return catalog.load_table('ns.t')


def _expected(source) -> list[int]:
    if isinstance(source, str):
        return sorted(r[0] for r in delta_rows(source.removeprefix('file://')))
    return sorted(r[0] for r in iceberg_rows(source))


@pytest.fixture(params=['delta', 'iceberg'])
def source(request, delta_url, iceberg_table):
    return delta_url if request.param == 'delta' else iceberg_table


@pytest.mark.parametrize('pool', ['dummy', 'thread', 'process'])
def test_every_pool_kind(source, pool):
    with make_batch_reader(source, reader_pool_type=pool, workers_count=2, seed=1, shuffle_rows=True) as reader:
        ids = sorted(int(i) for batch in reader for i in batch.id)
    assert ids == _expected(source)


def test_torch_loaders(source):
    pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    with make_batch_reader(source, seed=2, shuffle_rows=True) as reader:
        loader = BatchedDataLoader(reader, batch_size=32, shuffling_queue_capacity=100)
        ids = sorted(int(i) for batch in loader for i in batch['id'])
    assert ids == _expected(source)
    with make_reader(source, reader_pool_type='dummy') as reader:
        ids = sorted(int(i) for batch in DataLoader(reader, batch_size=16) for i in batch['id'])
    assert ids == _expected(source)


def test_tensorflow_dataset(source):
    pytest.importorskip('tensorflow')
    from petastorm.tf_utils import make_petastorm_dataset

    with make_batch_reader(source, reader_pool_type='dummy') as reader:
        ids = sorted(int(i) for batch in make_petastorm_dataset(reader) for i in batch.id.numpy())
    assert ids == _expected(source)


@pytest.mark.parametrize('cache_type', ['local-disk', 'local-disk-decoded'])
def test_caches_serve_every_version_exactly(tmp_path_factory, cache_type):
    root = str(tmp_path_factory.mktemp('cached') / 'table')
    deltalake.write_deltalake(root, _ids(0, 100), configuration={'delta.enableDeletionVectors': 'true'})
    (path,) = current_adds(root)
    settings = {'cache_type': cache_type, 'cache_location': str(tmp_path_factory.mktemp('cache')),
                'cache_size_limit': 1 << 30, 'cache_row_size_estimate': 100,
                'cache_extra_settings': {'cleanup': False}, 'reader_pool_type': 'dummy'}
    with make_batch_reader(f'file://{root}', **settings) as reader:
        before = sorted(int(i) for batch in reader for i in batch.id)
    # A new version deletes rows of the cached file: the cache holds the file's rows, the version's deletes apply.
    add_deletion_vector(root, path, [1, 2, 3, 50])
    for version in (0, 1):
        with make_batch_reader(f'file://{root}', table_version=version, **settings) as reader:
            ids = sorted(int(i) for batch in reader for i in batch.id)
        assert ids == sorted(r[0] for r in delta_rows(root, version))
    assert before == list(range(100))


def test_a_loader_restored_on_a_newer_version_restarts_the_epoch_when_asked(tmp_path):
    # table_version_change='restart_epoch' is the reader's option; a loader restoring the reader's position (through
    # its restart) must honour it as load_state_dict does, instead of refusing the newer version.
    from petastorm.pytorch import BatchedDataLoader

    root = str(tmp_path / 'moving')
    deltalake.write_deltalake(root, _ids(0, 100))
    url = f'file://{root}'
    with BatchedDataLoader(make_batch_reader(url, reader_pool_type='dummy', seed=0), batch_size=10) as loader:
        next(iter(loader))
        state = loader.state_dict()
    deltalake.write_deltalake(root, _ids(100, 150), mode='append')
    with BatchedDataLoader(make_batch_reader(url, reader_pool_type='dummy', seed=0), batch_size=10) as loader, \
            pytest.raises(ValueError, match='table_version='):
        loader.load_state_dict(state)
    reader = make_batch_reader(url, reader_pool_type='dummy', seed=0, table_version_change='restart_epoch')
    with BatchedDataLoader(reader, batch_size=10) as loader:
        loader.load_state_dict(state)
        ids = sorted(int(i) for batch in loader for i in batch['id'])
    assert ids == list(range(150))
