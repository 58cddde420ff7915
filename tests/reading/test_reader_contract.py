"""The reader contract: every reader flavour x pool kind delivers the same rows, orders, shards and errors."""

import collections
import random
import threading

import numpy as np
import pyarrow as pa
import pytest

from petastorm import NoDataAvailableError, TransformSpec, make_batch_reader, make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.predicates import in_lambda, in_set
from petastorm.unischema import Unischema, UnischemaField

ROWS = 120
POOLS = ['dummy', 'thread', 'process']
READERS = {'rows': make_reader, 'batches': make_batch_reader}

Schema = Unischema('ContractSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('vec', np.float32, (3,), NdarrayCodec(), False),
    UnischemaField('img', np.uint8, (4, 5, 3), CompressedImageCodec('png'), False),
])


def _row(i):
    rng = np.random.default_rng(i)
    return {'id': i, 'label': f'label_{i % 7}', 'vec': np.full(3, i, dtype=np.float32),
            'img': rng.integers(0, 255, size=(4, 5, 3), dtype=np.uint8)}


@pytest.fixture(scope='module')
def dataset_url(tmp_path_factory):
    url = 'file://' + str(tmp_path_factory.mktemp('contract') / 'ds')
    result = write_dataset(url, Schema, (_row(i) for i in range(ROWS)), row_group_size_mb=0.002, file_size_mb=0.01)
    assert sum(len(v) for v in result.row_groups.values()) >= 10, 'the contract needs many row groups'
    return url


def _ids(reader_kind, reader):
    if reader_kind == 'rows':
        return [int(row.id) for row in reader]
    return [int(i) for batch in reader for i in batch.id]


def _read_ids(reader_kind, url, **kwargs):
    kwargs.setdefault('workers_count', 2)
    with READERS[reader_kind](url, **kwargs) as reader:
        return _ids(reader_kind, reader)


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('reader_kind', list(READERS))
def test_every_row_once_with_decoded_values(dataset_url, reader_kind, pool):
    with READERS[reader_kind](dataset_url, reader_pool_type=pool, workers_count=2) as reader:
        if reader_kind == 'rows':
            rows = list(reader)
        else:
            rows = [dict(zip(b._fields, values, strict=True)) for b in reader for values in zip(*b, strict=True)]
            rows = [collections.namedtuple('R', r)(**r) for r in rows]
    assert sorted(int(r.id) for r in rows) == list(range(ROWS))
    for r in rows:
        expected = _row(int(r.id))
        assert r.label == expected['label']
        assert isinstance(r.label, np.str_)
        np.testing.assert_array_equal(r.vec, expected['vec'])
        np.testing.assert_array_equal(r.img, expected['img'])
        assert r.img.dtype == np.uint8
        assert isinstance(r.id, np.int64)


@pytest.mark.parametrize('reader_kind', list(READERS))
def test_same_seed_same_order_for_every_pool_and_worker_count(dataset_url, reader_kind):
    orders = {}
    for pool, workers in [('dummy', 1), ('thread', 1), ('thread', 3), ('process', 2)]:
        orders[(pool, workers)] = _read_ids(reader_kind, dataset_url, reader_pool_type=pool, workers_count=workers,
                                            seed=42, shuffle_rows=True, shuffle_row_drop_partitions=2, num_epochs=2)
    reference = orders[('dummy', 1)]
    assert sorted(reference) == sorted(list(range(ROWS)) * 2)
    assert reference != sorted(reference), 'shuffled'
    for key, order in orders.items():
        assert order == reference, key
    assert _read_ids(reader_kind, dataset_url, seed=43, shuffle_rows=True) != reference[:ROWS]


def test_no_shuffle_gives_natural_order(dataset_url):
    assert _read_ids('rows', dataset_url, reader_pool_type='thread', shuffle_row_groups=False) == list(range(ROWS))


@pytest.mark.parametrize('shard_count', range(1, 8))
def test_shards_are_disjoint_and_complete(dataset_url, shard_count):
    shards = [_read_ids('rows', dataset_url, cur_shard=k, shard_count=shard_count, reader_pool_type='dummy')
              for k in range(shard_count)]
    assert sorted(i for s in shards for i in s) == list(range(ROWS))
    assert all(shards)


def test_more_shards_than_row_groups_still_gives_every_shard_rows(tmp_path):
    url = 'file://' + str(tmp_path / 'one_group')
    write_dataset(url, Schema, (_row(i) for i in range(10)))
    shards = [_read_ids('rows', url, cur_shard=k, shard_count=4, reader_pool_type='dummy') for k in range(4)]
    assert sorted(i for s in shards for i in s) == list(range(10))
    assert [len(s) for s in shards] == [2, 3, 2, 3]
    with pytest.raises(NoDataAvailableError, match='11'):
        make_reader(url, cur_shard=0, shard_count=11)


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('reader_kind', list(READERS))
def test_num_epochs_delivers_every_row_k_times(dataset_url, reader_kind, pool):
    ids = _read_ids(reader_kind, dataset_url, reader_pool_type=pool, num_epochs=3)
    assert collections.Counter(ids) == dict.fromkeys(range(ROWS), 3)


def test_infinite_epochs_keep_going(dataset_url):
    with make_reader(dataset_url, num_epochs=None, reader_pool_type='thread', workers_count=2) as reader:
        ids = [int(next(reader).id) for _ in range(ROWS * 3 + 5)]
    assert collections.Counter(ids[:ROWS * 3]) == dict.fromkeys(range(ROWS), 3) or len(set(ids)) == ROWS


def _failing_transform(row):
    if row['id'] == 57:
        raise ZeroDivisionError('transform failed on purpose')
    return row


def _failing_predicate(value):
    if value == 33:
        raise KeyError('predicate failed on purpose')
    return True


@pytest.mark.parametrize('pool', POOLS)
def test_transform_exception_reaches_the_caller(dataset_url, pool):
    reader = make_reader(dataset_url, reader_pool_type=pool, workers_count=2,
                         transform_spec=TransformSpec(_failing_transform))
    with reader, pytest.raises(ZeroDivisionError, match='on purpose'):
        list(reader)


@pytest.mark.parametrize('pool', POOLS)
def test_predicate_exception_reaches_the_caller(dataset_url, pool):
    reader = make_reader(dataset_url, reader_pool_type=pool, workers_count=2,
                         predicate=in_lambda(['id'], _failing_predicate))
    with reader, pytest.raises(KeyError, match='on purpose'):
        list(reader)


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('reader_kind', list(READERS))
def test_predicate_selects_rows(dataset_url, reader_kind, pool):
    wanted = {3, 17, 64, 119}
    ids = _read_ids(reader_kind, dataset_url, reader_pool_type=pool, predicate=in_set(wanted, 'id'))
    assert sorted(ids) == sorted(wanted)


def _child_processes():
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize('pool', POOLS)
def test_readers_leave_no_threads_or_processes(dataset_url, pool):
    threads_before = set(threading.enumerate())
    children_before = _child_processes()
    with make_reader(dataset_url, reader_pool_type=pool, workers_count=3, num_epochs=None) as reader:
        for _ in range(10):
            next(reader)
    reader = make_batch_reader(dataset_url, reader_pool_type=pool, workers_count=2)
    list(reader)
    reader.stop()
    reader.join()
    assert set(threading.enumerate()) - threads_before == set()
    import time

    deadline = time.monotonic() + 5
    while _child_processes() - children_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _child_processes() - children_before == set()


def test_reading_after_stop_raises(dataset_url):
    reader = make_reader(dataset_url, reader_pool_type='thread')
    next(reader)
    reader.stop()
    reader.join()
    with pytest.raises(RuntimeError, match='Trying to read a sample after a reader'):
        next(reader)


def test_reset_only_after_the_data_ran_out(dataset_url):
    with make_reader(dataset_url, reader_pool_type='thread', seed=1) as reader:
        next(reader)
        with pytest.raises(NotImplementedError, match='resetting a reader while in the middle'):
            reader.reset()
        first = 1 + sum(1 for _ in reader)
        assert reader.last_row_consumed
        reader.reset()
        assert sorted(int(r.id) for r in reader) == list(range(ROWS))
    assert first == ROWS


def test_stress_random_finite_reads_deliver_every_row_once(dataset_url):
    rng = random.Random(2026)
    for trial in range(200):
        reader_kind = rng.choice(list(READERS))
        pool = rng.choice(['dummy', 'thread', 'thread', 'thread', 'process'] if trial % 10 == 0 else
                          ['dummy', 'thread'])
        shard_count = rng.randint(1, 5)
        options = dict(reader_pool_type=pool, workers_count=rng.randint(1, 4), seed=rng.choice([None, 0, 7, 99]),
                       shuffle_rows=rng.random() < 0.5, shuffle_row_groups=rng.random() < 0.8,
                       shuffle_row_drop_partitions=rng.randint(1, 3), num_epochs=rng.randint(1, 2))
        got = []
        for shard in range(shard_count):
            got += _read_ids(reader_kind, dataset_url, cur_shard=shard, shard_count=shard_count, **options)
        assert collections.Counter(got) == dict.fromkeys(range(ROWS), options['num_epochs']), (trial, options)


@pytest.mark.parametrize('pool', POOLS)
def test_an_abandoned_reader_is_cleaned_up_by_garbage_collection(dataset_url, pool):
    import gc
    import time

    threads_before = set(threading.enumerate())
    children_before = _child_processes()
    reader = make_reader(dataset_url, reader_pool_type=pool, workers_count=2, num_epochs=None)
    next(reader)
    del reader
    gc.collect()
    deadline = time.monotonic() + 10
    while (set(threading.enumerate()) - threads_before or _child_processes() - children_before) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - threads_before == set()
    assert _child_processes() - children_before == set()
