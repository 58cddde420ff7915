"""Row-group indexes (built without Spark and read from Petastorm 0.13.1 datasets) and selectors in the reader."""

import json
import pathlib

import numpy as np
import pyarrow as pa
import pytest

import petastorm.reading.worker
from petastorm import make_reader, write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.etl import RowGroupIndexerBase
from petastorm.etl.dataset_metadata import open_dataset
from petastorm.etl.rowgroup_indexers import FieldNotNullIndexer, SingleFieldIndexer
from petastorm.etl.rowgroup_indexing import INDEXES_JSON_KEY, build_rowgroup_index, get_row_group_indexes
from petastorm.selectors import IntersectIndexSelector, SingleIndexSelector, UnionIndexSelector
from petastorm.unischema import Unischema, UnischemaField

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / 'data' / 'legacy_0_13_1'
Schema = Unischema('Indexed', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('color', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('tags', np.int32, (None,), NdarrayCodec(), False),
    UnischemaField('maybe', np.float64, (), ScalarCodec(pa.float64()), True),
])
COLORS = ['red', 'green', 'blue']


def _row(i):
    return {'id': i, 'color': COLORS[i // 10 % 3], 'tags': np.array([i % 4, 100 + i // 10], np.int32),
            'maybe': float(i) if i >= 40 else None}


@pytest.fixture
def url(tmp_path):
    target = 'file://' + str(tmp_path / 'indexed')
    # Tiny row groups (one row each), so selections are exact.
    result = write_dataset(target, Schema, (_row(i) for i in range(60)), row_group_size_mb=0.0001)
    assert sum(len(v) for v in result.row_groups.values()) > 3
    return target


def test_build_index_without_spark_and_select(url):
    built = build_rowgroup_index(url, None, [SingleFieldIndexer('by_color', 'color'),
                                             SingleFieldIndexer('by_tag', 'tags'),
                                             FieldNotNullIndexer('has_maybe', 'maybe')])
    assert set(built) == {'by_color', 'by_tag', 'has_maybe'}
    stored = get_row_group_indexes(url)
    assert set(stored['by_color'].indexed_values) == set(COLORS)
    assert stored['by_tag'].get_row_group_indexes(103) == built['by_tag'].get_row_group_indexes(103)
    with make_reader(url, reader_pool_type='dummy', rowgroup_selector=SingleIndexSelector('by_color', ['green'])) \
            as reader:
        greens = {int(r.id) for r in reader}
    assert greens == {i for i in range(60) if _row(i)['color'] == 'green'}
    with make_reader(url, reader_pool_type='dummy', rowgroup_selector=SingleIndexSelector('has_maybe', [None])) \
            as reader:
        assert {int(r.id) for r in reader} == set(range(40, 60))


def test_selector_reads_only_selected_row_groups(url, monkeypatch):
    build_rowgroup_index(url, None, [SingleFieldIndexer('by_id', 'id')])
    read_groups = []
    original = petastorm.reading.worker._read_columns

    def spy(ctx, piece, names, start, stop, *more):
        read_groups.append((piece.path, piece.row_group))
        return original(ctx, piece, names, start, stop, *more)

    monkeypatch.setattr(petastorm.reading.worker, '_read_columns', spy)
    with make_reader(url, reader_pool_type='dummy', rowgroup_selector=SingleIndexSelector('by_id', [5, 42])) as reader:
        ids = sorted(int(r.id) for r in reader)
    assert 5 in ids
    assert 42 in ids
    assert len(set(read_groups)) == 2


def test_intersect_and_union_selectors(url):
    indexes = build_rowgroup_index(url, None, [SingleFieldIndexer('by_color', 'color'),
                                               SingleFieldIndexer('by_tag', 'tags')])
    red = SingleIndexSelector('by_color', ['red'])
    tag_101 = SingleIndexSelector('by_tag', [101])
    assert IntersectIndexSelector([red, tag_101]).select_row_groups(indexes) == \
        red.select_row_groups(indexes) & tag_101.select_row_groups(indexes)
    assert UnionIndexSelector([red, tag_101]).select_row_groups(indexes) == \
        red.select_row_groups(indexes) | tag_101.select_row_groups(indexes)
    assert IntersectIndexSelector([red, tag_101]).get_index_names() == ['by_color', 'by_tag']


def test_index_is_json_in_common_metadata(url):
    build_rowgroup_index(url, None, [SingleFieldIndexer('by_color', 'color')])
    document = json.loads(open_dataset(url).metadata_kv[INDEXES_JSON_KEY])
    assert document['format_version'] == 1
    assert document['indexes']['by_color']['kind'] == 'single_field'


def test_indexer_merge_rules():
    a = SingleFieldIndexer('i', 'x').build_index({'x': np.array([1, 2])}, 0)
    b = SingleFieldIndexer('i', 'x').build_index([{'x': 2}, {'x': None}], 1)
    merged = a + b
    assert merged.get_row_group_indexes(2) == {0, 1}
    assert merged.get_row_group_indexes(7) == set()
    with pytest.raises(TypeError):
        a + FieldNotNullIndexer('i', 'x')
    with pytest.raises(ValueError, match='different columns'):
        a + SingleFieldIndexer('i', 'y')
    with pytest.raises(ValueError, match='empty decoded_rows'):
        SingleFieldIndexer('i', 'x').build_index({'x': np.array([])}, 0)


class _BucketIndexer(SingleFieldIndexer):
    """A user's indexer with its own constructor: it indexes values rounded down to a multiple of ``bucket``."""

    def __init__(self, bucket, index_field):
        super().__init__(f'{index_field}_by_{bucket}', index_field)
        self.bucket = bucket

    def build_index(self, decoded_rows, piece_index):
        values = np.asarray(decoded_rows[self._column_name])
        return super().build_index({self._column_name: values // self.bucket * self.bucket}, piece_index)


def test_an_indexer_with_its_own_constructor_is_built_without_spark(url):
    # Every row group used to be indexed by type(indexer)(index_name, column), which fails (or silently drops
    # settings) for an indexer whose constructor takes other arguments; Spark tasks index copies instead.
    built = build_rowgroup_index(url, None, [_BucketIndexer(20, 'id')])
    assert set(built['id_by_20'].indexed_values) == {0, 20, 40}
    stored = get_row_group_indexes(url)['id_by_20']
    with make_reader(url, reader_pool_type='dummy', rowgroup_selector=SingleIndexSelector('id_by_20', [20])) \
            as reader:
        assert sorted(int(r.id) for r in reader) == list(range(20, 40))
    assert stored.get_row_group_indexes(40) == built['id_by_20'].get_row_group_indexes(40)


class _NotStorableIndexer(RowGroupIndexerBase):
    index_name = 'custom'
    column_names = ['id']
    indexed_values: list = []

    def __add__(self, other):
        return self

    def get_row_group_indexes(self, value_key=None):
        return set()

    def build_index(self, decoded_rows, piece_index):
        return self


def test_an_indexer_that_cannot_be_stored_is_refused_before_any_work(url, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError('no row group should be read')

    monkeypatch.setattr(petastorm.reading.worker, 'decode_columns', never)
    with pytest.raises(ValueError, match=r"indexers \['_NotStorableIndexer'\] cannot be stored"):
        build_rowgroup_index(url, None, [_NotStorableIndexer()])


def test_indexer_classes_keep_their_public_paths_and_the_storage_layer_loads_them(url):
    import pickle

    import petastorm.etl
    import petastorm.etl.rowgroup_indexers as public
    from petastorm.metadata import row_group_indexes

    assert petastorm.etl.RowGroupIndexerBase is row_group_indexes.RowGroupIndexerBase
    assert public.SingleFieldIndexer is row_group_indexes.SingleFieldIndexer
    assert public.FieldNotNullIndexer is row_group_indexes.FieldNotNullIndexer
    assert public.INDEXERS_BY_KIND is row_group_indexes.INDEXERS_BY_KIND
    assert SingleFieldIndexer.__module__ == 'petastorm.etl.rowgroup_indexers'
    assert b'petastorm.etl.rowgroup_indexers' in pickle.dumps(SingleFieldIndexer('i', 'x'))
    build_rowgroup_index(url, None, [SingleFieldIndexer('by_color', 'color')])
    loaded = row_group_indexes.load_row_group_indexes(open_dataset(url))
    assert loaded['by_color'].get_row_group_indexes('red') == get_row_group_indexes(url)['by_color'] \
        .get_row_group_indexes('red')


def test_errors_name_the_problem(url):
    with pytest.raises(ValueError, match='Could not find row group indexes'):
        get_row_group_indexes(url)
    with pytest.raises(ValueError, match='Could not find row group indexes'):
        make_reader(url, rowgroup_selector=SingleIndexSelector('nope', [1]))
    build_rowgroup_index(url, None, [SingleFieldIndexer('by_id', 'id')])
    with pytest.raises(ValueError, match=r"required indexes \['nope'\] are not available"):
        make_reader(url, rowgroup_selector=SingleIndexSelector('nope', [1]))
    with pytest.raises(ValueError, match='not fields of the dataset'):
        build_rowgroup_index(url, None, [SingleFieldIndexer('x', 'not_a_field')])
    with pytest.raises(ValueError, match='RowGroupSelectorBase'):
        make_reader(url, rowgroup_selector='by_id')


def test_legacy_petastorm_indexes_select_the_same_rows():
    manifest = json.loads((GOLDEN / 'manifest.json').read_text())['datasets']['with_index']
    target = 'file://' + str(GOLDEN / 'with_index')
    indexes = get_row_group_indexes(target)
    for name, description in manifest['row_group_indexes'].items():
        if isinstance(indexes[name], SingleFieldIndexer):
            for value, pieces in description['values'].items():
                key = int(value) if value.lstrip('-').isdigit() else value
                assert indexes[name].get_row_group_indexes(key) == set(pieces), (name, value)
    for example in manifest['selector_examples']:
        selector = SingleIndexSelector(example['index_name'], example['values'])
        with make_reader(target, reader_pool_type='dummy', rowgroup_selector=selector) as reader:
            assert sorted(int(r.id) for r in reader) == example['ids'], example


@pytest.fixture
def partitioned_copy(tmp_path):
    """A private copy of the Petastorm-written store partitioned by ``partition_key`` (indexing rewrites metadata)."""
    import shutil

    target = tmp_path / 'partitioned'
    shutil.copytree(GOLDEN / 'partitioned', target)
    return 'file://' + str(target)


@pytest.mark.parametrize('distributed', [False, True], ids=['threads', 'spark'])
def test_index_on_a_hive_partition_column(partitioned_copy, distributed, request):
    # The partition value lives only in the directory names; indexing reads it from there, as reading does.
    spark_context = request.getfixturevalue('spark').sparkContext if distributed else None
    built = build_rowgroup_index(partitioned_copy, spark_context, [SingleFieldIndexer('by_key', 'partition_key'),
                                                                   SingleFieldIndexer('by_id', 'id')])
    assert set(built['by_key'].indexed_values) == {'p_0', 'p_1', 'p_2', 'p_3'}
    with make_reader(partitioned_copy, reader_pool_type='dummy') as reader:
        expected = {int(r.id) for r in reader if r.partition_key in ('p_1', 'p_3')}
    assert expected
    selector = SingleIndexSelector('by_key', ['p_1', 'p_3'])
    with make_reader(partitioned_copy, reader_pool_type='dummy', rowgroup_selector=selector) as reader:
        rows = list(reader)
    assert {int(r.id) for r in rows} == expected
    assert {r.partition_key for r in rows} == {'p_1', 'p_3'}
    # Selector and partition predicate together on the same column agree with each other.
    from petastorm.predicates import in_set
    with make_reader(partitioned_copy, reader_pool_type='dummy', rowgroup_selector=selector,
                     predicate=in_set({'p_3'}, 'partition_key')) as reader:
        assert {int(r.id) for r in reader} == {i for i in expected if i in _ids_in_partition(partitioned_copy, 'p_3')}


def _ids_in_partition(url, key):
    with make_reader(url, reader_pool_type='dummy', schema_fields=['id', 'partition_key']) as reader:
        return {int(r.id) for r in reader if r.partition_key == key}
