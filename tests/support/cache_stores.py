"""The dataset the local disk cache tests read: many small row groups, and the helpers that read it through a cache.

The store has :data:`ROWS` rows of an id, a name and a 4-vector, written in row groups of a few rows so that a
reader makes many cache entries. ``tests/storage/conftest.py`` writes it once per test module
(``cache_dataset_url``).
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

ROWS = 120
#: a size limit no test reaches unless it means to.
LIMIT = 100 << 20

CacheSchema = Unischema('CacheSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('vec', np.float32, (4,), NdarrayCodec(), False),
])


def cache_row(i):
    return {'id': i, 'name': f'row{i}', 'vec': np.full(4, i, dtype=np.float32)}


def write_cache_store(path, rows=ROWS):
    """Write ``rows`` rows of :data:`CacheSchema` at ``path`` in many small row groups; return the dataset URL."""
    url = 'file://' + str(path)
    write_dataset(url, CacheSchema, (cache_row(i) for i in range(rows)), row_group_size_mb=0.001, file_size_mb=0.004)
    return url


def row_group_count(url):
    """The row groups of every Parquet file under the ``file://`` URL."""
    root = Path(url[len('file://'):])
    return sum(pq.ParquetFile(p).num_row_groups for p in root.rglob('*.parquet'))


def disk_cache_args(location, **extra):
    """A reader's arguments of a local disk cache at ``location`` that is kept after the reader (``cleanup=False``)."""
    # Most tests read through one cache with several readers, so it must outlive each of them.
    return {'cache_type': 'local-disk', 'cache_location': str(location), 'cache_size_limit': LIMIT,
            'cache_row_size_estimate': 1000, 'cache_extra_settings': {'cleanup': False}, **extra}


def reader_ids(reader):
    """The ids a reader delivers (rows or batches), in order; the reader is stopped afterwards."""
    with reader:
        if reader.batched_output:
            return [int(i) for batch in reader for i in batch.id]
        return [int(row.id) for row in reader]


def small_table(value, size=200):
    """A table of ``size`` rows holding ``value``: one cache entry of a known size."""
    return pa.table({'value': [value] * size, 'payload': [b'x' * 8] * size})
