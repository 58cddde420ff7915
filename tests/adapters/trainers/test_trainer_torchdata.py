"""Our reader inside torchdata: an IterableDataset in StatefulDataLoader (main process and worker processes), and
a torchdata.nodes source node composed with ParallelMapper, Prefetcher and MultiNodeWeightedSampler; every saved
state resumes with exactly the rows an uninterrupted run delivers next.
"""

import functools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader

torch = pytest.importorskip('torch')
nodes = pytest.importorskip('torchdata.nodes')
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from petastorm.pytorch import ReaderIterableDataset  # noqa: E402
from petastorm.torchdata import ReaderNode  # noqa: E402

ROWS = 80


@pytest.fixture(scope='module')
def urls(tmp_path_factory):
    out = []
    for name, offset in (('a', 0), ('b', 1000)):
        path = tmp_path_factory.mktemp('torchdata') / f'{name}.parquet'
        ids = np.arange(offset, offset + ROWS, dtype=np.int64)
        pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), str(path), row_group_size=15)
        out.append(f'file://{path}')
    return out


def _reader(url, **kwargs):
    kwargs.setdefault('workers_count', 1)
    return make_batch_reader(url, seed=2, shuffle_rows=True, **kwargs)


def _ids(batch):
    return [int(i) for i in batch['id']]


def _split(loader, at):
    """The batches of a loader iterated in full, and its state after ``at`` of them (and those ``at``)."""
    batches = iter(loader)
    head = [_ids(next(batches)) for _ in range(at)]
    state = loader.state_dict()
    return head, state, [_ids(b) for b in batches]


@pytest.mark.parametrize('batch_size', [None, 8])
def test_stateful_dataloader_over_the_dataset_resumes_exactly(urls, batch_size):
    def loader():
        dataset = ReaderIterableDataset(_reader(urls[0], num_epochs=1), batch_size=batch_size)
        return StatefulDataLoader(dataset, batch_size=8 if batch_size is None else None)

    head, state, tail = _split(loader(), 4)
    restored = loader()
    restored.load_state_dict(state)
    assert [_ids(b) for b in restored] == tail
    assert sorted(sum(head + tail, [])) == list(range(ROWS))
    assert sorted(sum((_ids(b) for b in restored), [])) == list(range(ROWS)), 'the next epoch is a whole pass'


def test_stateful_dataloader_with_worker_processes_resumes_at_the_same_worker_count(urls):
    def loader():
        factory = functools.partial(_shard_reader, urls[0])
        return StatefulDataLoader(ReaderIterableDataset(factory, batch_size=5), batch_size=None, num_workers=2,
                                  multiprocessing_context='fork')

    whole = [_ids(b) for b in loader()]
    assert sorted(sum(whole, [])) == list(range(ROWS)), 'every worker reads its own shard'
    head, state, tail = _split(loader(), 5)
    restored = loader()
    restored.load_state_dict(state)
    assert [_ids(b) for b in restored] == tail
    assert head + tail == whole


def _shard_reader(url, shard, count):
    return make_batch_reader(url, cur_shard=shard, shard_count=count, shard_mode='rows', seed=2, shuffle_rows=True,
                             workers_count=1)


def _pipeline(urls, mapper=True):
    sources = {name: ReaderNode(_reader(url, num_epochs=None), batch_size=6)
               for name, url in zip('ab', urls, strict=True)}
    node = nodes.MultiNodeWeightedSampler(sources, weights={'a': 0.7, 'b': 0.3}, seed=1)
    if mapper:
        node = nodes.ParallelMapper(node, _double_x, num_workers=2, method='thread')
    return nodes.Loader(nodes.Prefetcher(node, prefetch_factor=3))


def _double_x(batch):
    return {**batch, 'x': batch['x'] * 2}


def test_nodes_pipeline_of_two_readers_resumes_its_exact_sequence(urls):
    whole = _pipeline(urls)
    batches = iter(whole)
    reference = [_ids(next(batches)) for _ in range(30)]
    first = _pipeline(urls)
    batches = iter(first)
    head = [_ids(next(batches)) for _ in range(11)]
    state = first.state_dict()
    second = _pipeline(urls)
    second.load_state_dict(state)
    batches = iter(second)
    tail = [_ids(next(batches)) for _ in range(19)]
    assert head + tail == reference
    rows = sum(reference, [])
    assert any(i < 1000 for i in rows)
    assert any(i >= 1000 for i in rows)
    for node in (whole, first, second):
        _close(node)


def _close(loader):
    for source in loader.root.source.source.source_nodes.values():
        source.close()
