"""A WeightedSamplingReader under the loaders: mixed column-wise with the draws row iteration makes, and saved
and restored exactly (every reader's rows, the rows held by the mix and the loader, the draw) so that a mixture
resumes without repeats, in the same sequence where nothing was shuffled in a buffer.
"""

import collections

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.weighted_sampling_reader import WeightedSamplingReader

torch = pytest.importorskip('torch')
from petastorm.pytorch import DataLoader  # noqa: E402

ROWS = 70


@pytest.fixture(scope='module')
def urls(tmp_path_factory):
    out = []
    for name, offset in (('a', 0), ('b', 1000), ('c', 2000)):
        path = tmp_path_factory.mktemp('mix') / f'{name}.parquet'
        ids = np.arange(offset, offset + ROWS, dtype=np.int64)
        pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), str(path), row_group_size=12)
        out.append(f'file://{path}')
    return out


def _mix(urls, batched, num_epochs=None, weights=(0.5, 0.3, 0.2)):
    from petastorm import make_reader

    def reader(url):
        if batched:
            return make_batch_reader(url, seed=8, shuffle_rows=True, num_epochs=num_epochs, workers_count=1)
        return make_reader(url, seed=8, shuffle_rows=True, num_epochs=num_epochs, workers_count=1,
                           reader_pool_type='dummy')
    return WeightedSamplingReader([reader(url) for url in urls], list(weights), seed=11)




def test_row_readers_are_mixed_column_wise_with_the_draws_of_row_iteration(urls):
    with _mix(urls, batched=False) as mixed:
        rows = [int(next(mixed).id) for _ in range(300)]
    with DataLoader(_mix(urls, batched=False), batch_size=10) as loader:
        batches = iter(loader)
        columnar = sum((next(batches)['id'].tolist() for _ in range(30)), [])
    assert columnar == rows
    sources = collections.Counter(i // 1000 for i in rows)
    assert sources[0] > sources[1] > sources[2] > 0


@pytest.mark.parametrize('batched', [False, True])
def test_a_loader_over_a_mix_resumes_the_same_sequence(urls, batched):
    def loader():
        return DataLoader(_mix(urls, batched), batch_size=9)

    with loader() as whole:
        batches = iter(whole)
        reference = [next(batches)['id'].tolist() for _ in range(40)]
    with loader() as first:
        batches = iter(first)
        head = [next(batches)['id'].tolist() for _ in range(13)]
        state = first.state_dict()
    with loader() as second:
        second.load_state_dict(state)
        batches = iter(second)
        tail = [next(batches)['id'].tolist() for _ in range(27)]
    assert head + tail == reference


def test_a_shuffled_loader_over_a_finite_mix_never_repeats_a_row_across_a_restore(urls):
    pytest.importorskip('jax')
    from petastorm.jax import DataLoader as JaxLoader

    def loader():
        return JaxLoader(_mix(urls, batched=True, num_epochs=1, weights=(1, 1, 1)), batch_size=8,
                         shuffling_queue_capacity=30)

    with loader() as first:
        batches = iter(first)
        head = [next(batches)['id'].tolist() for _ in range(6)]
        state = first.state_dict()
    with loader() as second:
        second.load_state_dict(state)
        tail = [batch['id'].tolist() for batch in second]
    rows = sum(head + tail, [])
    assert len(rows) == len(set(rows)), 'no row delivered twice'
    assert len(rows) >= ROWS, 'the mix went on until a reader ran out'
