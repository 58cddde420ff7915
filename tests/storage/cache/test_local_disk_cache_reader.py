"""The local disk cache in the reader: its options, its location, what a second reader or epoch reads (nothing),
keys that identify the file's content, every reader option and pool kind giving the same items with and without
it, a slow filesystem, and the cache benchmark."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.cache import FileStamp, NullCache, RowGroupCache
from petastorm.local_disk_cache import CacheLocationError
from petastorm.ngram import NGram
from petastorm.predicates import in_lambda
from petastorm.test_util.latency_fs import SlowLocalHandler
from support.cache_stores import LIMIT, ROWS, disk_cache_args, reader_ids, row_group_count, write_cache_store

# make_batch_reader on a Petastorm dataset warns as Petastorm does.
pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')

POOLS = ['dummy', 'thread', 'process']
READERS = {'rows': make_reader, 'batches': make_batch_reader}
BENCH = Path(__file__).resolve().parents[3] / 'benchmarks' / 'cache_bench.py'


@pytest.fixture
def row_group_reads(monkeypatch):
    """Counts row-group reads from Parquet files in this process (dummy and thread pools)."""
    calls = []
    original = pq.ParquetFile.read_row_group

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, 'read_row_group', counting)
    return calls


def test_options_validation(cache_dataset_url, tmp_path):
    with pytest.raises(ValueError, match='needs cache_location'):
        make_reader(cache_dataset_url, cache_type='local-disk', cache_size_limit=LIMIT)
    with pytest.raises(ValueError, match='cache_size_limit must be a positive integer'):
        make_reader(cache_dataset_url, cache_type='local-disk', cache_location=str(tmp_path), cache_size_limit=0)
    with pytest.raises(ValueError, match=r"cache_location='s3://bucket/cache' is a s3:// URL; the local-disk cache "
                                         r'needs a directory on a local disk'):
        make_reader(cache_dataset_url, cache_type='local-disk', cache_location='s3://bucket/cache')
    with pytest.raises(ValueError, match=r'^cache_size_limit / shards must be at least 5 \* cache_row_size_estimate.*'
                                         r'got cache_size_limit=6000, shards=6 \(cache_extra_settings\), '
                                         r'cache_row_size_estimate=1000'):
        make_reader(cache_dataset_url, cache_type='local-disk', cache_location=str(tmp_path), cache_size_limit=6000,
                    cache_row_size_estimate=1000)


def test_local_disk_cache_without_sizes_has_no_limit(cache_dataset_url, tmp_path):
    # As other libraries' caches: cache_location alone is enough.
    for _ in range(2):
        with make_reader(cache_dataset_url, cache_type='local-disk', cache_location=str(tmp_path / 'c'),
                         reader_pool_type='dummy', cache_extra_settings={'cleanup': False}) as reader:
            assert len(list(reader)) == ROWS
    assert any((tmp_path / 'c').rglob('*')), 'entries were stored'
    assert not (tmp_path / 's3:').exists()
    with pytest.raises(ValueError, match='cache_row_size_estimate'):
        make_reader(cache_dataset_url, **disk_cache_args(tmp_path, cache_row_size_estimate=0))
    with pytest.raises(ValueError, match='cache_extra_settings must be a dict'):
        make_reader(cache_dataset_url, **disk_cache_args(tmp_path, cache_extra_settings=['cleanup']))
    with pytest.raises(ValueError, match='Unknown cache_type'):
        make_reader(cache_dataset_url, cache_type='memory')


def test_unwritable_location_fails_at_construction_naming_the_path(cache_dataset_url, tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a directory')
    location = blocker / 'cache'
    with pytest.raises(CacheLocationError, match=f'{location}.*cannot be created or written to') as raised:
        make_reader(cache_dataset_url, **disk_cache_args(location))
    assert isinstance(raised.value, OSError)


@pytest.mark.skipif(os.geteuid() == 0, reason='root may write to read-only directories')
def test_read_only_location_fails_at_construction(cache_dataset_url, tmp_path):
    location = tmp_path / 'ro'
    location.mkdir()
    location.chmod(0o500)
    try:
        with pytest.raises(CacheLocationError, match=str(location)):
            make_batch_reader(cache_dataset_url, **disk_cache_args(location))
    finally:
        location.chmod(0o700)


@pytest.mark.parametrize('reader_kind', list(READERS))
def test_second_reader_reads_nothing_from_the_files(cache_dataset_url, tmp_path, row_group_reads, reader_kind):
    make = READERS[reader_kind]
    plain = reader_ids(make(cache_dataset_url, reader_pool_type='dummy', shuffle_row_groups=False))
    row_group_reads.clear()
    first = reader_ids(make(cache_dataset_url, reader_pool_type='dummy', shuffle_row_groups=False,
                            **disk_cache_args(tmp_path / 'c')))
    assert len(row_group_reads) == row_group_count(cache_dataset_url)
    row_group_reads.clear()
    second = reader_ids(make(cache_dataset_url, reader_pool_type='thread', workers_count=3, shuffle_row_groups=False,
                             **disk_cache_args(tmp_path / 'c')))
    assert row_group_reads == []
    assert first == second == plain
    assert sorted(plain) == list(range(ROWS))


def test_epochs_of_one_reader_hit_the_cache(cache_dataset_url, tmp_path, row_group_reads):
    ids = reader_ids(make_reader(cache_dataset_url, reader_pool_type='dummy', num_epochs=3,
                                 **disk_cache_args(tmp_path / 'c')))
    assert sorted(ids) == sorted(list(range(ROWS)) * 3)
    assert len(row_group_reads) == row_group_count(cache_dataset_url)


def test_a_rewritten_file_is_read_again(tmp_path, row_group_reads):
    url = write_cache_store(tmp_path / 'ds')
    args = disk_cache_args(tmp_path / 'c')
    assert sorted(reader_ids(make_reader(url, reader_pool_type='dummy', **args))) == list(range(ROWS))
    path = sorted((tmp_path / 'ds').rglob('*.parquet'))[0]
    parquet = pq.ParquetFile(path)
    changed = parquet.read_row_groups(range(parquet.num_row_groups))
    changed_ids = set(changed.column('id').to_pylist())
    rewritten_groups = parquet.num_row_groups
    stat = path.stat()
    with pq.ParquetWriter(str(path) + '.new', parquet.schema_arrow) as writer:
        for i in range(parquet.num_row_groups):
            group = parquet.read_row_group(i)
            ids = pc.add(group.column('id'), 1000)
            writer.write_table(group.set_column(group.schema.get_field_index('id'), group.schema.field('id'), ids))
    os.replace(str(path) + '.new', path)
    # Same size or not, a rewrite moves the modification time; make it visible on coarse-clock filesystems too.
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    row_group_reads.clear()
    ids = set(reader_ids(make_reader(url, reader_pool_type='dummy', **args)))
    assert ids == (set(range(ROWS)) - changed_ids) | {i + 1000 for i in changed_ids}
    assert len(row_group_reads) == rewritten_groups  # only the changed file was read again


def test_row_group_cache_keys_identify_the_file_content():
    cache = RowGroupCache(NullCache(), 'file:///ds', {'/ds/a.parquet': FileStamp(10, 1)})
    key = cache.key('/ds/a.parquet', 0, ['b', 'a'])
    assert key == cache.key('/ds/a.parquet', 0, ['a', 'b'])  # the column order does not matter
    assert key != cache.key('/ds/a.parquet', 1, ['a', 'b'])
    assert key != cache.key('/ds/a.parquet', 0, ['a'])
    changed = RowGroupCache(NullCache(), 'file:///ds', {'/ds/a.parquet': FileStamp(10, 2)})
    assert key != changed.key('/ds/a.parquet', 0, ['a', 'b'])
    other = RowGroupCache(NullCache(), 'file:///other', {'/ds/a.parquet': FileStamp(10, 1)})
    assert key != other.key('/ds/a.parquet', 0, ['a', 'b'])
    table = cache.read('/ds/a.parquet', 0, ['b', 'a'], lambda: pa.table({'a': [1], 'b': [2]}))
    assert table.column_names == ['b', 'a']


def test_cache_with_a_worker_predicate(cache_dataset_url, tmp_path, row_group_reads):
    predicate = in_lambda(['id'], lambda i: i % 3 == 0)
    plain = reader_ids(make_reader(cache_dataset_url, reader_pool_type='dummy', predicate=predicate,
                                   shuffle_row_groups=False))
    args = disk_cache_args(tmp_path / 'c')
    cold = reader_ids(make_reader(cache_dataset_url, reader_pool_type='dummy', predicate=predicate,
                                  shuffle_row_groups=False, **args))
    row_group_reads.clear()
    warm = reader_ids(make_reader(cache_dataset_url, reader_pool_type='thread', predicate=predicate,
                                  shuffle_row_groups=False, **args))
    assert row_group_reads == []
    assert plain == cold == warm == [i for i in range(ROWS) if i % 3 == 0]
    batches = reader_ids(make_batch_reader(cache_dataset_url, reader_pool_type='dummy', predicate=predicate,
                                           shuffle_row_groups=False, **args))
    assert batches == plain


@pytest.mark.parametrize('reader_kind', list(READERS))
def test_cache_with_drop_partitions(cache_dataset_url, tmp_path, row_group_reads, reader_kind):
    make = READERS[reader_kind]
    options = {'shuffle_row_drop_partitions': 3, 'seed': 5, 'shuffle_rows': True}
    plain = reader_ids(make(cache_dataset_url, reader_pool_type='dummy', **options))
    row_group_reads.clear()
    cold = reader_ids(make(cache_dataset_url, reader_pool_type='dummy', **options, **disk_cache_args(tmp_path / 'c')))
    # Three work items per row group, one read: the cache holds whole row groups.
    assert len(row_group_reads) == row_group_count(cache_dataset_url)
    warm = reader_ids(make(cache_dataset_url, reader_pool_type='thread', workers_count=3, **options,
                           **disk_cache_args(tmp_path / 'c')))
    assert plain == cold == warm
    assert sorted(plain) == list(range(ROWS))


def test_cache_with_ngram_windows(cache_dataset_url, tmp_path, row_group_reads):
    def windows(**extra):
        ngram = NGram({0: ['id', 'name'], 1: ['id']}, delta_threshold=1, timestamp_field='id')
        with make_reader(cache_dataset_url, schema_fields=ngram, reader_pool_type='dummy', shuffle_row_groups=False,
                         **extra) as reader:
            return [(int(w[0].id), w[0].name, int(w[1].id)) for w in reader]

    plain = windows()
    assert windows(**disk_cache_args(tmp_path / 'c')) == plain
    row_group_reads.clear()
    assert windows(**disk_cache_args(tmp_path / 'c')) == plain
    assert row_group_reads == []
    assert plain


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('reader_kind', list(READERS))
def test_every_pool_kind_delivers_the_same_items_with_and_without_cache(cache_dataset_url, tmp_path, pool, reader_kind):
    make = READERS[reader_kind]
    options = {'reader_pool_type': pool, 'workers_count': 2, 'seed': 11, 'shuffle_rows': True}

    def items(**extra):
        with make(cache_dataset_url, **options, **extra) as reader:
            return [tuple(np.asarray(value).tolist() for value in item) for item in reader]

    plain = items()
    cold = items(**disk_cache_args(tmp_path / 'c'))
    warm = items(**disk_cache_args(tmp_path / 'c'))
    assert plain == cold == warm
    assert len(list((tmp_path / 'c' / 'entries').rglob('*.arrow'))) == row_group_count(cache_dataset_url)


def test_second_epoch_on_a_slow_filesystem_reads_at_local_speed(cache_dataset_url, tmp_path):
    slow = pafs.PyFileSystem(SlowLocalHandler(0.05))

    def timed_epoch():
        with make_reader(cache_dataset_url, filesystem=slow, reader_pool_type='thread', workers_count=2,
                         **disk_cache_args(tmp_path / 'c')) as reader:
            start = time.perf_counter()
            ids = [int(row.id) for row in reader]
            elapsed = time.perf_counter() - start
        assert sorted(ids) == list(range(ROWS))
        return elapsed

    cold = timed_epoch()
    warm = timed_epoch()
    assert cold >= 0.05 * row_group_count(cache_dataset_url) / 2  # sanity: the latency was paid once per row group
    assert warm < cold / 3, (cold, warm)


def test_cache_benchmark_runs(tmp_path):
    completed = subprocess.run([sys.executable, str(BENCH), '--quick', '--data', str(tmp_path)], capture_output=True,
                               text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr
    assert 'epoch 2 / epoch 1' in completed.stdout
