"""The reader feature tests' store: a few columns of every kind, small row groups, one in three ``maybe`` null."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

ROWS = 60
Schema = Unischema('FeatureSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('id2', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('matrix', np.float64, (2, 3), NdarrayCodec(), False),
    UnischemaField('maybe', np.float32, (), ScalarCodec(pa.float32()), True),
])


def feature_row(i: int) -> dict:
    """Row ``i`` of :data:`Schema`."""
    return {'id': i, 'id2': i * 10, 'name': f'n{i}', 'matrix': np.full((2, 3), i, dtype=np.float64),
            'maybe': None if i % 3 == 0 else float(i)}


def write_feature_store(directory: pathlib.Path) -> str:
    """The URL of a store of ``ROWS`` rows of :data:`Schema` in row groups of a few rows, under ``directory``."""
    target = 'file://' + str(directory / 'ds')
    write_dataset(target, Schema, (feature_row(i) for i in range(ROWS)), row_group_size_mb=0.001)
    return target


def rows_of(reader) -> list:
    """Every item of ``reader``, which is stopped afterwards."""
    with reader:
        return list(reader)
