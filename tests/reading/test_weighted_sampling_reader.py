"""WeightedSamplingReader: mixture proportions, seeding, validation, end of data and clean shutdown."""

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.ngram import NGram
from petastorm.unischema import Unischema, UnischemaField
from petastorm.weighted_sampling_reader import WeightedSamplingReader

ROWS = 50
Schema = Unischema('MixSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vec', np.float32, (2,), NdarrayCodec(), False),
])
# make_batch_reader on a Petastorm dataset warns as Petastorm does.
pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')


def _write(path, offset):
    url = 'file://' + str(path)
    rows = ({'id': offset + i, 'vec': np.full(2, offset + i, dtype=np.float32)} for i in range(ROWS))
    write_dataset(url, Schema, rows, row_group_size_mb=0.0005)
    return url


@pytest.fixture(scope='module')
def urls(tmp_path_factory):
    root = tmp_path_factory.mktemp('mix')
    return _write(root / 'a', 0), _write(root / 'b', 1000)


def _source(item):
    return 'b' if int(item.id) >= 1000 else 'a'


def _endless(url, **kwargs):
    kwargs.setdefault('reader_pool_type', 'dummy')
    return make_reader(url, num_epochs=None, shuffle_row_groups=False, **kwargs)


def _draw(mixed, count):
    return [_source(next(mixed)) for _ in range(count)]


def test_mixture_follows_the_probabilities(urls):
    with WeightedSamplingReader([_endless(urls[0]), _endless(urls[1])], [1, 3], seed=7) as mixed:
        sources = _draw(mixed, 2000)
    share_b = sources.count('b') / len(sources)
    assert abs(share_b - 0.75) < 0.04, share_b


def test_rows_of_each_reader_keep_their_order(urls):
    with WeightedSamplingReader([_endless(urls[0]), _endless(urls[1])], [0.5, 0.5], seed=1) as mixed:
        ids = [int(next(mixed).id) for _ in range(200)]
    from_a = [i for i in ids if i < 1000]
    from_b = [i - 1000 for i in ids if i >= 1000]
    assert from_a == [i % ROWS for i in range(len(from_a))]
    assert from_b == [i % ROWS for i in range(len(from_b))]


def test_same_seed_same_mix_other_seed_other_mix(urls):
    def mix(seed):
        with WeightedSamplingReader([_endless(urls[0]), _endless(urls[1])], [0.5, 0.5], seed=seed) as mixed:
            return [int(next(mixed).id) for _ in range(300)]

    assert mix(3) == mix(3)
    assert mix(3) != mix(4)


def test_zero_probability_reader_is_never_chosen(urls):
    with WeightedSamplingReader([_endless(urls[0]), _endless(urls[1])], [0.0, 2.0], seed=0) as mixed:
        assert set(_draw(mixed, 300)) == {'b'}
    with WeightedSamplingReader([_endless(urls[0]), _endless(urls[1])], [5, 0], seed=0) as mixed:
        assert set(_draw(mixed, 300)) == {'a'}


def test_the_mix_ends_when_the_chosen_reader_ends(urls):
    short = make_reader(urls[0], reader_pool_type='dummy', num_epochs=1)
    with WeightedSamplingReader([short, _endless(urls[1])], [0.5, 0.5], seed=2) as mixed:
        items = list(mixed)
        # Every row of the short reader came out, then the mix ended on the next draw that chose it.
        assert sum(1 for item in items if _source(item) == 'a') == ROWS
        assert len(items) > ROWS
        assert mixed.last_row_consumed
        with pytest.raises(StopIteration):
            next(mixed)  # stays ended, does not resume from the other reader


def test_batch_readers_mix_batches(urls):
    readers = [make_batch_reader(url, reader_pool_type='dummy', num_epochs=None) for url in urls]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=0) as mixed:
        assert mixed.batched_output
        assert set(mixed.schema.fields) == {'id', 'vec'}
        batches = [next(mixed) for _ in range(40)]
    assert all(isinstance(batch.id, np.ndarray) for batch in batches)
    assert {'b' if batch.id[0] >= 1000 else 'a' for batch in batches} == {'a', 'b'}
    assert all(batch.vec.shape == (len(batch.id), 2) for batch in batches)


def test_ngram_readers_mix_windows(urls):
    def ngram():
        return NGram({0: ['id', 'vec'], 1: ['id']}, delta_threshold=1, timestamp_field='id')

    readers = [make_reader(url, schema_fields=ngram(), reader_pool_type='dummy', num_epochs=None) for url in urls]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=0) as mixed:
        assert mixed.ngram == ngram()
        window = next(mixed)
    assert set(window) == {0, 1}
    assert int(window[1].id) == int(window[0].id) + 1


def test_exposes_the_first_readers_properties(urls):
    with WeightedSamplingReader([_endless(urls[0]), _endless(urls[1])], [1, 1]) as mixed:
        assert mixed.schema is mixed.readers[0].schema
        assert mixed.ngram is None
        assert mixed.batched_output is False
        assert mixed.last_row_consumed is False
        assert iter(mixed) is mixed


@pytest.fixture
def open_readers():
    made = []
    yield made
    for reader in made:
        reader.stop()
        reader.join()


@pytest.mark.parametrize('count', [0, 1])
def test_fewer_than_two_readers(urls, open_readers, count):
    open_readers.extend(_endless(urls[0]) for _ in range(count))
    with pytest.raises(ValueError, match=f'^Two or more readers must be specified. Got {count}.$'):
        WeightedSamplingReader(open_readers, [1.0] * count)


@pytest.mark.parametrize(('probabilities', 'message'), [
    ([1.0], 'same length'),
    ([0.5, 0.3, 0.2], 'same length'),
    ([-0.1, 1.1], 'non-negative'),
    ([0.0, 0.0], 'at least one probability must be positive'),
    ([float('nan'), 1.0], 'finite'),
    (['a', 1.0], 'must be numbers'),
])
def test_bad_probabilities(urls, open_readers, probabilities, message):
    open_readers.extend([_endless(urls[0]), _endless(urls[1])])
    with pytest.raises(ValueError, match=message):
        WeightedSamplingReader(open_readers, probabilities)


def test_readers_must_have_the_same_fields(urls, open_readers):
    open_readers.extend([_endless(urls[0]), _endless(urls[1], schema_fields=['id'])])
    with pytest.raises(ValueError, match=r"should have the same schema.*only in reader 0: \['vec'\]"):
        WeightedSamplingReader(open_readers, [0.5, 0.5])


def test_readers_must_all_be_batched_or_not(urls, open_readers):
    open_readers.extend([_endless(urls[0]), make_batch_reader(urls[1], reader_pool_type='dummy')])
    with pytest.raises(ValueError, match='same batched_output'):
        WeightedSamplingReader(open_readers, [0.5, 0.5])


def test_readers_must_have_the_same_ngram(urls, open_readers):
    ngram = NGram({0: ['id'], 1: ['id']}, delta_threshold=1, timestamp_field='id')
    open_readers.extend([_endless(urls[0]), _endless(urls[1], schema_fields=ngram)])
    with pytest.raises(ValueError, match='same ngram'):
        WeightedSamplingReader(open_readers, [0.5, 0.5])


def _threads_settle(baseline, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in baseline]
        if not extra:
            return []
        time.sleep(0.05)
    return extra


def test_context_manager_stops_and_joins_every_reader(urls):
    baseline = set(threading.enumerate())
    readers = [_endless(url, reader_pool_type='thread', workers_count=3) for url in urls]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=0) as mixed:
        _draw(mixed, 50)
        assert len(threading.enumerate()) > len(baseline)
    assert all(reader.stopped for reader in readers)
    assert _threads_settle(baseline) == []
    with pytest.raises(RuntimeError, match='has stopped'):
        next(readers[0])
