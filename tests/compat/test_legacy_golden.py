"""Datasets written by Petastorm 0.13.1 (tests/data/legacy_0_13_1) open and decode to the values it decoded."""

import base64
import decimal
import json
import logging
import pathlib
import warnings

import numpy as np
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url, load_row_groups

DATA = pathlib.Path(__file__).resolve().parents[1] / 'data' / 'legacy_0_13_1'
PETASTORM_DATASETS = ['all_types', 'partitioned', 'with_index', 'summary_metadata']
MANIFEST = json.loads((DATA / 'manifest.json').read_text())


def _url(name):
    return 'file://' + str(DATA / name)


def _expected(name):
    return json.loads((DATA / f'{name}.expected.json').read_text())


def _decode(value):
    if value is None:
        return None
    if 'ndarray' in value:
        d = value['ndarray']
        if 'list' in d:
            return np.array(d['list'], dtype=d['dtype']).reshape(d['shape'])
        return np.frombuffer(base64.b64decode(d['b64']), dtype=d['dtype']).reshape(d['shape'])
    if 'scalar' in value:
        return np.dtype(value['scalar']['dtype']).type(value['scalar']['value'])
    if 'decimal' in value:
        return decimal.Decimal(value['decimal'])
    if 'datetime64' in value:
        return np.datetime64(value['datetime64']).astype(value['dtype'])
    raise AssertionError(f'unknown encoding {value}')


def _assert_same(field, ours, theirs, lossy=False):
    if theirs is None:
        assert ours is None, field
        return
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), field
        assert ours.dtype == theirs.dtype, field
        assert ours.shape == theirs.shape, field
        if lossy:
            assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 8, field
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=field)
        return
    if isinstance(theirs, np.datetime64):
        assert np.datetime64(ours, 'us') == theirs, field
        return
    assert type(ours) is type(theirs), (field, type(ours), type(theirs))
    assert ours == theirs, field


@pytest.mark.parametrize('name', PETASTORM_DATASETS)
def test_schema_matches_what_petastorm_stored(name):
    schema = get_schema_from_dataset_url(_url(name))
    expected = _expected(name)['schema']
    assert list(schema.fields) == [f['name'] for f in expected]
    for field, description in zip(schema.fields.values(), expected, strict=True):
        dtype_name = description['numpy_dtype'].split('.')[-1]
        assert field.numpy_dtype.__name__.rstrip('_') == dtype_name.rstrip('_'), field
        assert list(field.shape) == description['shape'], field
        assert field.nullable == description['nullable'], field
        if description['codec'] is None:
            assert field.codec is None
        else:
            assert type(field.codec).__name__ == description['codec'].split('(')[0]


@pytest.mark.parametrize('pool', ['dummy', 'thread'])
@pytest.mark.parametrize('name', PETASTORM_DATASETS)
def test_make_reader_decodes_identical_values(name, pool):
    expected = _expected(name)
    with make_reader(_url(name), reader_pool_type=pool, workers_count=2) as reader:
        rows = sorted(reader, key=lambda r: int(r.id))
    assert len(rows) == len(expected['rows']) == MANIFEST['datasets'][name]['total_rows']
    for ours, theirs in zip(rows, expected['rows'], strict=True):
        for field, value in theirs.items():
            _assert_same(field, getattr(ours, field), _decode(value), lossy='jpeg' in field)


def test_row_groups_follow_petastorm_piece_order():
    for name in PETASTORM_DATASETS:
        pieces = load_row_groups(_url(name))
        relative = [str(pathlib.Path(p.path).relative_to(DATA / name)) for p in pieces]
        assert relative == sorted(relative), name
        assert sum(p.num_rows for p in pieces) == len(_expected(name)['rows'])


def test_plain_parquet_batches_match_petastorm():
    expected = _expected('plain_parquet')
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # a plain store is what make_batch_reader is for: no warning
        with make_batch_reader(_url('plain_parquet'), reader_pool_type='dummy') as reader:
            batches = list(reader)
    columns = {name: np.concatenate([getattr(b, name) for b in batches]) for name in batches[0]._fields}
    order = np.argsort(columns['id'])
    for name, description in expected['column_dtypes'].items():
        column = columns[name][order]
        assert column.shape == tuple(description['shape']), name
        assert column.dtype.kind == np.dtype(description['dtype']).kind, name
    for i, row in enumerate(expected['rows']):
        for name, value in row.items():
            np.testing.assert_array_equal(columns[name][order][i], _decode(value), err_msg=name)


def test_make_reader_on_plain_parquet_reads_it_quietly(caplog):
    # Petastorm warned 'Currently make_reader supports reading only Petastorm datasets' and read it all the same;
    # a store written by pandas, Polars, DuckDB or Hugging Face is what make_reader meets every day.
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with caplog.at_level(logging.INFO, logger='petastorm.reader'):
            reader = make_reader(_url('plain_parquet'), reader_pool_type='dummy')
    assert 'has no Petastorm metadata; reading it with the schema of its Parquet files' in caplog.text
    with reader:
        assert sorted(int(r.id) for r in reader) == list(range(len(_expected('plain_parquet')['rows'])))
