"""A loader's first batch does not wait for a whole row group: the first work item of a pass is read in two.

``Reader.column_batches(first_rows=n)`` (the loaders pass their batch size) reads a pass's first work item as its
first ``n`` rows, decoded alone, then the rest, when it has more than twice as many rows. The rows, their order,
the positions a state names and what the store is asked for stay those of the unsplit item.
"""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.reading import worker

ROWS, GROUP = 400, 100


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp('first_rows') / 'ids.parquet'
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids * 0.5}), str(path), row_group_size=GROUP)
    return f'file://{path}'


def _batches(reader, first_rows=None):
    with reader:
        return [batch.columns['id'] for batch in reader.column_batches(first_rows)]


@pytest.mark.parametrize('pool', ['dummy', 'thread'])
@pytest.mark.parametrize('shuffle', [False, True])
def test_the_first_rows_come_alone_and_the_rows_stay_the_same(url, pool, shuffle):
    def reader():
        return make_batch_reader(url, reader_pool_type=pool, workers_count=2, seed=7, shuffle_rows=shuffle,
                                 shuffle_row_groups=shuffle)

    whole = _batches(reader())
    split = _batches(reader(), first_rows=16)
    assert [len(b) for b in whole] == [GROUP] * 4
    assert [len(b) for b in split] == [16, GROUP - 16] + [GROUP] * 3
    assert np.array_equal(np.concatenate(split), np.concatenate(whole))


def test_only_the_head_is_decoded_before_the_first_batch(url, monkeypatch):
    decoded = []
    real = worker.decode_columns

    def counting(fields, table, where, *rest, **named):
        decoded.append(table.num_rows)
        return real(fields, table, where, *rest, **named)

    monkeypatch.setattr(worker, 'decode_columns', counting)
    with make_batch_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        first = next(reader.column_batches(first_rows=10))
        assert decoded == [10]
        assert first.num_rows == 10


def test_len_counts_the_extra_batch_of_a_split_item(url):
    with make_batch_reader(url, reader_pool_type='dummy') as reader:
        assert len(reader) == 4
        batches = list(reader.column_batches(first_rows=10))
        assert len(batches) == 5
        reader.reset()
        assert len(reader) == 5 == len(list(reader.column_batches()))


@pytest.mark.parametrize('kwargs', [{'reader_pool_type': 'process', 'workers_count': 1},
                                    {'cache_type': 'local-disk', 'cache_size_limit': 10**8,
                                     'cache_row_size_estimate': 16}],
                         ids=['process pool', 'cache'])
def test_items_are_not_split_where_their_parts_would_read_the_row_group_twice(url, kwargs, tmp_path):
    if 'cache_type' in kwargs:
        kwargs = {**kwargs, 'cache_location': str(tmp_path)}
    assert [len(b) for b in _batches(make_batch_reader(url, **kwargs), first_rows=10)] == [GROUP] * 4


def test_a_first_item_of_less_than_twice_the_rows_is_read_whole(url):
    assert [len(b) for b in _batches(make_batch_reader(url, reader_pool_type='dummy'), first_rows=50)] == [GROUP] * 4


torch = pytest.importorskip('torch')


@pytest.mark.parametrize('stop_after', [1, 3, 7])
def test_a_loader_saved_in_a_split_item_resumes_exactly(url, stop_after):
    from petastorm.pytorch import BatchedDataLoader

    def loader():
        return BatchedDataLoader(make_batch_reader(url, reader_pool_type='thread', seed=3, shuffle_rows=True,
                                                   num_epochs=1), batch_size=8)

    with loader() as whole:
        expected = [int(i) for batch in whole for i in batch['id']]
    with loader() as first:
        it = iter(first)
        taken = [int(i) for _ in range(stop_after) for i in next(it)['id']]
        state = first.state_dict()
    with loader() as second:
        second.load_state_dict(state)
        rest = [int(i) for batch in second for i in batch['id']]
    assert taken + rest == expected


def test_consecutive_rows_are_sliced_and_others_taken():
    table = pa.table({'id': np.arange(10), 'b': [bytes([i]) * 3 for i in range(10)]})
    sliced = worker.gather_rows(table, np.arange(3, 7))
    assert sliced.column('id').to_pylist() == [3, 4, 5, 6]
    assert sliced.column('b').chunk(0).offset == 3, 'a view of the table, not a copy'
    for rows in ([4], [2, 1, 0], [0, 2, 3], [5, 6, 8], []):
        gathered = worker.gather_rows(table, np.asarray(rows, dtype=np.int64))
        assert gathered.column('id').to_pylist() == rows
