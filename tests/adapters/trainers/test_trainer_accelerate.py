"""Our torch loaders with Hugging Face Accelerate: prepare() keeps them (and their shards), and save_state /
load_state restore the data position exactly, on one process, on two (gloo on CPU) and from two onto one.
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
accelerate = pytest.importorskip('accelerate')
from petastorm.pytorch import DataLoader  # noqa: E402

ROWS = 90


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp('accelerate') / 'ids.parquet'
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32) / ROWS}), str(path), row_group_size=16)
    return f'file://{path}'


def _loader(url, **kwargs):
    kwargs.setdefault('workers_count', 1)
    reader = make_batch_reader(url, seed=5, shuffle_rows=True, num_epochs=2, **kwargs)
    return DataLoader(reader, batch_size=6)


def _train(accelerator, loader, steps=None, save_at=None, directory=None):
    """Steps of a one-weight regression through ``accelerator``; the ids of every batch trained on."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader, 'prepare() hands our loader back: its shards and batches stay as they are'
    if directory is not None and save_at is None:
        accelerator.load_state(directory)
    seen = []
    for batch in prepared:
        loss = ((model(batch['x'].unsqueeze(1)) - 1) ** 2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen.append(batch['id'].tolist())
        if len(seen) == save_at:
            accelerator.save_state(directory)
        if len(seen) == steps:
            break
    return seen


def test_prepare_keeps_the_loader_and_save_state_load_state_resume_it(url, tmp_path):
    accelerator = accelerate.Accelerator(cpu=True)
    with _loader(url) as loader:
        whole = _train(accelerator, loader, save_at=7, directory=str(tmp_path / 'state'))
    assert len(whole) == 30  # 2 epochs of 90 rows
    assert sorted(sum(whole, [])) == sorted(list(range(ROWS)) * 2)
    with _loader(url, workers_count=3, reader_pool_type='thread') as loader:
        rest = _train(accelerate.Accelerator(cpu=True), loader, directory=str(tmp_path / 'state'))
    assert rest == whole[7:], 'the batches the first run had left, at another worker count'


SCRIPT = textwrap.dedent('''
    import json, os, sys
    import accelerate, torch
    from petastorm import make_batch_reader
    from petastorm.pytorch import DataLoader
    sys.path.insert(0, sys.argv[4])
    from test_trainer_accelerate import _train

    url, out, directory = sys.argv[1:4]

    def loader():
        reader = make_batch_reader(url, cur_shard='auto', shard_count='auto', shard_mode='rows', seed=5,
                                   shuffle_rows=True, num_epochs=2, workers_count=1)
        return DataLoader(reader, batch_size=6)

    accelerator = accelerate.Accelerator(cpu=True)
    assert accelerator.num_processes == 2
    with loader() as first:
        whole = _train(accelerator, first, save_at=4, directory=directory)
    with loader() as second:  # a new run in the same processes: a new Accelerator, as a restarted job makes
        rest = _train(accelerate.Accelerator(cpu=True), second, directory=directory)
    with open(out + f'.{accelerator.process_index}', 'w') as f:
        json.dump({'whole': whole, 'rest': rest}, f)
    accelerator.end_training()
    # Leave without the interpreter's teardown. prepare() wrapped the model in DDP, which keeps the gloo group
    # alive past destroy_process_group(); when the last collection at exit frees it, a gloo thread that still
    # holds a finished collective needs the GIL, and torch aborts the process ("terminate called without an
    # active exception", about 1 run in 15 on a loaded machine). Everything this test checks is written above.
    sys.stdout.flush()
    os._exit(0)
''')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_keep_their_shards_and_resume_on_two_and_on_one(url, tmp_path):
    script = tmp_path / 'accelerate_run.py'
    script.write_text(SCRIPT)
    out, directory = str(tmp_path / 'rows'), str(tmp_path / 'state')
    port = _free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    processes = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                   MASTER_PORT=str(port), OMP_NUM_THREADS='1')
        processes.append(subprocess.Popen([sys.executable, str(script), url, out, directory, here], env=env,
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
    assert [p.returncode for p in processes] == [0, 0], '\n'.join(o[-3000:] for o in outputs)
    runs = [json.loads(pathlib.Path(f'{out}.{rank}').read_text()) for rank in range(2)]
    streams = [sum(run['whole'], []) for run in runs]
    assert [len(stream) for stream in streams] == [90, 90]
    for epoch in range(2):  # 45 rows per rank and epoch (a pass of 2 epochs is one stream of batches)
        rows = [i for stream in streams for i in stream[45 * epoch:45 * (epoch + 1)]]
        assert sorted(rows) == list(range(ROWS)), f'epoch {epoch}: the shards are disjoint and cover the data'
    assert [run['rest'] for run in runs] == [run['whole'][4:] for run in runs]

    # One process continues from the state the two wrote (rank 0 saved every rank's position).
    with DataLoader(make_batch_reader(url, shard_mode='rows', cur_shard=0, shard_count=1, seed=5, shuffle_rows=True,
                                      num_epochs=2, workers_count=1), batch_size=6) as loader:
        rest = sum(_train(accelerate.Accelerator(cpu=True), loader, directory=directory), [])
    before = [i for run in runs for batch in run['whole'][:4] for i in batch]
    assert sorted(before + rest) == sorted(list(range(ROWS)) * 2), 'the rest of both epochs, no row lost or repeated'
