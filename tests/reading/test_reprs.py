"""The reprs of readers and loaders say what they are: URL, fields, rows per epoch, pool and workers, batching and
shuffling."""

from __future__ import annotations

import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.weighted_sampling_reader import WeightedSamplingReader
from support.readings import ROWS, write_readings


@pytest.fixture(scope='module')
def readings_url(tmp_path_factory):
    return write_readings(tmp_path_factory.mktemp('readings'))


@pytest.fixture(scope='module')
def plain_url(tmp_path_factory):
    """A Parquet store without Petastorm metadata, for the batch readers."""
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp('plain')
    table = pa.table({'id': pa.array(range(ROWS), pa.int64()), 'sensor': pa.array([i % 5 for i in range(ROWS)])})
    pq.write_table(table, root / 'part-0.parquet', row_group_size=50)
    return root.as_uri()


# --- reprs --------------------------------------------------------------------------------------------------------

def test_reader_repr_says_what_it_reads(readings_url):
    with make_reader(readings_url, schema_fields=['id', 'values'], reader_pool_type='dummy', seed=3,
                     shuffle_rows=True, num_epochs=2, cur_shard=0, shard_count=2) as reader:
        text = repr(reader)
        rows = reader.num_rows_per_epoch
    assert text.startswith('<Reader make_reader of ')
    for part in (repr(readings_url), 'fields=[id, values]', f'rows_per_epoch={rows}', 'num_epochs=2', 'seed=3',
                 'shuffle_rows=True', 'shuffle_row_groups=True', "reader_pool_type='dummy'", 'workers_count=10',
                 'cur_shard=0, shard_count=2'):
        assert part in text, (part, text)
    assert text.endswith('shard_count=2>')
    assert repr(reader).endswith(', stopped>')


def test_batch_reader_repr_and_unknown_row_counts(plain_url):
    from petastorm.predicates import in_lambda

    with make_batch_reader(plain_url, reader_pool_type='thread', workers_count=2,
                           predicate=in_lambda(['sensor'], lambda s: s == 1)) as reader:
        text = repr(reader)
    assert text.startswith('<Reader make_batch_reader of ')
    assert 'rows_per_epoch=unknown' in text
    assert "reader_pool_type='thread'" in text
    assert 'workers_count=2' in text


def test_weighted_sampling_reader_repr_shows_the_mix(readings_url):
    readers = [make_reader(readings_url, reader_pool_type='dummy'), make_reader(readings_url, reader_pool_type='dummy')]
    with WeightedSamplingReader(readers, [3, 1], seed=0) as mixed:
        text = repr(mixed)
    assert text.startswith('<WeightedSamplingReader probabilities=[0.75, 0.25]')
    assert text.count('<Reader make_reader of') == 2


def test_torch_loader_reprs_show_batching_shuffling_and_the_reader(readings_url, plain_url):
    pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader

    with DataLoader(make_reader(readings_url, reader_pool_type='dummy'), batch_size=32,
                    shuffling_queue_capacity=100) as loader:
        text = repr(loader)
    assert text.startswith('<DataLoader batch_size=32, shuffling_queue_capacity=100, ')
    assert f'batches_per_pass={-(-ROWS // 32)}' in text
    assert 'reader=<Reader make_reader of' in text

    with BatchedDataLoader(make_batch_reader(plain_url, reader_pool_type='dummy', schema_fields=['id']),
                           batch_size=50) as loader:
        next(iter(loader))
        text = repr(loader)
    assert text.startswith('<BatchedDataLoader batch_size=50, shuffling_queue_capacity=0, ')
    assert "device='cpu'" in text
    assert 'pass in progress' in text

    loader = InMemBatchedDataLoader(make_batch_reader(plain_url, reader_pool_type='dummy', schema_fields=['id']),
                                    batch_size=100, num_epochs=3, shuffle=True, seed=5, rows_capacity=1000)
    text = repr(loader)
    assert text.startswith(f'<InMemBatchedDataLoader batch_size=100, rows_in_memory={ROWS}, fields=[id], '
                           f'num_epochs=3, shuffle=True, seed=5, batches=9')


def test_a_row_prints_its_values_as_they_read(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    pq.write_table(pa.table({'cam': ['cam0'], 'speed': [1.5], 'gain': pa.array([0.1], pa.float32()),
                             'ok': [True], 'xy': [[1, 2]]}), tmp_path / 'a.parquet')
    with make_reader(tmp_path.as_uri(), reader_pool_type='dummy') as reader:
        row = next(iter(reader))
    assert repr(row) == "inferred_schema_view(cam='cam0', speed=1.5, gain=0.1, ok=True, xy=array([1, 2]))"
    assert isinstance(row.cam, np.str_)  # the values are numpy's, as in Petastorm: only their display changed


def test_struct_and_map_values_of_a_row_are_python_scalars(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({'geo': [{'lat': 1.5, 'lon': 2.5}],
                             'tags': pa.array([[('a', 1)]], pa.map_(pa.string(), pa.int64()))}), tmp_path / 'a.parquet')
    with make_reader(tmp_path.as_uri(), reader_pool_type='dummy') as reader:
        row = next(iter(reader))
    assert str((row.geo, row.tags)) == "({'lat': 1.5, 'lon': 2.5}, [('a', 1)])"
    assert type(row.geo['lat']) is float
