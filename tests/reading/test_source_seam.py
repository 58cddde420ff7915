"""The seam the loaders read: an iteration contract and a separate position contract, each small.

A reader is both; a mix of readers is both; a reader-like object that only yields items is a column source
without positions, and what needs a position refuses it by name.
"""

from __future__ import annotations

import typing

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.ngram import NGram
from petastorm.reading import BatchStream, ColumnSource, PositionSource, SourceInfo, as_column_source, positions_of
from petastorm.reading.source import ItemSource
from petastorm.test_util.reader_mock import ReaderMock
from petastorm.unischema import Unischema, UnischemaField
from petastorm.weighted_sampling_reader import WeightedSamplingReader

ITERATION = {'info', 'num_rows_per_pass', 'num_rows_this_pass', 'last_row_consumed', 'stopped', 'column_batches',
             'restart', 'stop', 'join'}
POSITIONS = {'resumable', 'state_dict', 'state_holding', 'load_state_dict'}


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp('seam') / 'ids.parquet'
    ids = np.arange(40, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), str(path), row_group_size=10)
    return f'file://{path}'


def test_the_two_contracts_are_small_and_apart():
    iteration = set(typing._get_protocol_attrs(ColumnSource))
    positions = set(typing._get_protocol_attrs(PositionSource))
    assert (iteration, positions) == (ITERATION, POSITIONS)


def test_a_reader_is_both_and_describes_what_it_delivers(url):
    with make_batch_reader(url, reader_pool_type='dummy', seed=3, num_epochs=None) as reader:
        assert isinstance(reader, ColumnSource)
        assert isinstance(reader, PositionSource)
        assert as_column_source('test', reader) is reader
        assert positions_of(reader) is reader
        assert reader.info == SourceInfo(schema=reader.schema, ngram=None, batched_output=True, seed=3,
                                         transform_spec=None, endless=True, sized=False)
        assert (reader.seed, reader.batched_output, reader.endless) == (3, True, True)


def test_a_reader_of_ngrams_has_no_positions(url):
    fields = make_batch_reader(url, reader_pool_type='dummy').schema.fields
    ngram = NGram({0: [fields['id']], 1: [fields['x']]}, delta_threshold=10, timestamp_field=fields['id'])
    with make_reader(url, schema_fields=ngram, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        assert positions_of(reader) is None
        for method, call in (('state_dict', reader.state_dict), ('load_state_dict', lambda: reader.load_state_dict({})),
                             ('load_state_dict', lambda: reader.restart({}))):
            with pytest.raises(NotImplementedError, match=f'^{method}\\(\\) is not supported for NGram readers$'):
                call()


def test_a_mix_of_readers_is_both(url):
    readers = [make_batch_reader(url, reader_pool_type='dummy', num_epochs=None) for _ in range(2)]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=1) as mix:
        assert isinstance(mix, ColumnSource)
        assert positions_of(mix) is mix
        assert mix.info.seed == 1
        assert mix.info.endless
        assert mix.info.batched_output


def test_an_object_that_only_yields_items_is_read_without_positions():
    schema = Unischema('Rows', [UnischemaField('id', np.int64, (), None, False)])
    mock = ReaderMock(schema, lambda _: {'id': np.int64(1)})
    source = as_column_source('test', mock)
    assert isinstance(source, ItemSource)
    assert isinstance(source, ColumnSource)
    assert not isinstance(source, PositionSource)
    assert positions_of(source) is None
    assert source.info == SourceInfo(schema=schema, endless=True)
    with pytest.raises(NotImplementedError, match='^positions need a reader from make_reader/make_batch_reader, '
                                                  'got ReaderMock$'):
        source.restart({'version': 1})
    stream = BatchStream(source, 4)
    assert next(iter(stream))['id'].tolist() == [1, 1, 1, 1]
    with pytest.raises(NotImplementedError, match=r'^state_dict\(\) needs a reader from make_reader/'
                                                  r'make_batch_reader \(or a mix of them\), got ReaderMock$'):
        stream.state_dict()
