"""Ragged, nested, struct and map fields through ``make_petastorm_dataset``: tf.RaggedTensor s and dicts.

Files are written by pyarrow; every element, turned back into rows, equals pyarrow's ``to_pylist()`` rows.
"""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from support.nested_tables import assert_rows_equal, every_type_table, expected_rows

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
tf = pytest.importorskip('tensorflow')

from petastorm import make_batch_reader, make_reader  # noqa: E402
from petastorm.tf_utils import make_petastorm_dataset, tf_tensors  # noqa: E402

pytestmark = [pytest.mark.tf,
              pytest.mark.filterwarnings('ignore:Tensorflow will convert all unicode strings:UnicodeWarning')]

ROWS = 30
FIELDS = ['id', 'weights', 'nested', 'boxes', 'point', 'objects', 'attrs', 'fixed', 'when', 'day', 'clock', 'wait',
          'words', 'half']
#: Without the one-level lists of varying length, which are dense tensors unless ragged=True.
DENSE_DEFAULT = [name for name in FIELDS if name not in ('weights', 'words')]


@pytest.fixture(scope='module')
def table():
    return every_type_table(ROWS, seed=4, nulls=False)


@pytest.fixture(scope='module')
def url(table, tmp_path_factory):
    path = tmp_path_factory.mktemp('tf_nested')
    pq.write_table(table, path / 'data.parquet', row_group_size=8)
    return 'file://' + str(path)


def _rows(value):
    """The rows of one element's value: ragged tensors, dense tensors, dicts of them."""
    if isinstance(value, dict):
        fields = {name: _rows(child) for name, child in value.items()}
        count = len(next(iter(fields.values())))
        rows = [{name: column[i] for name, column in fields.items()} for i in range(count)]
        if set(value) == {'key', 'value'}:  # a map: the pairs of each row
            return [list(zip(row['key'], row['value'], strict=True)) for row in rows]
        return rows
    if isinstance(value, tf.RaggedTensor):
        return _decoded(value.to_list())
    return _decoded(value.numpy().tolist())


def _decoded(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


def _element_rows(element):
    columns = {name: _rows(value) for name, value in element._asdict().items()}
    count = len(columns['id'])
    return [{name: column[i] for name, column in columns.items()} for i in range(count)]


def _expected(table, fields=FIELDS):
    rows = expected_rows(table.select(fields))
    for row in rows:
        # TensorFlow gets times as int64 nanoseconds since the epoch (days and timestamps alike).
        row['day'] = row['day'] * 86_400_000_000_000
        # A list of structs is a dict of ragged fields: each row, a dict of the elements' fields.
        row['objects'] = {name: [element[name] for element in row['objects']] for name in ('cls', 'score')}
    return rows


def test_batches_hold_ragged_tensors_and_dicts(url, table):
    with make_batch_reader(url, schema_fields=DENSE_DEFAULT + ['fixed'], shuffle_row_groups=True, seed=1) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        rows = [row for element in dataset for row in _element_rows(element)]
    assert spec.fixed == tf.TensorSpec((None, 3), tf.int32)
    assert spec.nested.ragged_rank == 2
    assert spec.boxes.shape.as_list() == [None, None, 4]
    assert spec.boxes.ragged_rank == 1
    assert set(spec.point) == {'x', 'y', 'tags', 'inner'}
    assert set(spec.attrs) == {'key', 'value'}
    assert_rows_equal(rows, _expected(table, DENSE_DEFAULT))


def test_rows_of_a_row_reader(url, table):
    with make_reader(url, schema_fields=FIELDS, reader_pool_type='dummy', shuffle_rows=True, seed=2) as reader:
        dataset = make_petastorm_dataset(reader, ragged=True)
        rows = [row for element in dataset.batch(5) for row in _element_rows(element)]
    assert_rows_equal(rows, _expected(table))


def test_one_level_lists_of_one_length_are_dense_as_in_petastorm(tmp_path):
    import pyarrow as pa

    pq.write_table(pa.table({'v': pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32()))}), tmp_path / 'a.parquet')
    with make_batch_reader('file://' + str(tmp_path)) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec.v == tf.TensorSpec((None, None), tf.float32)
        assert next(iter(dataset)).v.numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_ragged_true_makes_one_level_lists_ragged(url, table):
    with make_batch_reader(url, schema_fields=['id', 'words', 'weights'], reader_pool_type='dummy') as reader:
        dataset = make_petastorm_dataset(reader, ragged=True)
        assert isinstance(dataset.element_spec.weights, tf.RaggedTensorSpec)
        rows = [row for element in dataset for row in _element_rows(element)]
    assert_rows_equal(rows, expected_rows(table.select(['id', 'words', 'weights'])))


def test_errors_name_the_field_and_the_way_out(tmp_path):
    pq.write_table(every_type_table(10, seed=1), tmp_path / 'data.parquet')
    url = 'file://' + str(tmp_path)
    with make_batch_reader(url, schema_fields=['id', 'weights'], reader_pool_type='dummy') as reader, \
            pytest.raises(Exception, match="field 'weights' holds lists of different lengths .* Pass ragged=True"):
        list(make_petastorm_dataset(reader))
    with make_batch_reader(url, schema_fields=['id', 'point'], reader_pool_type='dummy') as reader, \
            pytest.raises(Exception, match='Encountered "point"=None'):
        list(make_petastorm_dataset(reader))
    with make_batch_reader(url, schema_fields=['id', 'nested'], reader_pool_type='dummy') as reader, \
            tf.Graph().as_default(), pytest.warns(UserWarning, match=r"tf_tensors leaves out the list, map and struct "
                                                                   r"fields \['nested'\]"):
        tensors = tf_tensors(reader)
    assert tensors._fields == ('id',)
