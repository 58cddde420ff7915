"""Finite reads on a busy thread pool end only after the last row: read after read, none comes back short.

Petastorm 0.13.1's thread pool could end a finite read early (its consumer decided "done" without waiting for
the thread that hands out the work). These reads are the shape that exposes such a race: ``make_reader`` with
``num_epochs=1`` and ten worker threads, more workers than row groups for the small dataset, read back to back.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_reader, write_dataset
from petastorm.codecs import ScalarCodec
from petastorm.unischema import Unischema, UnischemaField
from reliability.helpers import write_small_dataset

READS = 100

IdSchema = Unischema('IdSchema', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False)])


@pytest.fixture(scope='module', params=[60, 1000], ids=lambda rows: f'{rows}rows')
def dataset(request, tmp_path_factory):
    """(url, rows): 60 rows in several files and row groups, or 1,000 rows in 10 row groups of 100."""
    url = f'file://{tmp_path_factory.mktemp("finite")}/ds'
    if request.param == 60:
        result = write_small_dataset(url)
    else:
        result = write_dataset(url, IdSchema, pa.table({'id': np.arange(1000, dtype=np.int64)}),
                               row_group_size_mb=100 * 8 / 2**20)
    assert sum(len(sizes) for sizes in result.row_groups.values()) >= 4
    return url, request.param


def test_every_finite_thread_pool_read_delivers_every_row(dataset, figures):
    url, rows = dataset
    short = []
    for attempt in range(READS):
        with make_reader(url, num_epochs=1, reader_pool_type='thread', workers_count=10) as reader:
            ids = sorted(int(row.id) for row in reader)
        if ids != list(range(rows)):
            short.append((attempt, len(ids)))
    figures.add('finite reads', f'{READS} thread-pool reads of {rows} rows, 10 workers: {len(short)} short')
    assert not short, f'(read, rows delivered) of the reads that did not deliver all {rows} rows: {short}'
