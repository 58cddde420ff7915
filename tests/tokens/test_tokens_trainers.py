"""The token loader in real trainers: DDP on two gloo processes (equal steps on uneven shares, a gathered position
restored on another world size), two JAX processes of a Grain dataset stopping at the same step, Lightning's fit
resumed mid-epoch with ``ckpt_path=``, and Grain's checkpoint handler.
"""

import collections
import json
import textwrap

import numpy as np
import pytest

from support.rank_processes import run_ranks
from support.token_corpus import batch_tokens, expected_tokens, lognormal_lengths, write_corpus

torch = pytest.importorskip('torch')
from petastorm.tokens import make_token_dataset, make_token_loader  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning', 'ignore::DeprecationWarning')

SEQ = 16
# Documents of very different lengths: two equal shares of documents hold unequal tokens.
LENGTHS = np.concatenate([lognormal_lengths(50, median=8, seed=1, longest=40),
                          lognormal_lengths(50, median=40, seed=2, longest=200)])


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp('trainers') / 'docs.parquet', LENGTHS, row_group_size=50)


DDP_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist
    from petastorm.tokens import make_token_loader

    url, out = sys.argv[1], sys.argv[2]
    dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Embedding(1 << 20, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    runs = {}
    with make_token_loader(url, seq_len=16, batch_size=2, cur_shard='auto', shard_count='auto', seed=3,
                           workers_count=1) as loader:
        for name in ('whole', 'saved'):
            tokens, steps = [], 0
            for batch in loader:
                loss = model(batch['input_ids'] % (1 << 20)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                ids = batch['input_ids']
                tokens += ids[ids != 0].tolist()
                steps += 1
                if name == 'saved' and steps == 4:
                    state = loader.state_dict()  # every rank calls it: the position of both ranks
                    break
            runs[name] = {'steps': steps, 'tokens': tokens}
    runs['state'] = state
    with open(out + f'.{dist.get_rank()}', 'w') as f:
        json.dump(runs, f)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: DDP keeps the gloo group alive past destroy_process_group(), and
    # freed by the last collection at exit, a gloo thread that needs the GIL then makes torch abort the process
    # ("terminate called without an active exception"). Everything the test checks is written above.
    sys.stdout.flush()
    os._exit(0)
''')


@pytest.mark.slow
def test_ddp_ranks_stop_at_the_same_step_and_their_position_continues_on_one_rank(url, tmp_path):
    script = tmp_path / 'ddp_tokens.py'
    script.write_text(DDP_SCRIPT)
    out = tmp_path / 'ddp.json'
    run_ranks(str(script), [url, str(out)], 2)
    runs = [json.loads((tmp_path / f'ddp.json.{rank}').read_text()) for rank in range(2)]
    alone = []
    for rank in range(2):  # without agreeing, the two shares would give different step counts
        with make_token_loader(url, seq_len=SEQ, batch_size=2, cur_shard=rank, shard_count=2, seed=3,
                               workers_count=1) as loader:
            alone.append(sum(1 for _ in loader))
    assert alone[0] != alone[1]
    assert runs[0]['whole']['steps'] == runs[1]['whole']['steps'] == min(alone)
    whole = collections.Counter(t for run in runs for t in run['whole']['tokens'])
    assert max(whole.values()) == 1
    assert set(whole) <= set(expected_tokens(LENGTHS))
    state = runs[0]['state']
    assert state == runs[1]['state']
    assert [one['shard'] for one in state['ranks']] == [0, 1]
    delivered = collections.Counter(t for run in runs for t in run['saved']['tokens'])
    with make_token_loader(url, seq_len=SEQ, batch_size=2, seed=3, workers_count=1) as loader:
        loader.load_state_dict(state)  # the two ranks' position, continued on one
        delivered.update(t for batch in loader for t in batch_tokens(batch))
    assert delivered == expected_tokens(LENGTHS)


JAX_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import jax
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{os.environ['MASTER_PORT']}", num_processes=2,
                               process_id=int(os.environ['RANK']))
    from petastorm.tokens import make_token_dataset

    url, out = sys.argv[1], sys.argv[2]
    with make_token_dataset(url, seq_len=16, batch_size=2, cur_shard='auto', shard_count='auto', seed=3,
                            workers_count=1) as dataset:
        steps = [[int(t) for t in batch['input_ids'][batch['input_ids'] != 0]] for batch in dataset]
    with open(out + f'.{jax.process_index()}', 'w') as f:
        json.dump(steps, f)
    jax.distributed.shutdown()
''')


@pytest.mark.slow
def test_jax_processes_of_a_grain_dataset_stop_at_the_same_step(url, tmp_path):
    pytest.importorskip('jax')
    pytest.importorskip('grain')
    script = tmp_path / 'jax_tokens.py'
    script.write_text(JAX_SCRIPT)
    run_ranks(str(script), [url, str(tmp_path / 'jax.json')], 2)
    runs = [json.loads((tmp_path / f'jax.json.{rank}').read_text()) for rank in range(2)]
    alone = []
    for rank in range(2):  # without agreeing, the two shares would give different step counts
        with make_token_dataset(url, seq_len=SEQ, batch_size=2, cur_shard=rank, shard_count=2, seed=3,
                                workers_count=1) as dataset:
            alone.append([batch_tokens(batch) for batch in dataset])
    assert len(alone[0]) != len(alone[1])
    steps = min(len(one) for one in alone)
    assert len(runs[0]) == len(runs[1]) == steps
    assert runs == [one[:steps] for one in alone], 'each process its own share, cut at the common step'


@pytest.fixture
def lightning():
    return pytest.importorskip('lightning')


def _recorder(lightning):
    class Recorder(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(1 << 20, 2)
            self.trained = []

        def training_step(self, batch, batch_index):
            self.trained.append(batch['input_ids'].tolist())
            return self.embedding(batch['input_ids'] % (1 << 20)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Recorder()


def _checkpoint_at(lightning, step, path):
    class CheckpointAt(lightning.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_index):
            if trainer.global_step == step:
                trainer.save_checkpoint(path)

    return CheckpointAt()


def _trainer(lightning, **kwargs):
    return lightning.Trainer(accelerator='cpu', devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, **kwargs)


def test_lightning_fit_resumes_mid_epoch_from_ckpt_path(url, tmp_path, lightning):
    # steps_per_epoch gives the loader a len(): Lightning then does not read a batch ahead (which a checkpoint
    # taken mid-epoch would miss). The pass goes on over the epochs.
    def loader():
        return make_token_loader(url, seq_len=SEQ, batch_size=3, packing='first_fit', shuffle_buffer=4, seed=2,
                                 workers_count=1, num_epochs=None, steps_per_epoch=12)

    checkpoint = str(tmp_path / 'mid.ckpt')
    whole = _recorder(lightning)
    with loader() as train:
        _trainer(lightning, callbacks=[_checkpoint_at(lightning, 7, checkpoint)]).fit(whole, train)
    assert len(whole.trained) == 2 * 12
    resumed = _recorder(lightning)
    with loader() as train:
        _trainer(lightning).fit(resumed, train, ckpt_path=checkpoint)
    assert resumed.trained == whole.trained[7:], 'exactly the batches the uninterrupted run had left'


def test_grains_checkpoint_handler_saves_and_restores_the_position(url, tmp_path):
    grain = pytest.importorskip('grain')
    from etils import epath

    def pipeline():
        return make_token_dataset(url, seq_len=SEQ, batch_size=2, packing='concat', seed=4, workers_count=1,
                                  num_epochs=2).map(lambda batch: {**batch, 'sum': batch['input_ids'].sum()})

    reference = [batch['input_ids'].tolist() for batch in pipeline()]
    iterator = iter(pipeline())
    head = [next(iterator)['input_ids'].tolist() for _ in range(9)]
    handler = grain.checkpoint.CheckpointHandler()
    directory = epath.Path(tmp_path / 'grain')
    directory.mkdir()
    handler.save(directory, iterator)
    restored = handler.restore(directory, iter(pipeline()))
    assert head + [batch['input_ids'].tolist() for batch in restored] == reference
