"""Data and small utilities shared by the reliability tests."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

#: rows of the tiny datasets used by most tests.
SMALL_ROWS = 60

SmallSchema = Unischema('SmallSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vec', np.float32, (2,), NdarrayCodec(), False),
])


def small_row(i: int) -> dict:
    return {'id': i, 'vec': np.array([i, -i], dtype=np.float32)}

