"""Training with pyspark's TorchDistributor: barrier tasks on local[2], each running a torchrun process with gloo on
loopback (CPU), reading its own equal share of the rows.

The Spark Connect variant (a converter of an uneven DataFrame) lives in test_spark_connect.py, next to the Connect
server; this module has the classic session and a dataset written by ``materialize_dataset``, read with
``make_batch_reader`` in one epoch and ``make_reader`` in the other. The training function and the checks are
shared by both.
"""

from __future__ import annotations

import numpy as np
import psutil
import pytest

T = pytest.importorskip('pyspark.sql.types')
pytest.importorskip('torch')
distributor = pytest.importorskip('pyspark.ml.torch.distributor')

from petastorm.codecs import NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.etl.dataset_metadata import load_row_groups, materialize_dataset  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.torch]

EPOCHS = 2
BATCH_SIZE = 64
#: Three Spark partitions of very different sizes: sharding by whole files or row groups would be uneven.
PARTITION_ROWS = (640, 260, 100)
TOTAL_ROWS = sum(PARTITION_ROWS)

Points = Unischema('Points', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('features', np.float32, (2,), NdarrayCodec(), False),
])


def uneven_dataframe(spark):
    """``id`` 0..TOTAL_ROWS-1 and ``x`` in three partitions of PARTITION_ROWS rows (so three uneven files)."""
    first, second = PARTITION_ROWS[0], PARTITION_ROWS[0] + PARTITION_ROWS[1]
    bucket = f'CASE WHEN id < {first} THEN 0 WHEN id < {second} THEN 1 ELSE 2 END AS bucket'
    return (spark.range(TOTAL_ROWS).selectExpr('id', 'CAST(id AS FLOAT) / 1000 AS x', bucket)
            .repartitionByRange(3, 'bucket').drop('bucket'))


def _train(open_epoch, ids_and_inputs):
    """One torchrun process: DDP over gloo, EPOCHS epochs; every rank's (rank, steps, ids) per epoch, gathered."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        epochs = []
        for epoch in range(EPOCHS):
            steps, ids = 0, []
            with open_epoch(epoch) as batches:
                for batch in batches:
                    batch_ids, inputs = ids_and_inputs(batch)
                    optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(inputs), 2 * inputs + 1)
                    loss.backward()  # all-reduces the gradients: a rank with a step more would wait here forever
                    optimizer.step()
                    steps += 1
                    ids.extend(int(i) for i in batch_ids)
            epochs.append((steps, ids))
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (dist.get_rank(), epochs))
        # Older torch (2.1, the floor) destroys a gloo process group holding the GIL and joins its threads, while a
        # thread may still need the GIL to free the gather's tensors: a deadlock when this frame lets go of the DDP
        # model. A barrier and a pause without the GIL let those threads finish first.
        dist.barrier()
        time.sleep(0.2)
        return gathered
    finally:
        dist.destroy_process_group()


def train_on_converter(converter):
    """TorchDistributor's train function for a converter: the loader finds the rank that TorchDistributor set."""

    def open_epoch(epoch):
        return converter.make_torch_dataloader(batch_size=BATCH_SIZE, num_epochs=1, workers_count=2,
                                               cur_shard='auto', shard_mode='rows')

    def ids_and_inputs(batch):
        return batch['id'].tolist(), batch['x'].reshape(-1, 1)

    return _train(open_epoch, ids_and_inputs)


def train_on_dataset(url):
    """TorchDistributor's train function for a Petastorm dataset: batches in epoch 0, rows in epoch 1."""
    import contextlib

    import torch

    from petastorm import make_batch_reader, make_reader

    shard = {'cur_shard': 'auto', 'shard_mode': 'rows', 'seed': 11, 'workers_count': 2}

    @contextlib.contextmanager
    def open_epoch(epoch):
        if epoch == 0:
            with make_batch_reader(url, **shard) as reader:
                yield _in_batches((batch.id, batch.features) for batch in reader)
        else:
            with make_reader(url, **shard) as reader:
                yield _in_batches((np.array([row.id]), row.features[np.newaxis]) for row in reader)

    def ids_and_inputs(batch):
        ids, features = batch
        return ids.tolist(), torch.as_tensor(features[:, :1])

    return _train(open_epoch, ids_and_inputs)


def _in_batches(chunks):
    """Batches of BATCH_SIZE rows (the last one shorter) from (ids, features) chunks of any length."""
    ids, features = np.empty(0, np.int64), np.empty((0, 2), np.float32)
    for chunk_ids, chunk_features in chunks:
        ids, features = np.concatenate([ids, chunk_ids]), np.concatenate([features, chunk_features])
        while len(ids) >= BATCH_SIZE:
            yield ids[:BATCH_SIZE], features[:BATCH_SIZE]
            ids, features = ids[BATCH_SIZE:], features[BATCH_SIZE:]
    if len(ids):
        yield ids, features


def check_equal_shares(gathered, total_rows):
    """Every rank ran as many steps as the others and each epoch read every row exactly once; the steps per rank."""
    assert sorted(rank for rank, _ in gathered) == [0, 1]
    steps_per_rank = {}
    for epoch in range(EPOCHS):
        steps = [epochs[epoch][0] for _, epochs in gathered]
        assert len(set(steps)) == 1, f'epoch {epoch}: steps per rank {steps}'
        ids = sorted(i for _, epochs in gathered for i in epochs[epoch][1])
        assert ids == list(range(total_rows)), f'epoch {epoch}: not every row exactly once'
        per_rank = [len(epochs[epoch][1]) for _, epochs in gathered]
        assert per_rank == [total_rows // 2] * 2
        steps_per_rank[epoch] = steps[0]
    return steps_per_rank


def torch_processes_left():
    """Descendants of this process still running a torchrun wrapper or a training script."""
    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = ' '.join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if 'torch_run_process_wrapper' in command or 'torch.distributed' in command or 'train.py' in command:
            left.append(command)
    return left


def run_distributed(train_fn, *args):
    result = distributor.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train_fn, *args)
    assert torch_processes_left() == []
    return result


def test_torch_distributor_reads_materialized_dataset_in_equal_shares(spark, tmp_path):
    url = f'file://{tmp_path}/points'
    rows = [dict_to_spark_row(Points, {'id': i, 'features': np.array([i / 1000, -i], np.float32)})
            for i in range(TOTAL_ROWS)]
    context = spark.sparkContext
    bounds = np.cumsum((0, *PARTITION_ROWS))
    uneven = context.union([context.parallelize(rows[a:b], 1) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    with materialize_dataset(spark, url, Points, row_group_size_mb=0.005):
        spark.createDataFrame(uneven, Points.as_spark_schema()).write.parquet(url)
    row_groups = load_row_groups(url)
    assert len({piece.path for piece in row_groups}) == 3
    assert len(row_groups) > 3

    gathered = run_distributed(train_on_dataset, url)

    steps = check_equal_shares(gathered, TOTAL_ROWS)
    assert steps == {0: 8, 1: 8}  # ceil(500 / 64) in both epochs
