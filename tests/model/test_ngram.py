"""NGram windows: validation, window rules, and both readers with every pool kind."""

import collections

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.ngram import NGram
from petastorm.unischema import Unischema, UnischemaField

pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')

Seq = Unischema('Seq', [
    UnischemaField('ts', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('value', np.float32, (2,), NdarrayCodec(), False),
    UnischemaField('tag', np.str_, (), ScalarCodec(pa.string()), False),
])
# Gaps of more than 1 (between 3 and 10, 14 and 30) break windows when delta_threshold=1.
TIMESTAMPS = [0, 1, 2, 3, 10, 11, 12, 13, 14, 30, 31, 32]


def _expected_windows(timestamps, length, delta):
    windows = [timestamps[i:i + length] for i in range(len(timestamps) - length + 1)]
    return [tuple(w) for w in windows if all(b - a <= delta for a, b in zip(w, w[1:], strict=False))]


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    target = 'file://' + str(tmp_path_factory.mktemp('ngram') / 'seq')
    write_dataset(target, Seq, ({'ts': t, 'value': np.full(2, t, np.float32), 'tag': f't{t}'} for t in TIMESTAMPS))
    return target


def _ngram(**kwargs):
    fields = kwargs.pop('fields', {-1: [Seq.ts, Seq.value], 0: [Seq.ts, 'tag'], 1: ['ts']})
    return NGram(fields, delta_threshold=kwargs.pop('delta', 1), timestamp_field=kwargs.pop('ts', Seq.ts), **kwargs)


@pytest.mark.parametrize('pool', ['dummy', 'thread', 'process'])
def test_make_reader_yields_windows_of_consecutive_rows(url, pool):
    with make_reader(url, schema_fields=_ngram(), reader_pool_type=pool, workers_count=2,
                     shuffle_row_groups=False) as reader:
        windows = list(reader)
    got = [(int(w[-1].ts), int(w[0].ts), int(w[1].ts)) for w in windows]
    assert got == _expected_windows(TIMESTAMPS, 3, 1)
    first = windows[0]
    assert first[-1]._fields == ('ts', 'value')
    assert first[0]._fields == ('ts', 'tag')
    assert first[1]._fields == ('ts',)
    np.testing.assert_array_equal(first[-1].value, np.zeros(2, np.float32))
    assert first[0].tag == 't1'


def test_delta_threshold_and_non_overlapping_windows(url):
    wide = _ngram(fields={0: ['ts'], 1: ['ts']}, delta=10)
    with make_reader(url, schema_fields=wide, reader_pool_type='dummy') as reader:
        pairs = [(int(w[0].ts), int(w[1].ts)) for w in reader]
    assert pairs == _expected_windows(TIMESTAMPS, 2, 10)
    separate = _ngram(fields={0: ['ts'], 1: ['ts']}, delta=1, timestamp_overlap=False)
    with make_reader(url, schema_fields=separate, reader_pool_type='dummy') as reader:
        pairs = [(int(w[0].ts), int(w[1].ts)) for w in reader]
    assert pairs == [(0, 1), (2, 3), (10, 11), (12, 13), (30, 31)]


def test_missing_offsets_are_present_and_empty(url):
    gap = _ngram(fields={0: ['ts'], 2: ['ts']})
    with make_reader(url, schema_fields=gap, reader_pool_type='dummy') as reader:
        window = next(reader)
    assert set(window) == {0, 1, 2}
    assert window[1]._fields == ()
    assert (int(window[0].ts), int(window[2].ts)) == (0, 2)


def test_drop_partitions_keep_every_window_exactly_once(url):
    expected = collections.Counter(_expected_windows(TIMESTAMPS, 3, 1))
    for partitions in (1, 2, 3, 5):
        with make_reader(url, schema_fields=_ngram(), reader_pool_type='thread', workers_count=2,
                         shuffle_row_drop_partitions=partitions, seed=3, shuffle_rows=True) as reader:
            got = collections.Counter((int(w[-1].ts), int(w[0].ts), int(w[1].ts)) for w in reader)
        assert got == expected, partitions


def test_batch_reader_yields_columnar_windows(url):
    with make_batch_reader(url, schema_fields=_ngram(), reader_pool_type='dummy') as reader:
        batches = list(reader)
    got = [tuple(int(b[k].ts[i]) for k in (-1, 0, 1)) for b in batches for i in range(len(b[0].ts))]
    assert sorted(got) == _expected_windows(TIMESTAMPS, 3, 1)
    assert batches[0][-1].value.shape == (len(batches[0][-1].ts), 2)


def test_unsorted_data_is_reported(tmp_path):
    target = 'file://' + str(tmp_path / 'unsorted')
    write_dataset(target, Seq, ({'ts': t, 'value': np.zeros(2, np.float32), 'tag': ''} for t in [0, 2, 1, 3]))
    with make_reader(target, schema_fields=_ngram(), reader_pool_type='dummy') as reader, \
            pytest.raises(NotImplementedError, match='sorted by ts'):
        list(reader)


@pytest.mark.parametrize(('kwargs', 'error', 'message'), [
    ({'fields': [Seq.ts]}, ValueError, 'dict'),
    ({'fields': {0: Seq.ts}}, ValueError, 'list'),
    ({'fields': {0: [5]}}, ValueError, 'UnischemaFields or regular expressions'),
    ({'delta': 'x'}, ValueError, 'delta_threshold'),
    ({'ts': 5}, ValueError, 'timestamp_field'),
    ({'timestamp_overlap': 'no'}, ValueError, 'timestamp_overlap'),
])
def test_bad_ngram_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        _ngram(**kwargs)


def test_timestamp_field_must_resolve_to_one_field(url):
    with pytest.raises(ValueError, match='does not match any field'):
        make_reader(url, schema_fields=_ngram(ts='nope'))
    with pytest.raises(ValueError, match='more than one unischema field'):
        make_reader(url, schema_fields=_ngram(ts='t.*'))


def test_ngram_option_conflicts(url):
    from petastorm import TransformSpec

    with pytest.raises(NotImplementedError, match='timestamp_overlap=False'):
        make_reader(url, schema_fields=_ngram(timestamp_overlap=False), shuffle_row_drop_partitions=2)
    with pytest.raises(ValueError, match='transform_spec cannot be combined'):
        make_reader(url, schema_fields=_ngram(), transform_spec=TransformSpec(lambda r: r))


def test_form_ngram_and_equality():
    ngram = _ngram(fields={0: ['ts'], 1: ['ts', 'tag']})
    rows = [{'ts': t, 'tag': f't{t}', 'value': None} for t in [5, 6, 9]]
    windows = ngram.form_ngram(rows, Seq)
    assert windows == [{0: {'ts': 5}, 1: {'ts': 6, 'tag': 't6'}}]
    assert ngram == _ngram(fields={0: ['ts'], 1: ['tag', 'ts']})
    assert ngram != _ngram(fields={0: ['ts'], 1: ['ts']})
    assert ngram.length == 2
    assert ngram.get_field_names_at_all_timesteps() == ['ts', 'tag']
