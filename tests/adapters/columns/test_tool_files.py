"""Nested, ragged and null columns in Parquet files written by DuckDB and Polars, through every reader and loader.

Each file is written by the tool in the test; what every reader and loader delivers, turned back into rows, equals
pyarrow's ``to_pylist()`` of the same file.
"""

from __future__ import annotations

import os
import warnings

import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.pytorch import BatchedDataLoader, DataLoader
from support.nested_tables import assert_rows_equal, batch_rows, expected_rows
from support.torch_rows import torch_batch_rows

duckdb = pytest.importorskip('duckdb')
polars = pytest.importorskip('polars')


ROWS = 30


def _duckdb_file(path):
    duckdb.sql(f"""
        COPY (SELECT i::BIGINT AS id,
                     CASE WHEN i % 4 = 0 THEN NULL ELSE i * 2 END AS n,
                     list_transform(range(i % 4), lambda x: x::DOUBLE) AS vals,
                     [[i, i + 1], [i]] AS nested,
                     {{'a': i, 'b': 'x' || i::VARCHAR}} AS st,
                     MAP(['k' || i::VARCHAR], [i]) AS m,
                     DATE '2024-01-01' + i::INTEGER AS day
              FROM range({ROWS}) t(i))
        TO '{path}' (FORMAT PARQUET, ROW_GROUP_SIZE 8)""")


def _polars_file(path):
    frame = polars.DataFrame({
        'id': list(range(ROWS)),
        'n': [None if i % 3 == 0 else float(i) for i in range(ROWS)],
        'vals': [[float(k) for k in range(i % 5)] for i in range(ROWS)],
        'nested': [[[i], [i, i]] for i in range(ROWS)],
        'st': [{'a': i, 'b': None if i % 2 else 'y'} for i in range(ROWS)],
        'label': [('cat', 'dog')[i % 2] for i in range(ROWS)],
    }).with_columns(polars.col('label').cast(polars.Categorical))
    frame.write_parquet(path, row_group_size=8)


WRITERS = {'duckdb': _duckdb_file, 'polars': _polars_file}
NUMERIC = {'duckdb': ['id', 'n', 'vals', 'nested', 'st.a', 'day'], 'polars': ['id', 'n', 'vals', 'nested', 'st.a']}


@pytest.fixture(params=sorted(WRITERS), scope='module')
def written(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / 'data.parquet'
    WRITERS[request.param](str(path))
    return request.param, 'file://' + str(path), pq.read_table(path)


def _subset(rows, fields):
    out = []
    for row in rows:
        kept = {}
        for name in fields:
            top, _, leaf = name.partition('.')
            if leaf:
                kept[top] = None if row[top] is None else {leaf: row[top][leaf]}
            else:
                kept[top] = row[top]
        out.append(kept)
    return out


def test_batch_reader(written):
    _, url, table = written
    with make_batch_reader(url, reader_pool_type='process', workers_count=2, shuffle_rows=True, seed=1) as reader:
        rows = [row for batch in reader for row in batch_rows(batch)]
    assert_rows_equal(rows, expected_rows(table))


def test_row_reader_in_two_shards(written):
    _, url, table = written
    rows = []
    for shard in (0, 1):
        with make_reader(url, cur_shard=shard, shard_count=2, reader_pool_type='thread', seed=2,
                         shuffle_rows=True) as reader:
            rows.extend(row._asdict() for row in reader)
    assert_rows_equal(rows, expected_rows(table))


def test_torch_loaders(written):
    tool, url, table = written
    expected = expected_rows(table)
    with DataLoader(make_reader(url, reader_pool_type='dummy'), batch_size=7, nulls='mask',
                    variable_length='jagged', shuffling_queue_capacity=9) as loader:
        rows = [row for batch in loader for row in torch_batch_rows(batch)]
    if tool == 'duckdb':  # DataLoader makes days int64 counts since the epoch
        expected_days = {row['id']: row['day'] for row in expected}
        assert all(row['day'] == expected_days[row['id']] for row in rows)
    assert_rows_equal(rows, expected)
    fields = NUMERIC[tool]
    with BatchedDataLoader(make_batch_reader(url, schema_fields=fields, reader_pool_type='dummy'), batch_size=5,
                           nulls='mask', shuffling_queue_capacity=11, variable_length='jagged') as loader:
        rows = [row for batch in loader for row in torch_batch_rows(batch)]
    assert_rows_equal(rows, _subset(expected, fields))


def test_tensorflow(written):
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    tf = pytest.importorskip('tensorflow')
    from petastorm.tf_utils import make_petastorm_dataset

    tool, url, table = written
    fields = ['id', 'vals', 'nested', 'st.a']
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with make_batch_reader(url, schema_fields=fields, reader_pool_type='dummy') as reader:
            elements = list(make_petastorm_dataset(reader, ragged=True))
    ids = [i for element in elements for i in element.id.numpy().tolist()]
    vals = [v for element in elements for v in element.vals.to_list()]
    nested = [v for element in elements for v in element.nested.to_list()]
    st_a = [v for element in elements for v in element.st['a'].numpy().tolist()]
    expected = {row['id']: row for row in table.to_pylist()}
    for i, v, n, a in zip(ids, vals, nested, st_a, strict=True):
        assert v == expected[i]['vals']
        assert n == expected[i]['nested']
        assert a == expected[i]['st']['a']
    assert sorted(ids) == sorted(expected)
    assert isinstance(elements[0].nested, tf.RaggedTensor)
