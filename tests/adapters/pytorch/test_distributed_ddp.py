"""A real data-parallel run: 4 processes, torch.distributed with gloo on the loopback, DDP over equal row shards.

The dataset's row groups have uneven sizes, so Petastorm's whole-row-group sharding would give the ranks
different numbers of batches and the last collective of an epoch would wait forever. With ``shard_mode='rows'``
every rank trains the same number of steps and the run ends.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from petastorm import make_batch_reader
from support.uneven_parquet import UNEVEN_ROWS, write_uneven_parquet

WORLD = 4
ROWS = UNEVEN_ROWS

WORKER = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    url, out = sys.argv[1], sys.argv[2]
    dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    reader = make_batch_reader(url, cur_shard='auto', shard_count='auto', shard_mode='rows', seed=7,
                               shuffle_rows=True, workers_count=1)
    steps, ids = [], []
    with BatchedDataLoader(reader, batch_size=5) as loader:
        for epoch in range(2):
            count = 0
            for batch in loader:
                x = batch['x'].unsqueeze(1)
                loss = ((model(x) - 2 * x) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                count += 1
                ids.extend(batch['id'].tolist())
            steps.append(count)
        expected = len(loader)
    weight = float(next(model.parameters()).detach().reshape(-1)[0])
    with open(out, 'w') as f:
        json.dump({'rank': dist.get_rank(), 'steps': steps, 'len': expected, 'ids': ids, 'weight': weight,
                   'source': reader.diagnostics['shard_source']}, f)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: DDP keeps the gloo group alive past destroy_process_group(), and
    # freed by the last collection at exit, a gloo thread that needs the GIL then makes torch abort the process
    # ("terminate called without an active exception"). Everything the test checks is written above.
    sys.stdout.flush()
    os._exit(0)
''')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def uneven_url(tmp_path_factory):
    return write_uneven_parquet(tmp_path_factory.mktemp('ddp'), partitioned=False)


def test_row_group_shards_of_this_dataset_are_unequal(uneven_url):
    counts = []
    for rank in range(WORLD):
        with make_batch_reader(uneven_url, cur_shard=rank, shard_count=WORLD, workers_count=1) as reader:
            counts.append(reader.num_rows_per_epoch)
    assert sum(counts) == ROWS
    assert len(set(counts)) > 1, 'the dataset must make whole-row-group sharding uneven'


@pytest.mark.slow
def test_ddp_on_four_processes_trains_equal_steps_without_stalling(uneven_url, tmp_path):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    port = _free_port()
    processes = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR='127.0.0.1',
                   MASTER_PORT=str(port), OMP_NUM_THREADS='1')
        processes.append(subprocess.Popen([sys.executable, str(script), uneven_url, str(tmp_path / f'{rank}.json')],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=300)[0].decode(errors='replace'))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0] * WORLD, '\n'.join(outputs)
    results = [json.loads((tmp_path / f'{rank}.json').read_text()) for rank in range(WORLD)]
    assert [r['rank'] for r in results] == list(range(WORLD))
    assert {r['source'] for r in results} == {'torch.distributed'}
    steps = [r['steps'] for r in results]
    assert steps == [[5, 5]] * WORLD, 'every rank: ceil(25 rows / 5) steps per epoch'
    assert all(r['len'] == 5 for r in results)
    assert len({r['weight'] for r in results}) == 1, 'DDP kept the replicas identical'
    for epoch in range(2):
        seen = [i for r in results for i in r['ids'][epoch * 25:(epoch + 1) * 25]]
        assert set(seen) == set(range(ROWS)), f'epoch {epoch} covers the dataset'
        assert len(seen) - ROWS == 1, 'one row repeated to pad 99 rows to 4 x 25'
