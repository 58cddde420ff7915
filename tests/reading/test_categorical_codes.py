"""``categorical_codes``: pandas and Polars categoricals and Arrow dictionaries delivered as int64 codes."""

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import TransformSpec, make_batch_reader, make_reader
from petastorm.codecs import CategoryCodec, ClassLabelCodec, codec_from_json
from petastorm.errors import CodecError, DecodeFieldError
from petastorm.predicates import in_set
from petastorm.unischema import UnischemaField


def _read_all(url, **kwargs):
    """Every row's columns, sorted by ``id``, and the reader's schema."""
    with make_batch_reader(url, reader_pool_type='dummy', **kwargs) as reader:
        batches = list(reader)
        schema = reader.schema
    columns = {name: np.concatenate([np.ma.filled(getattr(b, name), -1) if np.ma.isMaskedArray(getattr(b, name))
                                     else getattr(b, name) for b in batches]) for name in schema.fields}
    order = np.argsort(columns['id'])
    return {name: values[order] for name, values in columns.items()}, schema


@pytest.fixture(scope='module')
def pandas_store(tmp_path_factory):
    """Two pandas files whose categoricals have different categories (an unused one among them)."""
    root = tmp_path_factory.mktemp('pandas')
    pd.DataFrame({'id': range(4), 'color': pd.Categorical(['red', 'green', 'red', 'blue'],
                                                          categories=['red', 'green', 'blue', 'unused'])}
                 ).to_parquet(root / 'a.parquet')
    pd.DataFrame({'id': range(4, 7), 'color': pd.Categorical(['yellow', 'red', 'yellow'])}).to_parquet(
        root / 'b.parquet')
    return root.as_uri()


def test_default_still_delivers_the_values(pandas_store):
    columns, schema = _read_all(pandas_store)
    assert schema.fields['color'].numpy_dtype is np.str_
    assert columns['color'].tolist() == ['red', 'green', 'red', 'blue', 'yellow', 'red', 'yellow']


def test_pandas_categoricals_of_files_that_differ_share_one_list(pandas_store):
    columns, schema = _read_all(pandas_store, categorical_codes=True)
    field = schema.fields['color']
    assert field.numpy_dtype is np.int64
    assert isinstance(field.codec, CategoryCodec)
    categories = field.codec.categories
    assert categories == ['blue', 'green', 'red', 'unused', 'yellow']  # the dictionaries differ: sorted
    assert columns['color'].dtype == np.int64
    assert [categories[c] for c in columns['color']] == ['red', 'green', 'red', 'blue', 'yellow', 'red', 'yellow']
    assert field.codec.int2str(2) == 'red'
    assert field.codec.str2int('yellow') == 4
    assert schema.fields['id'].codec is None  # not categorical: untouched


def test_one_pandas_categorical_keeps_pandas_codes(tmp_path):
    frame = pd.DataFrame({'id': range(5), 'size': pd.Categorical(['m', 's', 'l', 'm', 's'],
                                                                 categories=['s', 'm', 'l', 'xl'], ordered=True)})
    frame.to_parquet(tmp_path / 'a.parquet', row_group_size=2)
    columns, schema = _read_all(tmp_path.as_uri(), categorical_codes=['size'])
    assert schema.fields['size'].codec.categories == ['s', 'm', 'l', 'xl']  # pandas' order, the unused one kept
    assert columns['size'].tolist() == frame['size'].cat.codes.tolist()


def test_polars_enum_and_categorical(tmp_path):
    pl = pytest.importorskip('polars')
    levels = pl.Enum(['low', 'mid', 'high'])
    pl.DataFrame({'id': [0, 1, 2], 'level': pl.Series(['high', 'low', 'high'], dtype=levels),
                  'tag': pl.Series(['x', 'y', 'x'], dtype=pl.Categorical)}).write_parquet(tmp_path / 'a.parquet')
    pl.DataFrame({'id': [3, 4], 'level': pl.Series(['mid', 'mid'], dtype=levels),
                  'tag': pl.Series(['w', 'x'], dtype=pl.Categorical)}).write_parquet(tmp_path / 'b.parquet')
    columns, schema = _read_all(tmp_path.as_uri(), categorical_codes=True)
    assert schema.fields['level'].codec.categories == ['low', 'mid', 'high']  # the Enum's own order and codes
    assert columns['level'].tolist() == pl.read_parquet(tmp_path)['level'].to_physical().to_list()
    tags = schema.fields['tag'].codec.categories
    assert tags == ['w', 'x', 'y']
    assert [tags[c] for c in columns['tag']] == ['x', 'y', 'x', 'w', 'x']


def test_arrow_dictionaries_that_differ_between_row_groups(tmp_path):
    path = tmp_path / 'd.parquet'
    first = pa.table({'id': [0, 1, 2], 'kind': pa.array(['b', 'a', None]).dictionary_encode()})
    second = pa.table({'id': [3, 4], 'kind': pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()),
                                                                             pa.array(['c', 'b']))})
    with pq.ParquetWriter(path, first.schema) as writer:
        writer.write_table(first)
        writer.write_table(second)
    assert pq.ParquetFile(path).num_row_groups == 2
    for pool in ('dummy', 'process'):
        with make_batch_reader(tmp_path.as_uri(), categorical_codes=True, reader_pool_type=pool, workers_count=2,
                               shuffle_row_groups=False) as reader:
            kinds = [b.kind for b in reader]
            categories = reader.schema.fields['kind'].codec.categories
        assert categories == ['a', 'b', 'c']
        assert np.ma.getmaskarray(kinds[0]).tolist() == [False, False, True]  # a null stays a null
        assert [categories[c] for c in np.ma.compressed(np.ma.concatenate(kinds))] == ['b', 'a', 'c', 'b']


def test_categories_given_fix_the_codes_and_refuse_other_values(pandas_store):
    given = ['yellow', 'red', 'green', 'blue']
    columns, schema = _read_all(pandas_store, categorical_codes={'color': given})
    assert schema.fields['color'].codec.categories == given
    assert [given[c] for c in columns['color']] == ['red', 'green', 'red', 'blue', 'yellow', 'red', 'yellow']
    with pytest.raises(DecodeFieldError, match=r"field color: 'yellow' is not among its 3 categories"):
        _read_all(pandas_store, categorical_codes={'color': ['red', 'green', 'blue']})


def test_plain_string_column_by_name_and_rows_of_make_reader(tmp_path):
    pq.write_table(pa.table({'id': [0, 1, 2], 'city': ['Oslo', 'Lima', 'Oslo']}), tmp_path / 'p.parquet')
    with make_reader(tmp_path.as_uri(), categorical_codes=['city'], reader_pool_type='dummy') as reader:
        rows = sorted(reader, key=lambda row: row.id)
        assert reader.schema.fields['city'].codec.categories == ['Lima', 'Oslo']
    assert [int(row.city) for row in rows] == [1, 0, 1]


def test_predicates_and_filters_see_values_transforms_see_codes(pandas_store):
    columns, _ = _read_all(pandas_store, categorical_codes=True, filters=[('color', '=', 'red')])
    assert columns['color'].tolist() == [2, 2, 2]
    columns, _ = _read_all(pandas_store, categorical_codes=True, predicate=in_set({'yellow'}, 'color'))
    assert columns['color'].tolist() == [4, 4]
    seen = []

    def spy(frame):
        seen.append(frame['color'].dtype)
        return frame

    _read_all(pandas_store, categorical_codes=True, transform_spec=TransformSpec(spy))
    assert seen
    assert all(dtype == np.int64 for dtype in seen)


def test_batched_data_loader_gives_an_int64_tensor(pandas_store):
    torch = pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader

    with make_batch_reader(pandas_store, categorical_codes=True, shuffle_row_groups=False) as reader:
        batches = list(BatchedDataLoader(reader, batch_size=7))
    assert batches[0]['color'].dtype == torch.int64
    embedded = torch.nn.Embedding(5, 2)(batches[0]['color'])
    assert embedded.shape == (7, 2)


def test_the_loader_refusing_strings_names_the_option(pandas_store):
    pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader

    with make_batch_reader(pandas_store) as reader, pytest.raises(TypeError, match=r"categorical_codes=\['color'\]"):
        BatchedDataLoader(reader, batch_size=2)


@pytest.mark.parametrize(('value', 'message'), [
    ('color', 'categorical_codes must be True'),
    ({'color': 'red'}, "got 'red' as the categories of 'color'"),
    ([3], 'got the field name 3'),
])
def test_option_forms_are_checked_at_once(pandas_store, value, message):
    with pytest.raises(ValueError, match=message):
        make_batch_reader(pandas_store, categorical_codes=value)


def test_fields_named_must_be_read_and_scalar(pandas_store, tmp_path):
    with pytest.raises(ValueError, match=r"names \['colour'\], which are not fields the reader reads"):
        make_batch_reader(pandas_store, categorical_codes=['colour'])
    pq.write_table(pa.table({'id': [0], 'tags': [['a', 'b']]}), tmp_path / 'l.parquet')
    with pytest.raises(ValueError, match="'tags', whose values are not scalars"):
        make_batch_reader(tmp_path.as_uri(), categorical_codes=['tags'])


def test_codec_round_trips_through_json_and_pickle():
    codec = CategoryCodec(['red', 'green'])
    assert codec_from_json(codec.to_json()) == codec
    again = pickle.loads(pickle.dumps(codec))
    assert again == codec
    assert again.names == ['red', 'green']
    field = UnischemaField('color', np.int64, (), codec, False)
    assert codec.encode(field, 1) == 'green'
    assert again.decode_column(field, pa.array(['green', 'red'])).tolist() == [1, 0]
    with pytest.raises(CodecError, match='distinct'):
        CategoryCodec(['a', 'a'])


def test_class_label_names_survive_pickling():
    codec = pickle.loads(pickle.dumps(ClassLabelCodec(['cat', 'dog'])))
    assert codec.names == ['cat', 'dog']
    assert codec.str2int('dog') == 1


def test_a_dataset_written_with_the_codec_stores_values_and_reads_codes(tmp_path):
    from petastorm import write_dataset
    from petastorm.unischema import Unischema

    schema = Unischema('S', [UnischemaField('id', np.int64, (), None, False),
                             UnischemaField('color', np.int64, (), CategoryCodec(['red', 'green']), False)])
    write_dataset(tmp_path.as_uri(), schema, [{'id': i, 'color': i % 2} for i in range(4)])
    assert sorted(pq.read_table(tmp_path).column('color').to_pylist()) == ['green', 'green', 'red', 'red']
    columns, read_schema = _read_all(tmp_path.as_uri())
    assert read_schema.fields['color'].codec == schema.fields['color'].codec
    assert columns['color'].tolist() == [0, 1, 0, 1]
