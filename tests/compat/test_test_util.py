"""petastorm.test_util: ReaderMock and the shuffle-quality measure."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import load_row_groups
from petastorm.test_util.reader_mock import ReaderMock, schema_data_generator_example
from petastorm.test_util.shuffling_analysis import (
    compute_correlation_distribution,
    generate_shuffle_analysis_dataset,
)
from petastorm.unischema import Unischema, UnischemaField

MockSchema = Unischema('MockSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('price', Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
    UnischemaField('image', np.uint8, (None, 4, 3), NdarrayCodec(), False),
])


def test_reader_mock_yields_generated_rows_forever():
    with ReaderMock(MockSchema, schema_data_generator_example) as reader:
        assert reader.schema is MockSchema
        assert reader.batched_output is False
        assert reader.ngram is None
        rows = [next(reader) for _ in range(3)] + [reader.next()]
    row = rows[0]
    assert row._fields == ('id', 'name', 'price', 'image')
    assert row.id == 0
    assert isinstance(row.id, np.int64)
    assert row.name == ''
    assert row.price == Decimal('0.0')
    assert row.image.shape == (10, 4, 3)
    assert row.image.dtype == np.uint8
    assert not row.image.any()
    reader.stop()
    reader.join()


def test_reader_mock_uses_the_given_generator_and_refuses_ngram():
    counter = iter(range(100))
    reader = ReaderMock(MockSchema, lambda schema: {**schema_data_generator_example(schema), 'id': next(counter)})
    assert [row.id for row, _ in zip(reader, range(5), strict=False)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match='NGram'):
        ReaderMock(MockSchema, schema_data_generator_example, ngram=object())


@pytest.fixture(scope='module')
def shuffle_dataset(tmp_path_factory):
    url = tmp_path_factory.mktemp('shuffle').joinpath('ds').as_uri()
    generate_shuffle_analysis_dataset(None, url, num_rows=1000, row_group_size=100)
    return url


def test_generated_dataset_has_the_requested_row_groups(shuffle_dataset):
    assert [piece.num_rows for piece in load_row_groups(shuffle_dataset)] == [100] * 10


def test_shuffled_reads_decorrelate_ids(shuffle_dataset):
    unshuffled = compute_correlation_distribution(shuffle_dataset, 'id', {'shuffle_row_groups': False},
                                                  num_corr_samples=3)
    assert unshuffled.mean == pytest.approx(1.0)
    assert unshuffled.std == pytest.approx(0.0, abs=1e-9)
    rows_only = compute_correlation_distribution(shuffle_dataset, 'id',
                                                 {'shuffle_row_groups': False, 'shuffle_rows': True},
                                                 num_corr_samples=3)
    assert 0.9 < rows_only.mean < 1.0  # shuffling inside row groups only keeps the global order
    shuffled = compute_correlation_distribution(
        shuffle_dataset, 'id', {'shuffle_row_groups': True, 'shuffle_rows': True, 'shuffle_row_drop_partitions': 2},
        num_corr_samples=20)
    assert abs(shuffled.mean) < 0.3
    assert shuffled.std > 0
    mean, std = shuffled  # unpacks like Petastorm's (mean, std) tuple
    assert (mean, std) == (shuffled.mean, shuffled.std)


def test_correlation_needs_a_unique_id(tmp_path):
    from petastorm import write_dataset

    url = tmp_path.joinpath('dup').as_uri()
    schema = Unischema('Dup', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(url, schema, [{'id': i % 3} for i in range(10)])
    with pytest.raises(ValueError, match='repeated values'):
        compute_correlation_distribution(url, 'id', {'shuffle_row_groups': True}, num_corr_samples=1)
