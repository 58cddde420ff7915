"""A torch loader over a reader that plans as its footers arrive: made, and its first batch delivered, at once.

The loader is sized (its ``.dataset`` and ``len()`` count a pass) when the reader will know its rows, and it tells
that from the options, without the whole plan: the later files' footers stay held back (a filesystem that counts
opens and holds them behind a gate) until the first batch is out. ``len()`` then waits for them, and is right.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.predicates import in_lambda
from support.gated_fs import GatedLocalHandler

pytest.importorskip('torch')
from petastorm.pytorch import BatchedDataLoader, DataLoader  # noqa: E402

FILES = 80  # more than one round of footer reads: the reader streams its plan
ROWS = 10  # per file, in two row groups of 5
FREE = 4  # files whose footers and rows are not held back


@pytest.fixture
def store(tmp_path):
    directory = tmp_path / 'store'
    directory.mkdir()
    for index in range(FILES):
        table = pa.table({'id': np.arange(index * ROWS, (index + 1) * ROWS, dtype=np.int64)})
        pq.write_table(table, str(directory / f'part-{index:03d}.parquet'), row_group_size=ROWS // 2)
    return str(directory), sorted(str(path) for path in directory.iterdir())


def _gated(paths):
    handler = GatedLocalHandler(set(paths[:FREE]))
    return handler, pafs.PyFileSystem(handler)


@pytest.mark.parametrize('loader_type', [BatchedDataLoader, DataLoader])
def test_a_loader_delivers_its_first_batch_before_the_later_footers(store, loader_type):
    url, paths = store
    handler, filesystem = _gated(paths)
    reader = make_batch_reader(url, filesystem=filesystem, shuffle_row_groups=False, workers_count=2, seed=1,
                               num_epochs=1)
    with loader_type(reader, batch_size=7) as loader:
        batches = iter(loader)
        first = next(batches)
        assert set(handler.opened) <= set(paths[:FREE])  # made and first batch without the held footers
        handler.gate.set()
        ids = [int(i) for batch in [first, *batches] for i in batch['id']]
        assert ids == list(range(FILES * ROWS))
        assert len(loader.dataset) == FILES * ROWS
        assert len(loader) == -(-FILES * ROWS // 7)
        assert reader._passes._setup.epochs().rows_known  # the plan agrees with what the options told


def test_a_loader_of_a_streamed_reader_whose_rows_are_unknown_has_no_len(store):
    url, paths = store
    handler, filesystem = _gated(paths)
    reader = make_reader(url, filesystem=filesystem, shuffle_row_groups=False, workers_count=2, seed=1,
                         num_epochs=1, predicate=in_lambda(['id'], lambda i: i % 2 == 0))
    assert reader._passes._setup.streamed is not None
    with BatchedDataLoader(reader, batch_size=16) as loader:
        assert not hasattr(loader.dataset, '__len__')
        handler.gate.set()
        assert sum(len(batch['id']) for batch in loader) == FILES * ROWS // 2
        with pytest.raises(TypeError, match='count_rows=True'):
            len(loader)
        assert not reader._passes._setup.epochs().rows_known
