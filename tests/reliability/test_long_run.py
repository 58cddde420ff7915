"""Long run: 50 epochs with every loader; resident memory must stop growing after the third epoch.

Each loader runs in its own interpreter (``reliability.long_run_worker``) so that its memory is measured alone.
The curve (RSS after epochs 1, 3, 10, 20, 30, 40, 50) is printed in the figures.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField
from reliability.helpers import subprocess_env

EPOCHS = 50
ROWS = 1000
MAX_GROWTH = 0.05
# Only the petastorm.pytorch loaders need torch: the readers run without it. The worker imports torch, not this
# process, so a lookup is enough to decide.
_NEEDS_TORCH = [pytest.mark.torch, pytest.mark.skipif(importlib.util.find_spec('torch') is None,
                                                     reason='the petastorm.pytorch loaders need torch')]
TORCH_LOADERS = ['DataLoader', 'BatchedDataLoader', 'InMemBatchedDataLoader']
LOADERS = ['make_reader', 'make_batch_reader', *(pytest.param(name, marks=_NEEDS_TORCH) for name in TORCH_LOADERS)]

LongSchema = Unischema('LongSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.float32, (32, 32), NdarrayCodec(), False),
])


@pytest.fixture(scope='module')
def long_run_url(tmp_path_factory) -> str:
    url = 'file://' + str(tmp_path_factory.mktemp('long-run') / 'ds')
    rows = ({'id': i, 'image': np.full((32, 32), i, dtype=np.float32)} for i in range(ROWS))
    write_dataset(url, LongSchema, rows, row_group_size_mb=0.5, file_size_mb=2)
    return url


@pytest.mark.slow
@pytest.mark.parametrize('loader', LOADERS)
def test_memory_stops_growing_after_epoch_3(loader, long_run_url, figures):
    done = subprocess.run([sys.executable, '-m', 'reliability.long_run_worker', loader, long_run_url, str(EPOCHS),
                           str(ROWS)], capture_output=True, text=True, env=subprocess_env(silence_warnings=True),
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    curve = json.loads(done.stdout.strip().splitlines()[-1])['rss_mb']
    assert len(curve) == EPOCHS
    base = curve[2]
    growth = (curve[-1] - base) / base
    peak = (max(curve[3:]) - base) / base
    shown = ' '.join(f'e{e}={curve[e - 1]:.0f}' for e in (1, 3, 10, 20, 30, 40, 50))
    figures.add('long run: RSS MB after epoch (growth from epoch 3 to 50, peak)',
                f'{loader:>22}: {shown} ({growth:+.1%}, peak {peak:+.1%})')
    assert growth < MAX_GROWTH, f'RSS grew {growth:.1%} from epoch 3 to {EPOCHS}: {curve}'
