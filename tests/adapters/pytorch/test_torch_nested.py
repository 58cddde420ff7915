"""Ragged, nested, struct, time and null columns through the torch loaders, in every form they offer.

Files are written by pyarrow; every batch, turned back into rows, equals pyarrow's ``to_pylist()`` rows, with
the reader's shuffles and the loaders' shuffling buffers on.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from petastorm import make_batch_reader, make_reader
from petastorm.errors import MissingDependencyError
from petastorm.pytorch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader, JaggedTensor, TorchTypeError
from support.nested_tables import assert_rows_equal, every_type_table, expected_rows
from support.torch_rows import JAGGED_NESTED, tensor_rows, torch_batch_rows

ROWS = 80
NEEDS_JAGGED_NESTED = pytest.mark.skipif(not JAGGED_NESTED, reason='this torch has no jagged nested tensors')
#: Fields every loader makes tensors of (no text inside).
NUMERIC = ['id', 'nint', 'nfloat', 'nbool', 'ids', 'weights', 'nested', 'boxes', 'holes', 'point.x', 'point.y',
           'point.inner.z', 'objects', 'fixed', 'when', 'day', 'clock', 'wait', 'half']


@pytest.fixture(scope='module')
def table():
    return every_type_table(ROWS, seed=11)


@pytest.fixture(scope='module')
def url(table, tmp_path_factory):
    path = tmp_path_factory.mktemp('torch_nested')
    pq.write_table(table, path / 'data.parquet', row_group_size=16)
    return 'file://' + str(path)


def _expected(table, fields):
    rows = expected_rows(table)
    out = []
    for row in rows:
        kept = {}
        for name in fields:
            top, _, leaf = name.partition('.')
            if not leaf:
                kept[top] = row[top]
                continue
            value = row[top]
            kept.setdefault(top, None if value is None else {})
            if value is not None:
                _put(kept[top], leaf.split('.'), value)
        out.append(kept)
    return out


def _put(target, path, value):
    head = path[0]
    if len(path) == 1:
        target[head] = value[head]
    else:
        target.setdefault(head, None if value[head] is None else {})
        if value[head] is not None:
            _put(target[head], path[1:], value[head])


def _struct_nulls_at_leaves(rows):
    """A struct whose row is null arrives as a dict of masked leaves: make such rows None again."""
    for row in rows:
        point = row.get('point')
        if isinstance(point, dict) and point.get('x') is None and point.get('inner', {}).get('z') is None:
            row['point'] = None
    return rows


@pytest.mark.parametrize('pool', ['thread', 'process'])
def test_batched_loader_gives_jagged_tensors_of_pyarrows_rows(url, table, pool):
    reader = make_batch_reader(url, schema_fields=NUMERIC, reader_pool_type=pool, workers_count=2,
                               shuffle_row_groups=True, seed=3)
    with BatchedDataLoader(reader, batch_size=7, shuffling_queue_capacity=40, variable_length='jagged',
                           nulls={'nint': 'mask', 'nfloat': 'mask', 'nbool': 'mask', 'ids': 'mask',
                                  'nested': 'mask', 'holes[]': 'mask', 'point': 'mask', 'fixed': 'mask',
                                  'when': 'mask', 'day': 'mask', 'clock': 'mask', 'wait': 'mask'}) as loader:
        batches = list(loader)
    first = batches[0]
    assert isinstance(first['ids'], JaggedTensor)
    assert first['ids'].offsets.dtype == torch.int64
    assert first['ids'].offsets[0] == 0
    assert first['boxes'].values.shape[1:] == (4,)
    assert isinstance(first['nested'].values, JaggedTensor)
    assert first['when'].dtype == torch.int64
    assert first['nint_valid'].dtype == torch.bool
    assert first['holes'].values_valid is not None
    rows = _struct_nulls_at_leaves([row for batch in batches for row in torch_batch_rows(batch)])
    assert_rows_equal(rows, _expected(table, NUMERIC))


def test_row_loader_collates_every_type_with_masks(url, table):
    reader = make_reader(url, reader_pool_type='dummy', shuffle_rows=True, seed=2)
    with DataLoader(reader, batch_size=9, shuffling_queue_capacity=20, nulls={'*': 'mask', 'holes[]': -7}) as loader:
        batches = list(loader)
    assert isinstance(batches[0]['text'], list)
    assert isinstance(batches[0]['ids'], list)
    assert all(name + '_valid' in batches[0] for name in ('nint', 'ids', 'point', 'attrs'))
    rows = _struct_nulls_at_leaves([row for batch in batches for row in torch_batch_rows(batch)])
    expected = expected_rows(table)
    for row in expected:
        row['holes'] = [-7 if v is None else v for v in row['holes']]
    assert_rows_equal(rows, expected)


@pytest.mark.parametrize('variable_length', ['jagged', pytest.param('nested', marks=NEEDS_JAGGED_NESTED), 'pad'])
def test_the_forms_of_ragged_columns(url, table, variable_length):
    fields = ['id', 'ids', 'weights', 'boxes']
    reader = make_batch_reader(url, schema_fields=fields, reader_pool_type='dummy')
    with BatchedDataLoader(reader, batch_size=10, variable_length=variable_length, nulls={'ids': 0}) as loader:
        batches = list(loader)
    expected = {row['id']: row for row in expected_rows(table.select(fields))}
    for batch in batches:
        for name in ('ids', 'weights', 'boxes'):
            value = batch[name]
            if variable_length == 'pad':
                rows = [[v for v, m in zip(r, k, strict=True) if (m if isinstance(m, bool) else all(m))]
                        for r, k in zip(value.tolist(), batch[name + '_mask'].tolist(), strict=True)]
            else:
                if variable_length == 'nested':
                    assert value.is_nested
                    assert value.layout == torch.jagged
                rows = tensor_rows(value)
            for key, row in zip(batch['id'].tolist(), rows, strict=True):
                assert row == (expected[key][name] or []), (name, key)


def test_in_memory_loader_serves_shuffled_epochs_of_jagged_rows(url, table):
    fields = ['id', 'ids', 'nested', 'objects']
    reader = make_batch_reader(url, schema_fields=fields, reader_pool_type='dummy', num_epochs=1)
    with InMemBatchedDataLoader(reader, batch_size=11, num_epochs=2, shuffle=True, rows_capacity=ROWS,
                                nulls='mask', variable_length='jagged') as loader:
        batches = list(loader)
    rows = [row for batch in batches for row in torch_batch_rows(batch)]
    assert_rows_equal(rows[:ROWS], _expected(table, fields))
    assert_rows_equal(rows[ROWS:], _expected(table, fields))
    assert [r['id'] for r in rows[:ROWS]] != [r['id'] for r in rows[ROWS:]]


def test_nulls_are_refused_by_default_naming_the_field_and_the_option(url):
    with BatchedDataLoader(make_batch_reader(url, schema_fields=['id', 'nint']), batch_size=5) as loader, \
            pytest.raises(TorchTypeError, match="Pytorch does not support nullable fields. Found None in nint; "
                                                "pass nulls='mask'"):
        list(loader)  # the first batch with a null raises
    with DataLoader(make_batch_reader(url, schema_fields=['id', 'holes']), batch_size=5) as loader, \
            pytest.raises(TorchTypeError, match=r"Found None in holes\[\] \(an element of a list\); pass "
                                                r"nulls=\{'holes\[\]': 'mask'\}"):
        list(loader)


def test_a_fill_value_stands_in_for_nulls(url, table):
    with BatchedDataLoader(make_batch_reader(url, schema_fields=['id', 'nint', 'nfloat'], reader_pool_type='dummy'),
                           batch_size=ROWS, nulls=-1) as loader:
        batch = next(iter(loader))
    assert 'nint_valid' not in batch
    expected = {row['id']: row for row in expected_rows(table)}
    for key, nint, nfloat in zip(batch['id'].tolist(), batch['nint'].tolist(), batch['nfloat'].tolist(),
                                 strict=True):
        assert nint == (-1 if expected[key]['nint'] is None else expected[key]['nint'])
        assert nfloat == (-1 if expected[key]['nfloat'] is None else expected[key]['nfloat'])


def test_bad_choices_are_refused_before_reading(url):
    with pytest.raises(ValueError, match="field 'nested' holds lists of lists or structs .* too deep for "
                                         "variable_length='nested'"):
        BatchedDataLoader(make_batch_reader(url, schema_fields=['nested']), variable_length='nested')
    with pytest.raises(TorchTypeError, match="'point.tags\\[\\]' holds string values"):
        BatchedDataLoader(make_batch_reader(url, schema_fields=['point']))
    with pytest.raises(ValueError, match="nulls names \\['nope'\\]"):
        BatchedDataLoader(make_batch_reader(url, schema_fields=['id']), nulls={'nope': 0})
    with pytest.raises(ValueError, match="variable_length must be 'auto', 'jagged', 'nested' or 'pad'"):
        BatchedDataLoader(make_batch_reader(url, schema_fields=['id']), variable_length='list')


@NEEDS_JAGGED_NESTED
def test_jagged_tensors_wrap_as_torch_nested_and_move(url):
    with BatchedDataLoader(make_batch_reader(url, schema_fields=['weights']), batch_size=6,
                           variable_length='jagged') as loader:
        jagged = next(iter(loader))['weights']
    nested = torch.nested.nested_tensor_from_jagged(jagged.values, jagged.offsets)
    assert nested.size(0) == 6
    assert jagged.lengths.tolist() == [len(row) for row in nested.unbind()]
    assert jagged.to('cpu').offsets.device.type == 'cpu'


@pytest.mark.skipif(JAGGED_NESTED, reason='this torch makes jagged nested tensors')
def test_nested_tensors_are_refused_by_a_torch_without_them(url):
    reader = make_batch_reader(url, schema_fields=['weights'])
    with pytest.raises(MissingDependencyError, match=r"'nested' .* torch 2.4 and later.* variable_length='jagged'"):
        BatchedDataLoader(reader, variable_length='nested')
    assert reader.stopped


def test_one_level_lists_are_dense_by_default_as_in_petastorm(url, tmp_path):
    import pyarrow as pa

    pq.write_table(pa.table({'pair': pa.array([[i, i + 1] for i in range(6)], pa.list_(pa.int64()))}),
                   tmp_path / 'a.parquet')
    with BatchedDataLoader(make_batch_reader('file://' + str(tmp_path)), batch_size=6) as loader:
        pair = next(iter(loader))['pair']
    assert pair.shape == (6, 2)
    with BatchedDataLoader(make_batch_reader(url, schema_fields=['weights']), batch_size=6) as loader, \
            pytest.raises(TorchTypeError, match="field 'weights' holds lists of different lengths .* Pass "
                                                "variable_length='jagged'"):
        next(iter(loader))


def test_ragged_ndarray_columns_are_jagged_in_the_batched_loader(tmp_path):
    from petastorm import write_dataset
    from petastorm.codecs import NdarrayCodec
    from petastorm.unischema import Unischema, UnischemaField

    schema = Unischema('S', [UnischemaField('id', np.int64, (), None, False),
                             UnischemaField('points', np.float32, (None, 2), NdarrayCodec(), False)])
    rows = [{'id': i, 'points': np.full((i % 4, 2), i, np.float32)} for i in range(12)]
    write_dataset('file://' + str(tmp_path), schema, rows)
    with BatchedDataLoader(make_batch_reader('file://' + str(tmp_path)), batch_size=12) as loader:
        batch = next(iter(loader))  # shape (None, 2): not a one-level list, so jagged under 'auto'
    points = batch['points']
    assert isinstance(points, JaggedTensor)
    assert points.values.shape[1:] == (2,)
    for key, row in zip(batch['id'].tolist(), tensor_rows(points), strict=True):
        assert row == np.full((key % 4, 2), key, np.float32).tolist()
