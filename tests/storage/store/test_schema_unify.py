"""Files whose schemas differ: the unification rules of ``petastorm.store.unify`` and the reader following them."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.errors import SchemaError
from petastorm.store.unify import conform_table, unify_file_schemas
from support.nested_tables import batch_rows


def _schemas(*fields_per_file):
    return {f'f{i}.parquet': pa.schema(fields) for i, fields in enumerate(fields_per_file)}


def test_identical_schemas_are_the_schema_itself():
    schema = pa.schema([pa.field('a', pa.int32(), nullable=False)])
    unified = unify_file_schemas({'a': schema, 'b': schema})
    assert unified.schema.equals(schema)
    assert not unified.differs


def test_types_promote_and_missing_columns_become_nullable():
    unified = unify_file_schemas(_schemas(
        [pa.field('id', pa.int32(), nullable=False), pa.field('x', pa.float32())],
        [pa.field('id', pa.int64(), nullable=False), pa.field('x', pa.float64()), pa.field('new', pa.string(),
                                                                                           nullable=False)],
        [pa.field('id', pa.int16(), nullable=False), pa.field('x', pa.int64()),
         pa.field('tags', pa.list_(pa.int32()))]))
    assert unified.schema.names == ['id', 'x', 'new', 'tags']
    assert unified.schema.field('id').type == pa.int64()
    assert not unified.schema.field('id').nullable  # non-nullable in every file
    assert unified.schema.field('x').type == pa.float64()
    assert unified.schema.field('new').nullable  # missing from two files
    described = unified.describe(limit=20)
    assert "'id' is int32 in f0.parquet (read as int64)" in described
    assert "'new' is missing from f0.parquet (nulls there)" in described
    assert unified.file_columns['f2.parquet'] == ('id', 'x', 'tags')


def test_dictionary_encoding_is_not_a_type_and_structs_merge_field_by_field():
    unified = unify_file_schemas(_schemas(
        [pa.field('s', pa.dictionary(pa.int32(), pa.string())), pa.field('st', pa.struct([('a', pa.int32())]))],
        [pa.field('s', pa.string()), pa.field('st', pa.struct([('b', pa.string())]))]))
    assert unified.schema.field('s').type == pa.string()
    assert unified.schema.field('st').type == pa.struct([('a', pa.int32()), ('b', pa.string())])


def test_types_that_do_not_promote_are_named_with_their_files():
    with pytest.raises(SchemaError, match=r"column 'id'.*int64 in f0.parquet; string in f1.parquet"):
        unify_file_schemas(_schemas([pa.field('id', pa.int64())], [pa.field('id', pa.string())]))


def test_conform_table_casts_and_fills_in_nulls():
    table = pa.table({'id': pa.array([1, 2], pa.int32())})
    target = pa.schema([pa.field('id', pa.int64()), pa.field('new', pa.list_(pa.string()))])
    conformed = conform_table(table, target)
    assert conformed.schema.equals(target)
    assert conformed.to_pylist() == [{'id': 1, 'new': None}, {'id': 2, 'new': None}]


@pytest.fixture
def differing_url(tmp_path):
    pq.write_table(pa.table({'id': pa.array([1, 2], pa.int32()), 'v': pa.array([[1.0], [2.0, 3.0]])}),
                   tmp_path / 'a.parquet')
    pq.write_table(pa.table({'id': pa.array([3, 4], pa.int64()), 'v': pa.array([[4.0], []]),
                             'label': pa.array(['x', None]), 'st': pa.array([{'k': 1}, {'k': 2}])}),
                   tmp_path / 'b.parquet')
    return 'file://' + str(tmp_path)


@pytest.mark.parametrize('pool', ['dummy', 'process'])
def test_the_reader_reads_every_file_as_the_unified_schema(differing_url, pool):
    with pytest.warns(UserWarning, match=r"differ in their schemas.*'id' is int32 in .*a.parquet \(read as int64\)"
                                         r".*'label' is missing from .*a.parquet"):
        reader = make_batch_reader(differing_url, reader_pool_type=pool, workers_count=2, shuffle_row_groups=False)
    with reader:
        assert reader.schema.fields['id'].numpy_dtype is np.int64
        assert reader.schema.fields['label'].nullable
        batches = list(reader)
    assert all(batch.id.dtype == np.int64 for batch in batches)
    rows = sorted((row for batch in batches for row in batch_rows(batch)), key=lambda row: row['id'])
    assert [row['label'] for row in rows] == [None, None, 'x', None]
    assert [None if row['st'] is None else {k: int(v) for k, v in row['st'].items()} for row in rows] == \
        [None, None, {'k': 1}, {'k': 2}]
    assert [list(row['v']) for row in rows] == [[1.0], [2.0, 3.0], [4.0], []]


def test_the_row_reader_and_a_column_only_some_files_have(differing_url):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with make_reader(differing_url, schema_fields=['id', 'label'], reader_pool_type='dummy') as reader:
            rows = sorted((row.id, row.label) for row in reader)
    assert rows == [(1, None), (2, None), (3, 'x'), (4, None)]
