"""Our torch loaders inside PyTorch Lightning's Trainer, as a user hands them over: every row of every epoch once,
validation every epoch, limit_train_batches, and a mid-epoch checkpoint that ckpt_path= resumes exactly.

Each model records the row ids of the batches its training_step saw, so the tests compare sequences of rows.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader

torch = pytest.importorskip('torch')
lightning = pytest.importorskip('lightning')
from petastorm.pytorch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning', 'ignore::DeprecationWarning')

ROWS = 100
BATCH = 8  # 13 batches per epoch, the last of 4 rows


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp('lightning') / 'ids.parquet'
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32) / ROWS}), str(path), row_group_size=17)
    return f'file://{path}'


def _reader(url, **kwargs):
    kwargs.setdefault('seed', 3)
    kwargs.setdefault('shuffle_rows', True)
    kwargs.setdefault('workers_count', 1)
    return make_batch_reader(url, **kwargs)


class Recorder(lightning.LightningModule):
    """A one-weight regression that keeps the ids of every batch it trained and validated on."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.trained, self.validated = [], []

    def training_step(self, batch, batch_index):
        self.trained.append(batch['id'].tolist())
        return ((self.layer(batch['x'].unsqueeze(1)) - 1) ** 2).mean()

    def validation_step(self, batch, batch_index):
        self.validated.append(batch['id'].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(**kwargs):
    kwargs.setdefault('logger', False)
    kwargs.setdefault('enable_checkpointing', False)
    kwargs.setdefault('enable_progress_bar', False)
    kwargs.setdefault('enable_model_summary', False)
    return lightning.Trainer(accelerator='cpu', devices=1, **kwargs)


def _reference(url, passes, **kwargs):
    """The batches of ``passes`` passes of a loader iterated by hand."""
    with DataLoader(_reader(url, **kwargs), batch_size=BATCH) as loader:
        return [[b['id'].tolist() for b in loader] for _ in range(passes)]


def test_fit_runs_every_epoch_over_every_row_and_validates_every_epoch(url):
    train = DataLoader(_reader(url, num_epochs=1), batch_size=BATCH)
    val = BatchedDataLoader(_reader(url, num_epochs=1, shuffle_rows=False), batch_size=32)
    model = Recorder()
    with train, val:
        _trainer(max_epochs=3).fit(model, train_dataloaders=train, val_dataloaders=val)
    expected = _reference(url, 3, num_epochs=1)
    assert model.trained == [batch for epoch in expected for batch in epoch], 'the reader order of 3 passes'
    # 2 sanity-check batches (the trainer then leaves that pass), then 3 whole validation passes.
    assert len(model.validated) == 2 + 3 * 4
    for run in range(3):
        assert sorted(sum(model.validated[2 + 4 * run: 6 + 4 * run], [])) == list(range(ROWS))


def test_limit_train_batches_starts_a_pass_per_epoch_or_continues_an_endless_reader(url):
    model = Recorder()
    with DataLoader(_reader(url, num_epochs=1), batch_size=BATCH) as loader:
        _trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=0).fit(model, train_dataloaders=loader)
    expected = _reference(url, 3, num_epochs=1)
    assert model.trained == [batch for epoch in expected for batch in epoch[:4]], 'each epoch a new pass'

    model = Recorder()
    with DataLoader(_reader(url, num_epochs=None), batch_size=BATCH) as loader:
        _trainer(max_epochs=4, limit_train_batches=5, limit_val_batches=0).fit(model, train_dataloaders=loader)
    with DataLoader(_reader(url, num_epochs=None), batch_size=BATCH) as endless:
        batches = iter(endless)
        expected = [next(batches)['id'].tolist() for _ in range(20)]
    assert model.trained == expected, 'epochs of 5 batches continue one endless stream'


class _CheckpointAt(lightning.Callback):
    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.parametrize(('capacity', 'workers'), [(0, 3), (30, 1)])
def test_a_mid_epoch_checkpoint_resumes_the_data_position_with_ckpt_path(url, tmp_path, capacity, workers):
    def loader(workers_count):
        return DataLoader(_reader(url, num_epochs=1, workers_count=workers_count, reader_pool_type='thread'),
                          batch_size=BATCH, shuffling_queue_capacity=capacity)

    checkpoint = str(tmp_path / 'mid.ckpt')
    whole = Recorder()
    with loader(1) as train:
        _trainer(max_epochs=2, limit_val_batches=0, callbacks=[_CheckpointAt(18, checkpoint)]).fit(whole, train)
    assert len(whole.trained) == 26
    resumed = Recorder()
    with loader(workers) as train:  # a new process would make the same loader; another worker count is fine
        _trainer(max_epochs=2, limit_val_batches=0).fit(resumed, train, ckpt_path=checkpoint)
    assert len(resumed.trained) == 26 - 18
    if capacity:  # rows held in the shuffling buffer are read again: the same rows, in another order
        assert sorted(sum(resumed.trained, [])) == sorted(sum(whole.trained[18:], []))
    else:
        assert resumed.trained == whole.trained[18:], 'exactly the batches the uninterrupted run had left'


def test_inmem_loader_under_default_checkpointing_resumes_the_served_epochs(url, tmp_path):
    # Lightning's default Trainer saves a checkpoint (with the loader's state_dict) at every epoch end.
    def loader():
        return InMemBatchedDataLoader(_reader(url, num_epochs=1, shuffle_rows=False), batch_size=BATCH,
                                      shuffle=True, seed=4, rows_capacity=ROWS)

    def fit(max_epochs, root, **kwargs):
        model = Recorder()
        _trainer(max_epochs=max_epochs, limit_val_batches=0, enable_checkpointing=True, default_root_dir=root,
                 callbacks=kwargs.pop('callbacks', [])).fit(model, loader(), **kwargs)
        return model.trained

    mid = str(tmp_path / 'mid.ckpt')
    whole = fit(3, tmp_path / 'whole', callbacks=[_CheckpointAt(18, mid)])
    assert len(whole) == 3 * 13
    epochs = [sorted(sum(whole[13 * e:13 * (e + 1)], [])) for e in range(3)]
    assert epochs == [list(range(ROWS))] * 3, 'every row once an epoch'
    assert whole[:13] != whole[13:26], 'reshuffled every epoch'
    assert fit(1, tmp_path / 'first') == whole[:13]
    [epoch_end] = (tmp_path / 'first' / 'checkpoints').glob('*.ckpt')
    assert fit(3, tmp_path / 'after_epoch', ckpt_path=str(epoch_end)) == whole[13:], 'the next epochs'
    assert fit(3, tmp_path / 'after_step', ckpt_path=mid) == whole[18:], 'exactly the batches left'


# A LightningDataModule making a sharded reader per rank, for the DDP run below (2 processes, gloo on CPU): a run
# that saves a checkpoint after 5 steps, then (in the same processes) a run resumed from it.
DDP_SCRIPT = textwrap.dedent('''
    import json, sys
    import lightning, torch
    from petastorm import make_batch_reader
    from petastorm.pytorch import DataLoader
    sys.path.insert(0, sys.argv[4])
    from test_trainer_lightning import Recorder, _CheckpointAt

    url, out, checkpoint = sys.argv[1:4]

    class Data(lightning.LightningDataModule):
        def train_dataloader(self):
            reader = make_batch_reader(url, cur_shard='auto', shard_count='auto', shard_mode='rows', seed=3,
                                       shuffle_rows=True, workers_count=1)
            return DataLoader(reader, batch_size=4)

    runs = {}
    for run in ('first', 'resumed'):
        model = Recorder()
        callbacks = [_CheckpointAt(5, checkpoint)] if run == 'first' else []
        trainer = lightning.Trainer(accelerator='cpu', devices=2, strategy='ddp', max_epochs=2, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                    limit_val_batches=0, callbacks=callbacks)
        trainer.fit(model, datamodule=Data(), ckpt_path=checkpoint if run == 'resumed' else None)
        runs[run] = model.trained
    with open(out + f'.{trainer.global_rank}', 'w') as f:
        json.dump(runs, f)
''')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _run_ranks(script, args, world):
    port = _free_port()
    processes = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), NODE_RANK='0',
                   MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), OMP_NUM_THREADS='1')
        processes.append(subprocess.Popen([sys.executable, str(script), *args], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=240)[0].decode(errors='replace'))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0] * world, '\n'.join(o[-3000:] for o in outputs)


@pytest.mark.slow
def test_ddp_on_two_processes_with_our_shards_resumes_at_the_same_and_another_world_size(url, tmp_path):
    script = tmp_path / 'ddp_fit.py'
    script.write_text(DDP_SCRIPT)
    here = os.path.dirname(os.path.abspath(__file__))
    checkpoint, out = str(tmp_path / 'ddp.ckpt'), str(tmp_path / 'rows')
    _run_ranks(script, [url, out, checkpoint, here], 2)
    runs = [json.loads(pathlib.Path(f'{out}.{rank}').read_text()) for rank in range(2)]
    whole = [rank['first'] for rank in runs]
    for epoch in range(2):  # 50 rows per rank and epoch: 13 batches, the last of 2 rows
        rows = [i for rank in whole for batch in rank[13 * epoch:13 * (epoch + 1)] for i in batch]
        assert sorted(rows) == list(range(ROWS)), f'epoch {epoch}: the two shards are disjoint and cover the data'
    assert [rank['resumed'] for rank in runs] == [rank[5:] for rank in whole], \
        'each rank continues its own shard from the one checkpoint rank 0 wrote'

    # One process continues the two ranks' run: the rest of epoch 0 is what neither rank had trained on.
    model = Recorder()
    with DataLoader(make_batch_reader(url, cur_shard=0, shard_count=1, shard_mode='rows', seed=3, shuffle_rows=True,
                                      workers_count=1), batch_size=4) as loader:
        _trainer(max_epochs=2, limit_val_batches=0).fit(model, loader, ckpt_path=checkpoint)
    trained_before = [i for rank in whole for batch in rank[:5] for i in batch]
    rest = [i for batch in model.trained for i in batch]
    assert sorted(trained_before + rest[:ROWS - len(trained_before)]) == list(range(ROWS))
    assert sorted(rest[ROWS - len(trained_before):]) == list(range(ROWS)), 'then a whole epoch'
