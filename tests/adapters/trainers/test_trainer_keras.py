"""Keras 3 model.fit on our data: a tf.data dataset on the TensorFlow backend, our torch DataLoader on the torch
backend and our JAX loader on the JAX backend (each backend in its own process), epochs=3 with
steps_per_epoch from len(); every epoch trains on every row once.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from petastorm import make_reader, write_dataset
from petastorm.codecs import ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

pa = pytest.importorskip('pyarrow')
keras = pytest.importorskip('keras')

ROWS = 64
Schema = Unischema('KerasXY', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                               UnischemaField('x', np.float32, (), ScalarCodec(pa.float32()), False),
                               UnischemaField('y', np.float32, (), ScalarCodec(pa.float32()), False)])


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    url = f'file://{tmp_path_factory.mktemp("keras")}/xy'
    rows = ({'id': i, 'x': (i % 8) / 8, 'y': 2 * (i % 8) / 8 - 1} for i in range(ROWS))
    write_dataset(url, Schema, rows, row_group_size_mb=0.001)
    return url


class _Ids(keras.callbacks.Callback):
    """Counts the batches of every epoch (Keras sees no ids: the data pipeline records them)."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1] += 1


def test_tensorflow_backend_fits_a_tf_data_dataset_for_three_epochs(url):
    if keras.backend.backend() != 'tensorflow':
        pytest.skip('this process runs Keras on another backend')
    import tensorflow as tf

    from petastorm.tf_utils import make_petastorm_dataset

    seen = []

    def record(ids):
        seen.append(ids.numpy().tolist())
        return ids

    # Keras keeps one iterator of a tf.data dataset across the epochs of fit(steps_per_epoch=...): the reader
    # gives the passes (num_epochs=3), steps_per_epoch the batches of one of them.
    with make_reader(url, seed=1, shuffle_rows=True, num_epochs=3, workers_count=1) as reader:
        steps = reader.num_rows_per_epoch // 16
        dataset = make_petastorm_dataset(reader).batch(16).map(
            lambda b: (tf.py_function(record, [b.id], tf.int64), b.x, b.y)).map(lambda i, x, y: (x[:, None], y))
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss='mse')
        counter = _Ids()
        history = model.fit(dataset, epochs=3, steps_per_epoch=steps, verbose=0, callbacks=[counter])
    assert counter.batches == [steps] * 3
    assert len(seen) == 3 * steps
    for epoch in range(3):
        assert sorted(sum(seen[epoch * steps:(epoch + 1) * steps], [])) == list(range(ROWS))
    assert history.history['loss'][-1] < history.history['loss'][0]


SCRIPT = textwrap.dedent('''
    import json, sys
    import keras
    import numpy as np
    from petastorm import make_batch_reader, make_reader
    from petastorm.transform import TransformSpec

    url, out = sys.argv[1:3]
    seen = []
    if keras.backend.backend() == 'torch':
        from petastorm.pytorch import DataLoader

        def as_xy(row):  # a tuple row: the loader yields [x, y] batches, which Keras takes as (x, y)
            seen.append(int(row['id']))
            return np.array([row['x']], np.float32), np.float32(row['y'])

        spec = TransformSpec(as_xy, edit_fields=[('x', np.float32, (1,), False)], selected_fields=['x', 'y'])
        loader = DataLoader(make_reader(url, seed=1, shuffle_rows=True, num_epochs=1, reader_pool_type='dummy',
                                       transform_spec=spec), batch_size=8)
        data = loader
    else:
        from petastorm.jax import DataLoader

        loader = DataLoader(make_batch_reader(url, seed=1, shuffle_rows=True, num_epochs=1, workers_count=1),
                            batch_size=8)

        def batches():
            while True:
                for batch in loader:
                    seen.extend(batch['id'].tolist())
                    yield batch['x'][:, None], batch['y']
        data = batches()
    with loader:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss='mse')
        history = model.fit(data, epochs=3, steps_per_epoch=len(loader), verbose=0)
    with open(out, 'w') as f:
        json.dump({'seen': seen, 'steps': len(loader), 'loss': history.history['loss']}, f)
''')


@pytest.mark.slow
@pytest.mark.parametrize('backend', ['torch', 'jax'])
def test_torch_and_jax_backends_fit_our_loaders_for_three_epochs(url, tmp_path, backend):
    script, out = tmp_path / 'fit.py', tmp_path / 'out.json'
    script.write_text(SCRIPT)
    env = dict(os.environ, KERAS_BACKEND=backend, OMP_NUM_THREADS='1')
    done = subprocess.run([sys.executable, str(script), url, str(out)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(pathlib.Path(out).read_text())
    assert result['steps'] == ROWS // 8
    assert len(result['loss']) == 3, 'three epochs trained, none lost to an iterator that ran out'
    assert 'ran out of data' not in done.stderr
    # Keras builds the model on a first batch (torch backend: from an iterator it then drops), so the rows read
    # before the three epochs depend on the backend: the epochs are the last three passes.
    seen = result['seen'][-3 * ROWS:]
    assert len(result['seen']) in (3 * ROWS, 3 * ROWS + 8)
    for epoch in range(3):
        assert sorted(seen[epoch * ROWS:(epoch + 1) * ROWS]) == list(range(ROWS))
    assert result['loss'][-1] < result['loss'][0]
