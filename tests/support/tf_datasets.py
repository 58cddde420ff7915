"""The TensorFlow adapter tests' data: a store of every numpy type with the TensorFlow dtype each must arrive as,
a store of sequences for NGrams, and readers over them. Import it after ``pytest.importorskip('tensorflow')``."""

from __future__ import annotations

import decimal
import pathlib

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.ngram import NGram
from petastorm.unischema import Unischema, UnischemaField

ROWS = 24
EPOCH_NS = np.datetime64('2024-01-02T03:04:05', 'ns').astype(np.int64)

# One field per numpy type a Unischema field may have, with the TensorFlow dtype it must arrive as.
TYPED_FIELDS = [
    (UnischemaField('i8', np.int8, (), ScalarCodec(pa.int8()), False), tf.int8),
    (UnischemaField('u8', np.uint8, (), ScalarCodec(pa.uint8()), False), tf.uint8),
    (UnischemaField('i16', np.int16, (), ScalarCodec(pa.int16()), False), tf.int16),
    (UnischemaField('u16', np.uint16, (), ScalarCodec(pa.uint16()), False), tf.int32),
    (UnischemaField('i32', np.int32, (), ScalarCodec(pa.int32()), False), tf.int32),
    (UnischemaField('u32', np.uint32, (), ScalarCodec(pa.uint32()), False), tf.int64),
    (UnischemaField('i64', np.int64, (), ScalarCodec(pa.int64()), False), tf.int64),
    (UnischemaField('u64', np.uint64, (), ScalarCodec(pa.uint64()), False), tf.uint64),
    (UnischemaField('f16', np.float16, (), ScalarCodec(pa.float16()), False), tf.float16),
    (UnischemaField('f32', np.float32, (), ScalarCodec(pa.float32()), False), tf.float32),
    (UnischemaField('f64', np.float64, (), ScalarCodec(pa.float64()), False), tf.float64),
    (UnischemaField('flag', np.bool_, (), ScalarCodec(pa.bool_()), False), tf.bool),
    (UnischemaField('text', np.str_, (), ScalarCodec(pa.string()), False), tf.string),
    (UnischemaField('blob', np.bytes_, (), ScalarCodec(pa.binary()), False), tf.string),
    (UnischemaField('price', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 3)), False), tf.string),
    (UnischemaField('when', np.datetime64, (), ScalarCodec(pa.timestamp('ns')), False), tf.int64),
    (UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False), tf.float32),
    (UnischemaField('seq', np.int16, (None,), NdarrayCodec(), False), tf.int16),
    (UnischemaField('wide', np.uint16, (3,), NdarrayCodec(), False), tf.int32),
]
TypedSchema = Unischema('TypedSchema', [field for field, _ in TYPED_FIELDS])


def typed_row(i: int) -> dict:
    """Row ``i`` of :data:`TypedSchema`."""
    return {'i8': -i, 'u8': 200 + i % 50, 'i16': -300 * i, 'u16': 60000 + i, 'i32': -70000 * i,
            'u32': 4_000_000_000 + i, 'i64': -(2 ** 40) * i, 'u64': 2 ** 63 + i, 'f16': i / 2, 'f32': i / 4,
            'f64': i / 8, 'flag': i % 2 == 0,
            'text': f'héllo {i}', 'blob': bytes([i, 0, 255]), 'price': decimal.Decimal(f'{i}.500'),
            'when': np.datetime64('2024-01-02T03:04:05', 'ns') + np.timedelta64(i, 's'),
            'matrix': np.full((2, 3), i, dtype=np.float32), 'seq': np.arange(i % 3 + 1, dtype=np.int16),
            'wide': np.array([65535, i, 0], dtype=np.uint16)}


def expected_typed(i):
    """What row ``i`` of TypedSchema looks like after TensorFlow (``.numpy()`` of each tensor)."""
    row = typed_row(i)
    return {**row, 'text': row['text'].encode(), 'price': f'{i}.5'.encode(), 'when': EPOCH_NS + i * 10 ** 9}


def write_typed_store(directory: pathlib.Path) -> str:
    """The URL of a store of ``ROWS`` rows of :data:`TypedSchema` in small row groups, under ``directory``."""
    url = 'file://' + str(directory / 'typed')
    write_dataset(url, TypedSchema, (typed_row(i) for i in range(ROWS)), row_group_size_mb=0.002)
    return url


def open_reader(factory, url, **kwargs):
    """A reader with the natural order (dummy pool, no row-group shuffling) unless asked otherwise."""
    return factory(url, **{'reader_pool_type': 'dummy', 'shuffle_row_groups': False, **kwargs})


def row_reader(url: str, **kwargs):
    """:func:`open_reader` of ``make_reader``."""
    return open_reader(make_reader, url, **kwargs)


def batch_reader(url: str, **kwargs):
    """:func:`open_reader` of ``make_batch_reader``."""
    return open_reader(make_batch_reader, url, **kwargs)


def assert_value(name: str, actual, expected) -> None:
    """``actual`` is ``expected`` (floats within 0.1%); the message names the field."""
    if isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-3), name
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


SeqSchema = Unischema('SeqSchema', [
    UnischemaField('ts', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('pos', np.float32, (2,), NdarrayCodec(), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), False),
])


def write_seq_store(directory: pathlib.Path) -> str:
    """The URL of a store of 30 rows of :data:`SeqSchema` (timestamps 0 to 29), under ``directory``."""
    url = 'file://' + str(directory / 'seq')
    rows = ({'ts': t, 'pos': np.array([t, -t], dtype=np.float32), 'label': f'l{t}'} for t in range(30))
    write_dataset(url, SeqSchema, rows, row_group_size_mb=0.001)
    return url


def seq_ngram() -> NGram:
    """Windows of two consecutive rows of :data:`SeqSchema`."""
    return NGram({0: [SeqSchema.ts, SeqSchema.pos], 1: [SeqSchema.ts, SeqSchema.label]}, delta_threshold=1,
                 timestamp_field=SeqSchema.ts)
