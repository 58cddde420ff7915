"""Writing nested, ragged and nullable fields with write_dataset: the schema says how, a round trip loses nothing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm._compat import PYARROW_READS_NULL_FIXED_SIZE_LISTS
from petastorm.codecs import ScalarCodec
from petastorm.errors import SchemaError
from petastorm.metadata.schema_json import unischema_from_json, unischema_to_json
from petastorm.unischema import Unischema, UnischemaField
from support.nested_tables import assert_rows_equal

Nested = Unischema('Nested', [
    UnischemaField('id', np.int64, (), None, False),
    UnischemaField('ids', np.int64, (None,), None, True),
    UnischemaField('nested', np.float32, (None, None), None, True),
    UnischemaField('boxes', np.float32, (None, 4), None, False),
    UnischemaField('n', np.int32, (), None, True),
    UnischemaField('st', dict, (), ScalarCodec(pa.struct([('a', pa.int32()), ('b', pa.list_(pa.string()))])), True),
    UnischemaField('m', dict, (), ScalarCodec(pa.map_(pa.string(), pa.float64())), True),
])


def _row(i):
    return {'id': i, 'ids': None if i % 3 == 0 else list(range(i)),
            'nested': [[float(k)] * k for k in range(i % 3)], 'boxes': np.full((i % 4, 4), i, np.float32),
            'n': None if i % 2 else i, 'st': None if i == 1 else {'a': i, 'b': ['x'] * (i % 3)},
            'm': {'k': float(i), 'j': -1.0}}


def _plain(row):
    return {**row, 'boxes': row['boxes'].tolist(), 'm': list(row['m'].items())}


def test_a_round_trip_loses_nothing(tmp_path):
    url = 'file://' + str(tmp_path / 'nested')
    rows = [_row(i) for i in range(20)]
    write_dataset(url, Nested, rows, row_group_size_mb=0.001)
    stored = pq.read_table(str(tmp_path / 'nested'))
    assert stored.schema.field('nested').type == pa.list_(pa.list_(pa.float32()))
    assert stored.schema.field('boxes').type == pa.list_(pa.list_(pa.float32(), 4))
    assert not stored.schema.field('boxes').nullable
    with make_reader(url, reader_pool_type='process', workers_count=2, shuffle_rows=True, seed=1) as reader:
        assert reader.schema == Nested
        assert reader.schema.fields['st'].codec == Nested.fields['st'].codec
        got = [row._asdict() for row in reader]
    assert_rows_equal(got, [_plain(row) for row in rows])
    with make_batch_reader(url, reader_pool_type='dummy') as reader:
        total = sum(len(batch.id) for batch in reader)
    assert total == 20


def test_the_schema_json_keeps_nested_types_and_dict_fields():
    assert unischema_from_json(unischema_to_json(Nested)) == Nested
    restored = unischema_from_json(unischema_to_json(Nested))
    assert restored.fields['m'].codec.arrow_type() == pa.map_(pa.string(), pa.float64())
    assert restored.fields['st'].numpy_dtype is dict


@pytest.mark.parametrize(('field', 'value', 'message'), [
    ('boxes', np.zeros((2, 3), np.float32), r"field 'boxes\[\]': expected 4 elements, got 3"),
    ('st', {'a': 1, 'zz': 2}, r"field 'st': \['zz'\] are not fields of the struct \(its fields: a, b\)"),
    ('st', {'a': 'x'}, r"field 'st.a': value 'x' does not fit the column type int32"),
    ('boxes', None, r"Field 'boxes' is not nullable, but got None"),
    ('nested', 'abc', r"field 'nested': a list takes a sequence or an array, got str"),
])
def test_values_that_do_not_fit_are_refused_naming_the_element(tmp_path, field, value, message):
    row = {**_row(2), field: value}
    with pytest.raises(SchemaError, match=message):
        write_dataset('file://' + str(tmp_path / 'bad'), Nested, [row])
    assert not (tmp_path / 'bad' / '_common_metadata').exists()


@pytest.mark.parametrize(('field', 'value', 'refused'), [
    (UnischemaField('v', np.int32, (2,), ScalarCodec(pa.list_(pa.int32(), 2)), True), np.array([1, 2], np.int32), True),
    (UnischemaField('v', dict, (), ScalarCodec(pa.struct([('xy', pa.list_(pa.int32(), 2))])), True), {'xy': [1, 2]},
     True),
    (UnischemaField('v', np.int32, (None, 2), None, True), np.array([[1, 2]], np.int32), False),  # a null list
], ids=['fixed-size list', 'struct of one', 'list of them'])
def test_null_rows_over_fixed_size_lists_are_written_where_pyarrow_reads_them_back(tmp_path, field, value, refused):
    schema = Unischema('Fixed', [UnischemaField('id', np.int64, (), None, False), field])
    url = 'file://' + str(tmp_path / 'fixed')
    rows = [{'id': 0, 'v': value}, {'id': 1, 'v': None}]
    if refused and not PYARROW_READS_NULL_FIXED_SIZE_LISTS:
        with pytest.raises(SchemaError, match=r"rows 0..1: column 'v' holds null rows .* pyarrow 26 and later can"):
            write_dataset(url, schema, rows)
        return
    write_dataset(url, schema, rows)
    with make_reader(url, shuffle_row_groups=False) as reader:
        got = sorted((row._asdict() for row in reader), key=lambda row: row['id'])
    assert got[1]['v'] is None
    assert_rows_equal([got[0]], [{'id': 0, 'v': value.tolist() if isinstance(value, np.ndarray) else value}])
