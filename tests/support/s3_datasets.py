"""The datasets the S3 tests write to the moto server, and how they read them back.

``tests/storage/conftest.py`` starts the server (:class:`support.s3_loopback.MotoServer`) and writes
``s3_dataset`` (:data:`ROWS` rows of :data:`S3Schema` in several files and row groups) once per test run.
"""

import numpy as np
import pyarrow as pa

from petastorm import make_batch_reader, make_reader
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

ROWS = 300

S3Schema = Unischema('S3Schema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('matrix', np.float32, (4, 8), NdarrayCodec(), False),
])


def s3_row(i: int) -> dict:
    return {'id': i, 'label': f'row-{i}', 'matrix': np.full((4, 8), i, np.float32)}


def read_ids(url: str, options: dict, reader: str, pool: str, **kwargs) -> list[int]:
    """The ids ``make_reader`` or ``make_batch_reader`` (``reader``) delivers from ``url`` with three workers."""
    if reader == 'make_reader':
        with make_reader(url, storage_options=options, reader_pool_type=pool, workers_count=3, **kwargs) as rows:
            return [int(row.id) for row in rows]
    with make_batch_reader(url, storage_options=options, reader_pool_type=pool, workers_count=3, **kwargs) as batches:
        return [int(i) for batch in batches for i in batch.id]
