"""A reader's first batch before its whole plan: footers read as the scan needs them (issue 45).

A plain store without a ``_metadata`` summary is planned from its footers. With ``shuffle_row_groups=False`` a
reader reads its first rows while the footers of the later files are still held back (a filesystem that counts
opens and holds them behind a gate), delivers every row once, in the order and with the positions of a reader
that planned first, and knows its ``len()``. The options that need every row group still plan first.
"""

from __future__ import annotations

import threading
import traceback

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.errors import CorruptFooterError, SchemaError
from petastorm.reading import setup as reader_setup
from petastorm.reading.options import validate_options
from petastorm.reading.streamed_plan import can_stream
from petastorm.store.opening import open_any_store
from support.gated_fs import GatedLocalHandler

FILES = 80  # more than one round of footer reads (64 at once from a remote filesystem): streamed
ROWS = 10  # per file, in two row groups of 5
FREE = 4  # files whose footers and rows are not held back


def _write_store(directory, files=FILES):
    directory.mkdir()
    for index in range(files):
        table = pa.table({'id': np.arange(index * ROWS, (index + 1) * ROWS, dtype=np.int64),
                          'x': np.full(ROWS, index, dtype=np.float64)})
        pq.write_table(table, str(directory / f'part-{index:03d}.parquet'), row_group_size=ROWS // 2)
    return sorted(str(path) for path in directory.iterdir())


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / 'store'), _write_store(tmp_path / 'store')


def _gated(paths):
    handler = GatedLocalHandler(set(paths[:FREE]))
    return handler, pafs.PyFileSystem(handler)


def _ids(batches):
    return [int(i) for batch in batches for i in batch.id]


def _footer_threads():
    return [t for t in threading.enumerate() if t.name.startswith('petastorm-footer')]


def test_the_first_batch_comes_while_later_footers_are_held(store):
    url, paths = store
    handler, filesystem = _gated(paths)
    with make_batch_reader(url, filesystem=filesystem, shuffle_row_groups=False, workers_count=2, seed=1) as reader:
        first = next(reader)
        assert set(handler.opened) <= set(paths[:FREE])  # only the first files: their footers and rows
        handler.gate.set()
        ids = _ids([first, *reader])
        assert len(reader) == FILES * 2  # a batch per row group, known once every footer is read
    assert ids == list(range(FILES * ROWS))  # every row once, in the files' order
    assert not _footer_threads()


def test_waiting_options_read_every_footer_first(store):
    url, paths = store
    handler, filesystem = _gated(paths)
    handler.gate.set()
    with make_batch_reader(url, filesystem=filesystem, seed=1, workers_count=2) as reader:  # shuffles row groups
        assert set(handler.opened) == set(paths)  # every footer, before the first batch
        assert sorted(_ids(reader)) == list(range(FILES * ROWS))
    options = validate_options(dataset_url_or_urls=url, shuffle_row_groups=False, batched_output=True,
                               cur_shard=0, shard_count=2, shard_mode='rows')
    assert not can_stream(options, open_any_store(url))
    for changed in ({'shuffle_row_groups': True}, {'filters': [('id', '>', 3)]}, {'reader_pool_type': 'process'},
                    {'count_rows': True}):
        options = validate_options(**{'dataset_url_or_urls': url, 'shuffle_row_groups': False,
                                      'batched_output': True, **changed})
        assert not can_stream(options, open_any_store(url)), changed
    assert can_stream(validate_options(dataset_url_or_urls=url, shuffle_row_groups=False, batched_output=True),
                      open_any_store(url))


def _read(url, monkeypatch, stream, take=None, state=None, **options):
    """The ids a reader delivers (the first ``take`` batches, then its state), streamed or planned first."""
    with monkeypatch.context() as patch:
        if not stream:
            patch.setattr(reader_setup, 'can_stream', lambda *_: False)
        with make_batch_reader(url, shuffle_row_groups=False, workers_count=2, **options) as reader:
            assert (reader._passes._setup.streamed is not None) == stream
            if state is not None:
                reader.load_state_dict(state)
            batches = []
            for batch in reader:
                batches.append(batch)
                if take is not None and len(batches) == take:
                    return _ids(batches), reader.state_dict()
            return _ids(batches), None


@pytest.mark.parametrize('options', [
    {'seed': 3},
    {'seed': 3, 'cur_shard': 1, 'shard_count': 3},
    {'seed': 5, 'cur_shard': 0, 'shard_count': 4, 'shuffle_rows': True, 'shuffle_row_drop_partitions': 2},
    {'seed': 5, 'num_epochs': 2, 'shuffle_rows': True},
])
def test_a_streamed_reader_reads_and_resumes_as_a_planned_one(store, monkeypatch, options):
    url, _ = store
    assert _read(url, monkeypatch, True, **options) == _read(url, monkeypatch, False, **options)
    ids, state = _read(url, monkeypatch, True, take=3, **options)
    planned_ids, planned_state = _read(url, monkeypatch, False, take=3, **options)
    assert (ids, state) == (planned_ids, planned_state)
    rest = _read(url, monkeypatch, True, state=state, **options)[0]
    assert rest == _read(url, monkeypatch, False, state=state, **options)[0]
    assert sorted(ids + rest) == sorted(_read(url, monkeypatch, False, **options)[0])


def test_rows_of_make_reader_and_its_length(store):
    url, _ = store
    with make_reader(url, shuffle_row_groups=False, workers_count=2) as reader:
        assert len(reader) == FILES * ROWS
        assert sorted(int(row.id) for row in reader) == list(range(FILES * ROWS))


def test_a_bad_footer_reaches_the_caller_with_its_traceback(tmp_path):
    paths = _write_store(tmp_path / 'store')
    with open(paths[20], 'wb') as file:
        file.write(b'not parquet at all')
    with make_batch_reader(str(tmp_path / 'store'), shuffle_row_groups=False, workers_count=2) as reader, \
            pytest.raises(CorruptFooterError, match='part-020') as raised:
        list(reader)
    frames = ''.join(traceback.format_tb(raised.value.__traceback__))
    assert 'read_data_file_footer' in frames  # raised in the footer-reading thread, re-raised here
    assert not _footer_threads()


def test_a_file_of_another_schema_is_refused_when_streamed(tmp_path):
    paths = _write_store(tmp_path / 'store')
    pq.write_table(pa.table({'id': np.arange(5, dtype=np.int64), 'y': np.zeros(5)}), paths[7])
    with make_batch_reader(str(tmp_path / 'store'), shuffle_row_groups=False) as reader, \
            pytest.raises(SchemaError, match='part-007.*shuffle_row_groups=True'):
        list(reader)
    with pytest.warns(UserWarning, match='differ in their schemas'), \
            make_batch_reader(str(tmp_path / 'store'), workers_count=2) as reader:  # planned first: unified
        assert {'id', 'x', 'y'} <= set(reader.schema.fields)


def test_stopping_a_reader_stops_its_footer_stream(store):
    url, paths = store
    handler, filesystem = _gated(paths)
    reader = make_batch_reader(url, filesystem=filesystem, shuffle_row_groups=False, workers_count=2)
    next(reader)
    reader.stop()
    handler.gate.set()
    reader.join()
    assert not _footer_threads()


def test_the_first_batch_from_s3_asks_for_a_few_footers(tmp_path):
    pytest.importorskip('s3fs')
    from petastorm.test_util.s3_server import S3DirectoryServer

    files = 300
    with S3DirectoryServer(str(tmp_path / 'objects'), buckets=('streamed',)) as server:
        _write_store(tmp_path / 'objects' / 'streamed' / 'store', files)
        url, options = 's3://streamed/store', server.storage_options()
        server.reset_stats()
        with make_batch_reader(url, storage_options=options, shuffle_row_groups=False, workers_count=2) as reader:
            first = next(reader)
            to_first = server.stats().total_requests
            ids = _ids([first, *reader])
            assert len(reader) == files * 2
        assert ids == list(range(files * ROWS))
        assert to_first < files  # a footer is one or two requests: far from every footer before the first batch
        server.reset_stats()
        with make_batch_reader(url, storage_options=options, workers_count=2) as reader:  # shuffles: plans first
            next(reader)
            assert server.stats().total_requests > files


def test_a_batch_stream_starts_its_pass_before_the_last_footer(store):
    from petastorm.reading import BatchStream, as_column_source

    url, paths = store
    handler, filesystem = _gated(paths)
    with make_batch_reader(url, filesystem=filesystem, shuffle_row_groups=False, workers_count=2) as reader:
        stream = BatchStream(as_column_source('test', reader), 7)
        batches = iter(stream)
        first = next(batches)
        assert set(handler.opened) <= set(paths[:FREE])
        handler.gate.set()
        ids = [int(i) for batch in [first, *batches] for i in batch['id']]
        assert ids == list(range(FILES * ROWS))
        assert stream.state_dict()['in_progress'] is False  # the pass is complete: its rows were known at its end


def test_a_store_read_in_one_round_of_footers_keeps_its_unified_schema(tmp_path):
    paths = _write_store(tmp_path / 'store', files=3)
    pq.write_table(pa.table({'id': np.arange(5, dtype=np.int64), 'y': np.zeros(5)}), paths[1])
    options = validate_options(dataset_url_or_urls=str(tmp_path / 'store'), shuffle_row_groups=False,
                               batched_output=True)
    assert not can_stream(options, open_any_store(str(tmp_path / 'store')))  # planned first: schemas unified


_FRESH_READER = '''
import json, sys
from petastorm import make_batch_reader
from petastorm.store import plain_or_sized
url, options, flags = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
if 'near' in flags:  # a listing of the loopback server is near, however loaded the machine running the test is
    plain_or_sized.PLAIN_LISTING_SECONDS = 60.0
with make_batch_reader(url, storage_options=options, shuffle_row_groups='shuffled' in flags,
                       workers_count=2) as reader:
    ids = [int(i) for batch in reader for i in batch.id]
print(json.dumps({'ids': ids, 'dataset_imported': 'pyarrow.dataset' in sys.modules}))
'''


def test_an_in_order_reader_opens_its_first_files_before_importing_pyarrow_dataset(tmp_path):
    """In a process without ``pyarrow.dataset`` (which imports pandas: 0.2 s), the first few files are opened
    the plain way (a HEAD each) and the rest read by their listed size once it is imported: that many HEADs, never
    one per file, and every row once."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip('s3fs')
    from petastorm.store.footers import REMOTE_FOOTER_THREADS
    from petastorm.store.plain_or_sized import PLAIN_OPENS, SMALL_STORE_FILES
    from petastorm.test_util.s3_server import S3DirectoryServer

    # More than one round of footer reads (streamed), and more files than a store read the plain way has.
    files = max(REMOTE_FOOTER_THREADS + 2 * PLAIN_OPENS, SMALL_STORE_FILES + 1)
    with S3DirectoryServer(str(tmp_path / 'objects'), buckets=('fresh',)) as server:
        _write_store(tmp_path / 'objects' / 'fresh' / 'store', files)
        server.reset_stats()
        done = subprocess.run([sys.executable, '-c', _FRESH_READER, 's3://fresh/store',
                               json.dumps(server.storage_options())], capture_output=True, text=True, timeout=120,
                              env={**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}, check=False)
        assert done.returncode == 0, done.stderr
        requests = server.stats().requests
    result = json.loads(done.stdout.splitlines()[-1])
    assert sorted(result['ids']) == list(range(files * ROWS))
    assert result['dataset_imported']
    assert requests['HEAD'] == PLAIN_OPENS
    # the listing; a footer per file; a request per row group (two per file)
    assert requests['LIST'] == 1
    assert requests['GET'] == files + files * 2


def test_a_small_store_near_enough_is_read_without_importing_pyarrow_dataset(tmp_path):
    """A fresh process reading a store of a few more files than ``PLAIN_OPENS`` from a server whose listing comes
    back at once opens every file the plain way (a HEAD each): cheaper than importing ``pyarrow.dataset``."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip('s3fs')
    from petastorm.store.plain_or_sized import PLAIN_OPENS
    from petastorm.test_util.s3_server import S3DirectoryServer

    files = PLAIN_OPENS + 4
    with S3DirectoryServer(str(tmp_path / 'objects'), buckets=('fresh',)) as server:
        _write_store(tmp_path / 'objects' / 'fresh' / 'store', files)
        server.reset_stats()
        done = subprocess.run([sys.executable, '-c', _FRESH_READER, 's3://fresh/store',
                               json.dumps(server.storage_options()), 'shuffled', 'near'], capture_output=True,
                              text=True, timeout=120, env={**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)},
                              check=False)
        assert done.returncode == 0, done.stderr
        requests = server.stats().requests
    result = json.loads(done.stdout.splitlines()[-1])
    assert sorted(result['ids']) == list(range(files * ROWS))
    assert not result['dataset_imported']
    assert requests['HEAD'] == files
    assert requests['GET'] == files + files * 2  # a footer per file; a request per row group (two per file)
