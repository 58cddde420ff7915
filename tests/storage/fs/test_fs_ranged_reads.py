"""petastorm.fs: what the storage handler reads: byte ranges of the columns asked for, each footer once, files
that seek and read like files, a handler that pickles without its caches, object-store directories.

Everything here runs without a server: ``memory://`` and fsspec filesystems made in the test (see
:mod:`support.fake_storage`) stand in for remote storage.
"""

from __future__ import annotations

import pickle
from urllib.parse import urlparse

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_reader, write_dataset
from petastorm.codecs import ScalarCodec
from petastorm.fs import StorageHandler, resolve_url
from petastorm.unischema import Unischema, UnischemaField
from support.fake_storage import fake_store

WideSchema = Unischema('WideSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('a', np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField('b', np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField('c', np.float64, (), ScalarCodec(pa.float64()), False),
])


def test_projection_reads_byte_ranges_and_each_footer_once(memory_url):
    rng = np.random.default_rng(0)
    n = 60_000
    rows = pa.table({'id': np.arange(n), 'a': rng.random(n), 'b': rng.random(n), 'c': rng.random(n)})
    written = write_dataset(memory_url, WideSchema, rows, row_group_size_mb=0.5, compression=None)
    assert len(written.files) == 1
    assert len(written.row_groups[next(iter(written.row_groups))]) > 1
    fs = fake_store()
    with make_reader(memory_url, schema_fields=['a'], filesystem=fs, reader_pool_type='thread',
                     workers_count=3) as reader:
        assert sum(1 for _ in reader) == n
    data_file = urlparse(written.files[0]).path if '://' in written.files[0] else written.files[0]
    size = fsspec.filesystem('memory').size(data_file)
    reads = [(start, end) for path, start, end in fs.ranges if path == data_file]
    assert all(start is not None and end is not None for start, end in reads)
    fetched = sum(end - start for start, end in reads)
    assert fetched < 0.4 * size, f'read {fetched} of {size} bytes for one column of four'
    tails = [r for r in reads if r[1] >= size]  # a tail read asks for one byte more: a file that grew has it
    assert len(tails) == 1, f'the footer was fetched {len(tails)} times'
    assert tails[0][1] == size + 1


def test_opened_files_seek_and_read_like_files(memory_dataset):
    fs, root = resolve_url(memory_dataset)
    path = root + '/_common_metadata'
    expected = fsspec.filesystem('memory').cat_file(path)
    with fs.open_input_file(path) as f:
        assert f.size() == len(expected)
        assert f.read_at(10, 5) == expected[5:15]
        f.seek(-4, 2)
        assert f.read() == b'PAR1'
        f.seek(0)
        assert f.read(4) == b'PAR1'
    assert pq.read_metadata(fs.open_input_file(path)).num_columns == 2
    with fs.open_input_stream(path) as stream:
        assert stream.read() == expected


def test_handler_pickles_without_its_caches(memory_dataset):
    fs, root = resolve_url(memory_dataset)
    fs.get_file_info(pafs.FileSelector(root))
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.handler == fs.handler
    assert clone.handler.scheme == 'memory'
    assert clone.get_file_info(root + '/_common_metadata').type == pafs.FileType.File


def test_object_store_directories_vanish_with_their_last_object(memory_url):
    fs = pafs.PyFileSystem(StorageHandler(fsspec.filesystem('memory'), 's3'))
    fs.delete_dir('/petastorm-tests/never-existed')  # an empty prefix: nothing to delete
    local = pafs.PyFileSystem(StorageHandler(fsspec.filesystem('memory'), 'memory'))
    with pytest.raises(FileNotFoundError):
        local.delete_dir('/petastorm-tests/never-existed')
