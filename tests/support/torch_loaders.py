"""The torch loader tests' data: a petastorm store of every column kind, a plain Parquet store, readers over them."""

from __future__ import annotations

import decimal
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

ROWS = 50
Schema = Unischema('TorchSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('small', np.uint16, (), ScalarCodec(pa.uint16()), False),
    UnischemaField('flag', np.bool_, (), ScalarCodec(pa.bool_()), False),
    UnischemaField('weight', np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('price', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
    UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False),
    UnischemaField('seq', np.int64, (None,), NdarrayCodec(), False),
])
NUMERIC = ['id', 'small', 'flag', 'weight', 'matrix']


def torch_row(i: int) -> dict:
    """Row ``i`` of the torch test store."""
    return {'id': i, 'small': 1000 + i, 'flag': i % 3 == 0, 'weight': i / 4, 'name': f'row{i}',
            'price': decimal.Decimal(f'{i}.25'), 'matrix': np.full((2, 3), i, dtype=np.float32),
            'seq': np.arange(i % 4 + 1, dtype=np.int64)}


def write_torch_store(directory: pathlib.Path) -> str:
    """The URL of a petastorm store of ``ROWS`` rows of :data:`Schema` in small row groups, under ``directory``."""
    target = 'file://' + str(directory / 'ds')
    write_dataset(target, Schema, (torch_row(i) for i in range(ROWS)), row_group_size_mb=0.002)
    return target


def write_plain_store(root: pathlib.Path) -> str:
    """The URL of a plain Parquet store (no petastorm metadata) of 300 rows in 6 row groups, written in ``root``."""
    n = 300
    table = pa.table({'id': np.arange(n, dtype=np.int64), 'x': np.arange(n, dtype=np.float32) / 2,
                      'u': np.arange(n, dtype=np.uint32), 'label': [f'l{i % 7}' for i in range(n)]})
    pq.write_table(table, str(root / 'part0.parquet'), row_group_size=50)
    return 'file://' + str(root)


def dummy_reader(url: str, **kwargs):
    """``make_reader`` on the dummy pool, row groups in order, unless ``kwargs`` say otherwise."""
    kwargs.setdefault('reader_pool_type', 'dummy')
    kwargs.setdefault('shuffle_row_groups', False)
    return make_reader(url, **kwargs)


def dummy_batch_reader(url: str, **kwargs):
    """``make_batch_reader`` on the dummy pool, row groups in order, unless ``kwargs`` say otherwise."""
    kwargs.setdefault('reader_pool_type', 'dummy')
    kwargs.setdefault('shuffle_row_groups', False)
    return make_batch_reader(url, **kwargs)


def ids_of(batches, key: str = 'id') -> list[int]:
    """The ids of every row of ``batches``, in order."""
    return [int(v) for batch in batches for v in batch[key]]


def assert_same_batch(a, b) -> None:
    """Two collated batches are equal: tensors of the same dtype and values, the same keys and lengths."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same_batch(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_batch(x, y)
    else:
        assert type(a) is type(b)
        assert a == b
