"""What each data pipeline keeps under a trainer: epochs, ranks, mid-epoch resume, another world size or workers.

The trainers (Lightning, Accelerate, torchdata, JAX/Grain, Keras) iterate a loader once per epoch and save and
restore its ``state_dict()``; what holds depends on the pipeline they are given. This script measures, on one
small store of 120 numbered rows (8 row groups; batches of 8; shuffled with a seed), for each pipeline:

* multi-epoch: two epochs, each delivers every row exactly once;
* ranks: two ranks' epoch together deliver every row exactly once;
* mid-epoch resume: 5 batches, ``state_dict()``, a new pipeline ``load_state_dict()``, the rest of the epoch:
  every row exactly once (and whether in the uninterrupted order);
* another world size: two ranks save after 5 batches each, one rank continues: the rest is every row not yet
  delivered, once (our loaders take the list of the ranks' states; the others get rank 0's, which is what a
  trainer's checkpoint holds);
* other workers: saved with one worker count, restored with another (the reader's threads for our loaders,
  ``num_workers`` 0 -> 2 for ``StatefulDataLoader``).

Pipelines: ours (``petastorm.pytorch.DataLoader``, which Lightning, Accelerate and Keras take;
``ReaderIterableDataset`` in torchdata's ``StatefulDataLoader``; ``petastorm.jax.DataLoader``, the JAX and Grain
path), a Hugging Face ``datasets`` shuffled ``IterableDataset`` (``split_dataset_by_node`` for ranks) in
``StatefulDataLoader``, and ``StatefulDataLoader`` over a map-style dataset (``DistributedSampler`` for ranks).

Usage: python benchmarks/resume_table.py
"""

from __future__ import annotations

import collections
import functools
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS, BATCH, HEAD = 120, 8, 5
ALL = list(range(ROWS))


def write_store(root: str) -> str:
    path = f'{root}/ids.parquet'
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), path, row_group_size=15)
    return path


class Pipeline:
    """A way of feeding a trainer: ``make(rank, world, workers)`` returns an object a trainer iterates and saves."""

    name = ''

    def make(self, rank: int, world: int, workers: int) -> Any:
        raise NotImplementedError

    def epoch(self, loader: Any, epoch: int) -> Any:
        return iter(loader)

    def restore(self, loader: Any, states: list[Any], rank: int) -> None:
        """Load the saved state(s) of the ranks of a run into ``loader`` (of rank ``rank``)."""
        loader.load_state_dict(states[0])

    def close(self, loader: Any) -> None:
        pass


class OursTorch(Pipeline):
    name = 'petastorm.pytorch.DataLoader'

    def __init__(self, url: str) -> None:
        self.url = url

    def reader(self, rank: int, world: int, workers: int) -> Any:
        from petastorm import make_batch_reader

        return make_batch_reader(self.url, cur_shard=rank, shard_count=world, shard_mode='rows', seed=1,
                                 shuffle_rows=True, workers_count=max(1, workers), reader_pool_type='thread')

    def make(self, rank: int, world: int, workers: int) -> Any:
        from petastorm.pytorch import DataLoader

        return DataLoader(self.reader(rank, world, workers), batch_size=BATCH, shuffling_queue_capacity=16)

    def restore(self, loader: Any, states: list[Any], rank: int) -> None:
        if len(states) == 1:
            loader.load_state_dict(states[0])
        else:  # what a distributed run's state_dict() holds: every rank's position
            loader.load_state_dict({**states[0], 'reader': [s['reader'] for s in states]})

    def close(self, loader: Any) -> None:
        loader.__exit__(None, None, None)


class OursJax(OursTorch):
    name = 'petastorm.jax.DataLoader'

    def make(self, rank: int, world: int, workers: int) -> Any:
        from petastorm.jax import DataLoader

        return DataLoader(self.reader(rank, world, workers), batch_size=BATCH, shuffling_queue_capacity=16)


class OursStateful(OursTorch):
    name = 'ReaderIterableDataset in StatefulDataLoader'

    def make(self, rank: int, world: int, workers: int) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        from petastorm.pytorch import ReaderIterableDataset

        factory = functools.partial(_shard_reader, self.url, rank, world)
        dataset = ReaderIterableDataset(factory if workers else factory(0, 1), batch_size=BATCH)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=workers,
                                  multiprocessing_context='fork' if workers else None)

    def restore(self, loader: Any, states: list[Any], rank: int) -> None:
        loader.load_state_dict(states[0])

    def close(self, loader: Any) -> None:
        dataset = loader.dataset
        if dataset._source is not None:
            dataset.close()


def _shard_reader(url: str, rank: int, world: int, worker: int, workers: int) -> Any:
    from petastorm import make_batch_reader

    return make_batch_reader(url, cur_shard=rank * workers + worker, shard_count=world * workers, shard_mode='rows',
                             seed=1, shuffle_rows=True, workers_count=1)


class HuggingFace(Pipeline):
    name = 'HF datasets IterableDataset in StatefulDataLoader'

    def make(self, rank: int, world: int, workers: int) -> Any:
        import datasets
        from datasets.distributed import split_dataset_by_node
        from torchdata.stateful_dataloader import StatefulDataLoader

        table = datasets.Dataset.from_dict({'id': ALL})
        stream = table.to_iterable_dataset(num_shards=8).shuffle(seed=1, buffer_size=16)
        if world > 1:
            stream = split_dataset_by_node(stream, rank=rank, world_size=world)
        loader = StatefulDataLoader(stream.with_format('torch'), batch_size=BATCH, num_workers=workers)
        loader.stream = stream
        return loader

    def epoch(self, loader: Any, epoch: int) -> Any:
        loader.stream.set_epoch(epoch)
        return iter(loader)


class _Rows:
    def __getitem__(self, index: int) -> dict[str, int]:
        return {'id': index}

    def __len__(self) -> int:
        return ROWS


class MapStyle(Pipeline):
    name = 'StatefulDataLoader over a map-style dataset'

    def make(self, rank: int, world: int, workers: int) -> Any:
        import torch
        from torchdata.stateful_dataloader import StatefulDataLoader

        sampler = torch.utils.data.DistributedSampler(_Rows(), num_replicas=world, rank=rank, shuffle=True, seed=1)
        loader = StatefulDataLoader(_Rows(), batch_size=BATCH, sampler=sampler, num_workers=workers)
        loader.sampler_of_epochs = sampler
        return loader

    def epoch(self, loader: Any, epoch: int) -> Any:
        loader.sampler_of_epochs.set_epoch(epoch)
        return iter(loader)


def _ids(batch: Any) -> list[int]:
    return [int(i) for i in batch['id']]


def _verdict(rows: list[int], expected: list[int]) -> str:
    got, want = collections.Counter(rows), collections.Counter(expected)
    lost, repeated = sum((want - got).values()), sum((got - want).values())
    return 'yes' if not lost and not repeated else f'no: {lost} lost, {repeated} repeated'


def _epoch_rows(pipeline: Pipeline, rank: int, world: int, workers: int, epochs: int = 1) -> list[list[int]]:
    loader = pipeline.make(rank, world, workers)
    try:
        return [sum((_ids(b) for b in pipeline.epoch(loader, epoch)), []) for epoch in range(epochs)]
    finally:
        pipeline.close(loader)


def _head(pipeline: Pipeline, rank: int, world: int, workers: int) -> tuple[list[int], Any]:
    loader = pipeline.make(rank, world, workers)
    try:
        batches = pipeline.epoch(loader, 0)
        head = sum((_ids(next(batches)) for _ in range(HEAD)), [])
        return head, loader.state_dict()
    finally:
        pipeline.close(loader)


def _rest(pipeline: Pipeline, states: list[Any], workers: int) -> list[int]:
    loader = pipeline.make(0, 1, workers)
    try:
        pipeline.restore(loader, states, 0)
        return sum((_ids(b) for b in pipeline.epoch(loader, 0)), [])
    finally:
        pipeline.close(loader)


def multi_epoch(pipeline: Pipeline, workers: int) -> str:
    epochs = _epoch_rows(pipeline, 0, 1, workers, epochs=2)
    verdicts = {_verdict(rows, ALL) for rows in epochs}
    return verdicts.pop() if len(verdicts) == 1 else ' / '.join(sorted(verdicts))


def ranks(pipeline: Pipeline, workers: int) -> str:
    rows = [i for rank in range(2) for i in _epoch_rows(pipeline, rank, 2, workers)[0]]
    return _verdict(rows, ALL)


def resume(pipeline: Pipeline, workers: int, other_workers: int | None = None) -> str:
    whole = _epoch_rows(pipeline, 0, 1, workers)[0]
    head, state = _head(pipeline, 0, 1, workers)
    rest = _rest(pipeline, [state], workers if other_workers is None else other_workers)
    verdict = _verdict(head + rest, ALL)
    if verdict == 'yes':
        verdict += ', same order' if head + rest == whole else ', same rows (buffered ones in another order)'
    return verdict


def world_size(pipeline: Pipeline, workers: int) -> str:
    heads, states = zip(*(_head(pipeline, rank, 2, workers) for rank in range(2)), strict=True)
    rest = _rest(pipeline, list(states), workers)
    return _verdict([i for head in heads for i in head] + rest, ALL)


def _measure(check: Callable[[], str]) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            return check()
    except Exception as err:  # a pipeline that cannot do it says so: that is the measurement
        return f'error: {type(err).__name__}: {str(err).splitlines()[0][:70]}'


def main() -> None:
    url = 'file://' + write_store(tempfile.mkdtemp(prefix='resume_table_'))
    pipelines: list[tuple[Pipeline, str, int, int]] = [
        (OursTorch(url), 'Lightning, Accelerate, Keras (torch)', 1, 3),
        (OursStateful(url), 'torchdata StatefulDataLoader', 0, 2),
        (OursJax(url), 'JAX, Grain', 1, 3),
        (HuggingFace(), 'Lightning, Accelerate, torchdata', 0, 2),
        (MapStyle(), 'Lightning, Accelerate, torchdata', 0, 2),
    ]
    print(f'{ROWS} rows, batches of {BATCH}, resume after {HEAD} batches; "yes": every row exactly once')
    print('| pipeline | trainers | multi-epoch | 2 ranks | mid-epoch resume | 2 ranks -> 1 | other workers |')
    print('|---|---|---|---|---|---|---|')
    for pipeline, trainers, workers, other in pipelines:
        cells = [_measure(lambda p=pipeline, w=workers: multi_epoch(p, w)),
                 _measure(lambda p=pipeline, w=workers: ranks(p, w)),
                 _measure(lambda p=pipeline, w=workers: resume(p, w)),
                 _measure(lambda p=pipeline, w=workers: world_size(p, w)),
                 _measure(lambda p=pipeline, w=workers, o=other: resume(p, w, o))]
        print(f'| {pipeline.name} | {trainers} | ' + ' | '.join(cells) + ' |', flush=True)


if __name__ == '__main__':
    main()
