"""JAX and Grain: petastorm.jax's loader in a small JAX training loop (numpy batches, device placement, global
arrays, an exact saved position), cur_shard='auto' per JAX process, and a Grain pipeline over our reader
checkpointed with Grain's own CheckpointHandler.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader

jax = pytest.importorskip('jax')
grain = pytest.importorskip('grain')
import jax.numpy as jnp  # noqa: E402
from etils import epath  # noqa: E402

from petastorm.jax import DataLoader, ReaderIterDataset  # noqa: E402

ROWS = 96


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp('jax') / 'xy.parquet'
    ids = np.arange(ROWS, dtype=np.int64)
    x = (ids % 12).astype(np.float32) / 12
    pq.write_table(pa.table({'id': ids, 'x': x, 'y': 3 * x + 1}), str(path), row_group_size=20)
    return f'file://{path}'


def _reader(url, **kwargs):
    kwargs.setdefault('workers_count', 1)
    return make_batch_reader(url, seed=6, shuffle_rows=True, **kwargs)


def test_a_jax_training_loop_over_the_loader_sees_every_row_every_epoch_and_learns(url):
    @jax.jit
    def step(params, x, y):
        def loss(p):
            return jnp.mean((p[0] * x + p[1] - y) ** 2)
        return params - 0.5 * jax.grad(loss)(params)

    params = jnp.zeros(2)
    epochs = []
    with DataLoader(_reader(url, num_epochs=1), batch_size=16, device=jax.devices()[0]) as loader:
        assert len(loader) == 6
        for _ in range(30):
            seen = []
            for batch in loader:
                assert isinstance(batch['x'], jax.Array)
                params = step(params, batch['x'], batch['y'])
                seen += np.asarray(batch['id']).tolist()
            epochs.append(seen)
    assert all(sorted(seen) == list(range(ROWS)) for seen in epochs)
    assert epochs[0] != epochs[1], 'every epoch in its own order'
    np.testing.assert_allclose(np.asarray(params), [3, 1], atol=0.1)


def test_the_position_resumes_exactly_and_batches_can_be_global_arrays(url):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def loader(**kwargs):
        return DataLoader(_reader(url, num_epochs=2), batch_size=10, **kwargs)

    with loader() as whole:
        reference = [batch['id'].tolist() for batch in whole]
    with loader() as first:
        batches = iter(first)
        head = [next(batches)['id'].tolist() for _ in range(7)]
        state = first.state_dict()
    with loader(sharding=sharding) as second:
        second.load_state_dict(state)
        tail = [np.asarray(batch['id']).tolist() for batch in second]
        assert isinstance(next(iter(second))['id'], jax.Array)
    assert head + tail == reference


PROCESS = textwrap.dedent('''
    import json, sys
    import jax
    port, index, url = sys.argv[1:4]
    jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}', num_processes=2, process_id=int(index))
    from petastorm import make_batch_reader
    from petastorm.jax import DataLoader
    reader = make_batch_reader(url, cur_shard='auto', shard_mode='rows', seed=6, shuffle_rows=True, workers_count=1)
    with DataLoader(reader, batch_size=10) as loader:
        ids = [i for batch in loader for i in batch['id'].tolist()]
    print(json.dumps({'process': jax.process_index(), 'source': reader.diagnostics['shard_source'], 'ids': ids}))
    jax.distributed.shutdown()
''')


@pytest.mark.slow
def test_every_jax_process_reads_its_own_shard_with_cur_shard_auto(url, tmp_path):
    script = tmp_path / 'process.py'
    script.write_text(PROCESS)
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    processes = [subprocess.Popen([sys.executable, str(script), str(port), str(index), url], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS='1'))
                 for index in range(2)]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=120))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r['process'] for r in results] == [0, 1]
    assert {r['source'] for r in results} == {'jax'}
    assert [len(r['ids']) for r in results] == [ROWS // 2] * 2
    assert sorted(results[0]['ids'] + results[1]['ids']) == list(range(ROWS))


@pytest.mark.parametrize('batch_size', [None, 8])
def test_a_grain_pipeline_resumes_from_grains_checkpoint_handler(url, tmp_path, batch_size):
    def pipeline():
        dataset = ReaderIterDataset(_reader(url, num_epochs=2), batch_size=batch_size)
        if batch_size is None:
            dataset = dataset.batch(8)  # Grain batches the rows
        return dataset.map(lambda batch: {**batch, 'x2': batch['x'] * 2})

    reference = [batch['id'].tolist() for batch in pipeline()]
    assert sorted(sum(reference, [])) == sorted(list(range(ROWS)) * 2)
    iterator = iter(pipeline())
    head = [next(iterator)['id'].tolist() for _ in range(9)]
    handler = grain.checkpoint.CheckpointHandler()
    directory = epath.Path(tmp_path / 'grain')
    directory.mkdir()
    handler.save(directory, iterator)
    restored = handler.restore(directory, iter(pipeline()))
    assert head + [batch['id'].tolist() for batch in restored] == reference
