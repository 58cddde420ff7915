"""Data and small utilities shared by the reliability tests."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pyarrow as pa

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField
from petastorm.writer import WriteResult

#: rows of the tiny datasets used by most tests.
SMALL_ROWS = 60

#: sizes that split ``SMALL_ROWS`` rows into several files of several row groups each.
SMALL_DATASET_SIZES = {'row_group_size_mb': 0.0005, 'file_size_mb': 0.002}

#: the ``tests`` directory: subprocesses import ``reliability.*`` from it.
TESTS_DIR = pathlib.Path(__file__).resolve().parent.parent

SmallSchema = Unischema('SmallSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vec', np.float32, (2,), NdarrayCodec(), False),
])


def small_row(i: int) -> dict:
    return {'id': i, 'vec': np.array([i, -i], dtype=np.float32)}


def write_small_dataset(url: str, first_id: int = 0) -> WriteResult:
    """Write ``SMALL_ROWS`` rows with ids from ``first_id`` to ``url``; return what ``write_dataset`` returned.

    Only the ids are shifted: the vectors stay those of ``small_row(0 .. SMALL_ROWS - 1)``.
    """
    rows = ({**small_row(i), 'id': first_id + i} for i in range(SMALL_ROWS))
    return write_dataset(url, SmallSchema, rows, **SMALL_DATASET_SIZES)


def subprocess_env(*, silence_warnings: bool = False) -> dict[str, str]:
    """This process's environment with ``tests`` first on PYTHONPATH, for interpreters that run reliability code."""
    # An empty PYTHONPATH entry would put the child's working directory on sys.path: only join the ones set.
    entries = [str(TESTS_DIR), os.environ.get('PYTHONPATH', '')]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(entry for entry in entries if entry)}
    if silence_warnings:
        # Children whose stderr is shown on failure: keep it to the error itself.
        env['PYTHONWARNINGS'] = 'ignore'
    return env
