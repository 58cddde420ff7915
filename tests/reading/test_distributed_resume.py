"""Resuming readers and torch loaders at random points, with the same or another world size; epoch lengths.

Each test compares what a stopped-and-restored run delivers with an uninterrupted run of the same arguments.
"""

import collections
import random
import warnings

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.predicates import in_lambda
from petastorm.unischema import Unischema, UnischemaField
from petastorm.weighted_sampling_reader import WeightedSamplingReader
from support.uneven_parquet import UNEVEN_ROWS, write_uneven_parquet

ROWS = 97
PARQUET_ROWS = UNEVEN_ROWS
Schema = Unischema('ResumeSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vec', np.float32, (2,), NdarrayCodec(), False),
])


@pytest.fixture(scope='module')
def petastorm_url(tmp_path_factory):
    url = 'file://' + str(tmp_path_factory.mktemp('resume') / 'ds')
    rows = ({'id': i, 'vec': np.full(2, i, dtype=np.float32)} for i in range(ROWS))
    write_dataset(url, Schema, rows, row_group_size_mb=0.0005, file_size_mb=0.002)
    return url


@pytest.fixture(scope='module')
def parquet_url(tmp_path_factory):
    return write_uneven_parquet(tmp_path_factory.mktemp('uneven'), partitioned=True)


def _make(kind, url, **kwargs):
    kwargs.setdefault('workers_count', 2)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return (make_reader if kind == 'rows' else make_batch_reader)(url, **kwargs)


def _ids(kind, items):
    if kind == 'rows':
        return [int(row.id) for row in items]
    return [int(i) for batch in items for i in batch.id]


def _take(kind, reader, count):
    return _ids(kind, [next(reader) for _ in range(count)])


RESUME_CASES = [
    ('rows', dict(shuffle_rows=True)),
    ('rows', dict(shuffle_rows=True, shard_mode='rows', cur_shard=1, shard_count=3, shuffle_row_drop_partitions=2)),
    ('rows', dict(predicate=in_lambda(['id'], lambda i: i % 3 != 0), shuffle_rows=True, shard_mode='rows',
                  cur_shard=0, shard_count=2)),
    ('batches', dict(shuffle_rows=True, shard_mode='rows', cur_shard=2, shard_count=3)),
    ('batches', dict(filters=[('x', '>', 20.0)], shard_mode='rows', cur_shard=0, shard_count=2, shuffle_rows=True)),
]


@pytest.mark.parametrize(('kind', 'options'), RESUME_CASES)
def test_reader_resumes_with_exactly_the_rows_not_delivered(petastorm_url, parquet_url, kind, options):
    url = petastorm_url if kind == 'rows' else parquet_url
    options = dict(options, seed=11, num_epochs=2)
    with _make(kind, url, **options) as reader:
        full = list(reader)
    rng = random.Random(repr(options))
    for stop_at in sorted(rng.sample(range(len(full) + 1), 3)):
        with _make(kind, url, **options) as reader:
            head = _take(kind, reader, stop_at)
            state = reader.state_dict()
        with _make(kind, url, **options) as reader:
            reader.load_state_dict(state)
            tail = _ids(kind, reader)
        assert head + tail == _ids(kind, full), f'stopped after {stop_at} items'


def test_unseeded_reader_resumes_in_its_own_order(petastorm_url):
    with _make('rows', petastorm_url, shuffle_rows=True) as reader:
        head = _take('rows', reader, 40)
        state = reader.state_dict()
    with _make('rows', petastorm_url, shuffle_rows=True) as reader:
        reader.load_state_dict(state)
        tail = _ids('rows', reader)
    assert sorted(head + tail) == list(range(ROWS))


@pytest.mark.parametrize('remainder', ['pad', 'drop_last'])
@pytest.mark.parametrize('pass_every_state', [False, True])
def test_readers_resume_from_four_ranks_on_two(parquet_url, remainder, pass_every_state):
    options = dict(seed=5, shuffle_rows=True, shard_mode='rows', shard_remainder=remainder)
    heads, states = [], []
    for rank in range(4):
        with _make('rows', parquet_url, cur_shard=rank, shard_count=4, **options) as reader:
            assert reader.num_rows_per_epoch == (25 if remainder == 'pad' else 24)
            heads.append(_take('rows', reader, 9))
            states.append(reader.state_dict())
    if not pass_every_state:  # one state stands for all: every rank took the same number of rows
        states = [states[0]]
    tails = []
    for rank in range(2):
        with _make('rows', parquet_url, cur_shard=rank, shard_count=2, **options) as reader:
            reader.load_state_dict(states)
            tails.append(_ids('rows', reader))
    assert len(tails[0]) == len(tails[1]), 'equal shares after the world size changed'
    seen = collections.Counter(i for part in heads + tails for i in part)
    if remainder == 'drop_last':
        assert max(seen.values()) == 1, 'no row twice'
        assert PARQUET_ROWS - len(seen) < 4 + 2, 'only the remainders are dropped'
    else:
        assert set(seen) == set(range(PARQUET_ROWS))
        assert sum(seen.values()) - PARQUET_ROWS < 4 + 2, 'only the remainders are repeated'


def test_state_errors_name_the_problem(parquet_url):
    with _make('batches', parquet_url, seed=1, shard_mode='rows', cur_shard=0, shard_count=2) as reader:
        next(reader)
        state = reader.state_dict()
        with pytest.raises(RuntimeError, match='before reading'):
            reader.load_state_dict(state)
    with _make('batches', parquet_url, seed=2, shard_mode='rows', cur_shard=0, shard_count=2) as reader, \
            pytest.raises(ValueError, match='seed=1'):
        reader.load_state_dict(state)
    with _make('batches', parquet_url, seed=1, cur_shard=0, shard_count=3) as reader, \
            pytest.raises(ValueError, match='shard_mode'):
        reader.load_state_dict(state)
    with _make('batches', parquet_url, seed=1, cur_shard=0, shard_count=2) as reader:
        row_group_state = reader.state_dict()
    with _make('batches', parquet_url, seed=1, cur_shard=0, shard_count=3) as reader, \
            pytest.raises(ValueError, match="needs shard_mode='rows'"):
        reader.load_state_dict(row_group_state)


def test_epoch_length_from_metadata(parquet_url):
    options = dict(shard_mode='rows', cur_shard=1, shard_count=4, num_epochs=3, workers_count=1, seed=4)
    with _make('rows', parquet_url, **options) as reader:
        assert reader.num_rows_per_epoch == 25
        assert reader.num_rows_per_pass == len(reader) == 75
        assert len(list(reader)) == 75
        assert reader.diagnostics['rows_remainder_per_epoch'] == 1
    with _make('batches', parquet_url, **options) as reader:
        assert len(reader) == len(list(reader))
    with _make('batches', parquet_url, predicate=in_lambda(['part'], lambda part: part == 1)) as reader:
        assert reader.num_rows_per_epoch == 31 == len(_ids('batches', reader)), 'partition predicates are exact'
    with _make('batches', parquet_url, filters=[('x', '<', 3.0)]) as reader:
        assert reader.num_rows_per_epoch is None
        with pytest.raises(TypeError, match='num_rows_per_epoch'):
            len(reader)
        assert reader, 'a reader stays truthy without a len()'


def test_len_after_resume_matches_delivery(parquet_url):
    # A state saved after the last epoch whose rows a loader still held: only those rows remain to be read.
    options = dict(seed=1, num_epochs=1, workers_count=1)
    with _make('batches', parquet_url, **options) as reader:
        list(reader)
        state = dict(reader.state_dict(), pending=[[0, 0, 3]])
    with _make('batches', parquet_url, **options) as reader:
        reader.load_state_dict(state)
        expected = len(reader)
        batches = list(reader)
    assert expected == len(batches) == 1
    assert len(_ids('batches', batches)) == 3

    # A state saved inside a later epoch of the pass: len() counts only the epochs still to be read.
    options = dict(seed=1, num_epochs=3, workers_count=1)
    with _make('batches', parquet_url, **options) as reader:
        per_epoch = len(reader) // 3
        for _ in range(per_epoch + 2):
            next(reader)
        state = reader.state_dict()
    with _make('batches', parquet_url, **options) as reader:
        reader.load_state_dict(state)
        assert len(reader) == len(list(reader))

    # A row reader counts rows: after a restore, only those the pass still has to deliver.
    with _make('rows', parquet_url, **options) as reader:
        for _ in range(40):
            next(reader)
        state = reader.state_dict()
    with _make('rows', parquet_url, **options) as reader:
        reader.load_state_dict(state)
        assert reader.num_rows_per_pass == 3 * PARQUET_ROWS
        assert len(reader) == reader.num_rows_this_pass == 3 * PARQUET_ROWS - 40
        assert len(list(reader)) == 3 * PARQUET_ROWS - 40


@pytest.mark.parametrize('loader_kind', ['DataLoader', 'BatchedDataLoader'])
@pytest.mark.parametrize('capacity', [0, 30])
def test_torch_loaders_resume(parquet_url, loader_kind, capacity):
    from petastorm import pytorch

    loader_class = getattr(pytorch, loader_kind)
    options = dict(seed=3, shuffle_rows=True, shard_mode='rows', cur_shard=1, shard_count=2, num_epochs=2)

    def loader():
        return loader_class(_make('batches', parquet_url, **options), batch_size=7,
                            shuffling_queue_capacity=capacity)

    with loader() as whole:
        assert len(whole) == 15  # ceil(2 * 50 / 7)
        full = [b['id'].tolist() for b in whole]
    assert len(full) == 15
    for stop_at in (1, 6, 14):
        with loader() as first:
            batches = iter(first)
            head = [next(batches)['id'].tolist() for _ in range(stop_at)]
            state = first.state_dict()
        with loader() as second:
            second.load_state_dict(state)
            assert len(second) == 15, 'the batches of a whole pass, as trainers count an epoch from its start'
            tail = [b['id'].tolist() for b in second]
        assert len(head) + len(tail) == 15
        rows, expected = sum(head + tail, []), sum(full, [])
        if capacity:
            assert sorted(rows) == sorted(expected), 'buffered rows are read again, none lost or repeated'
        else:
            assert rows == expected


def test_torch_loaders_resume_from_four_ranks_on_two(parquet_url):
    from petastorm.pytorch import DataLoader

    options = dict(seed=9, shard_mode='rows', shard_remainder='drop_last', shuffle_rows=True)
    heads, states = [], []
    for rank in range(4):
        with DataLoader(_make('batches', parquet_url, cur_shard=rank, shard_count=4, **options), batch_size=4,
                        shuffling_queue_capacity=10) as loader:
            batches = iter(loader)
            heads += [i for _ in range(3) for i in next(batches)['id'].tolist()]
            states.append(loader.state_dict())
    tails = []
    for rank in range(2):
        reader = _make('batches', parquet_url, cur_shard=rank, shard_count=2, **options)
        with DataLoader(reader, batch_size=4) as loader:
            loader.load_state_dict({**states[0], 'reader': [s['reader'] for s in states]})
            tails.append([i for b in loader for i in b['id'].tolist()])
    assert len(tails[0]) == len(tails[1])
    seen = collections.Counter(heads + tails[0] + tails[1])
    assert max(seen.values()) == 1
    assert PARQUET_ROWS - len(seen) < 4 + 2


def test_ranks_that_read_their_whole_share_resume_their_buffered_rows_on_another_world_size(parquet_url):
    # Saved when every rank's reader had handed its whole share to the loader (the epoch's last rows in its
    # shuffling buffer): those buffered rows are the rest of the epoch, split between the new ranks.
    from petastorm.pytorch import DataLoader

    options = dict(seed=4, shard_mode='rows', shard_remainder='drop_last', shuffle_rows=True, num_epochs=1)
    heads, states = [], []
    for rank in range(2):
        reader = _make('batches', parquet_url, cur_shard=rank, shard_count=2, **options)
        with DataLoader(reader, batch_size=8, shuffling_queue_capacity=30) as loader:
            iterator = iter(loader)
            for _ in range(len(loader) - 2):
                heads += next(iterator)['id'].tolist()
            state = loader.state_dict()
            assert state['reader']['consumed'] == 0, 'the reader is at the next epoch, holding only buffered rows'
            states.append(state)
    with DataLoader(_make('batches', parquet_url, cur_shard=0, shard_count=1, **options), batch_size=8) as loader:
        loader.load_state_dict({**states[0], 'reader': [s['reader'] for s in states]})
        rest = [i for b in loader for i in b['id'].tolist()]
    seen = collections.Counter(heads + rest)
    assert max(seen.values()) == 1
    assert len(seen) == PARQUET_ROWS - PARQUET_ROWS % 2


def test_weighted_sampling_keeps_its_mixture_under_resume(petastorm_url, parquet_url):
    def mix():
        readers = [_make('rows', petastorm_url, seed=1, num_epochs=None),
                   _make('rows', petastorm_url, seed=2, num_epochs=None, shuffle_rows=True)]
        return WeightedSamplingReader(readers, [0.7, 0.3], seed=4)

    with mix() as whole:
        full = [int(next(whole).id) for _ in range(150)]
    with mix() as first:
        head = [int(next(first).id) for _ in range(61)]
        state = first.state_dict()
    with mix() as second:
        second.load_state_dict(state)
        tail = [int(next(second).id) for _ in range(89)]
    assert head + tail == full


def test_loaders_without_a_position_say_so(parquet_url, petastorm_url):
    from petastorm.pytorch import DataLoader

    # A WeightedSamplingReader of readers has a position under the loaders: test_weighted_sampling_resume.py.
    real = _make('rows', petastorm_url)
    mix = WeightedSamplingReader([real, _Rows(real.schema)], [0.5, 0.5])
    with DataLoader(mix, batch_size=4) as loader, pytest.raises(NotImplementedError, match='WeightedSamplingReader'):
        loader.load_state_dict({})


class _Rows:
    """A reader-like object of rows (no column batches, no position)."""

    def __init__(self, schema):
        self._rows = iter(())
        self.batched_output, self.ngram, self.last_row_consumed, self.schema = False, None, False, schema

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._rows)

    def stop(self):
        pass

    def join(self):
        pass
