"""ArrowTensorCodec: round trips, the Arrow layouts other tools read, plain Parquet tensors, the conversion tool."""

import glob
import json
import logging
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm._compat import PYARROW_READS_NULL_FIXED_SIZE_LISTS
from petastorm.codecs import ArrowTensorCodec, CompressedNdarrayCodec, NdarrayCodec, codec_from_json
from petastorm.codecs import _tensor as tensor_module
from petastorm.codecs._tensor import _variable_shape_column
from petastorm.errors import CodecError, CorruptDataError, SchemaError
from petastorm.metadata.schema_json import unischema_from_json, unischema_to_json
from petastorm.tools.tensor_columns import main as tensor_columns_main
from petastorm.unischema import Unischema, UnischemaField, arrow_type_of_field

DATA = pathlib.Path(__file__).resolve().parents[1] / 'data'
NUMERIC_TYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                 np.float16, np.float32, np.float64)
SHAPES = ((5,), (2, 3), (2, 1, 3), (1, 2, 2, 3), (2, 1, 2, 1, 2))
CODEC = ArrowTensorCodec()
# pyarrow before 26 cannot read null tensors back from Parquet: there the tests store none, and check the refusal.
NULLS = PYARROW_READS_NULL_FIXED_SIZE_LISTS


def _extension_name(arrow_field):
    """The extension type a stored field holds (pyarrow before 24 reads a variable_shape_tensor as its storage)."""
    if isinstance(arrow_field.type, pa.BaseExtensionType):
        return arrow_field.type.extension_name
    return (arrow_field.metadata or {}).get(b'ARROW:extension:name', b'').decode()


def _field(dtype, shape, nullable=False, name='t'):
    return UnischemaField(name, dtype, shape, CODEC, nullable)


def _values(dtype, shape, rows, seed=0):
    info = np.finfo(dtype) if np.dtype(dtype).kind == 'f' else np.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    rng = np.random.default_rng(seed)
    return [rng.uniform(low, high, shape).astype(dtype) for _ in range(rows)]


@pytest.mark.parametrize('dtype', NUMERIC_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: f'{len(s)}d')
def test_fixed_shape_round_trip_through_parquet(tmp_path, dtype, shape):
    field = _field(dtype, shape)
    values = _values(dtype, shape, 4)
    column = CODEC.encode_column(field, values)
    assert column.type == pa.fixed_shape_tensor(pa.from_numpy_dtype(dtype), list(shape))
    pq.write_table(pa.table({'t': column}), tmp_path / 'f.parquet')
    stored = pq.read_table(tmp_path / 'f.parquet').column('t')
    decoded = CODEC.decode_column(field, stored)
    assert decoded.dtype == dtype
    assert decoded.shape == (4, *shape)
    np.testing.assert_array_equal(decoded, np.stack(values))
    np.testing.assert_array_equal(decoded, stored.chunk(0).to_numpy_ndarray())


def test_decoding_views_the_arrow_buffer():
    field = _field(np.float32, (28, 28))
    column = CODEC.encode_column(field, _values(np.float32, (28, 28), 3))
    decoded = CODEC.decode_column(field, column)
    data = column.storage.values.buffers()[1]
    assert decoded.ctypes.data == data.address  # no copy, no per-row parsing
    assert not decoded.flags.writeable


@pytest.mark.parametrize('dtype', [np.uint8, np.int64, np.float64], ids=lambda t: np.dtype(t).name)
def test_variable_shapes_nulls_and_empty_tensors(tmp_path, dtype):
    field = _field(dtype, (None, 3, None), nullable=True)
    values = [np.ones((2, 3, 4), dtype), None, np.zeros((0, 3, 2), dtype), np.arange(3, dtype=dtype).reshape(1, 3, 1)]
    if not NULLS:
        values[1] = np.full((1, 3, 2), 7, dtype)
    column = CODEC.encode_column(field, values)
    assert column.type.extension_name == 'arrow.variable_shape_tensor'
    pq.write_table(pa.table({'t': column}), tmp_path / 'v.parquet')
    stored = pq.read_table(tmp_path / 'v.parquet')
    assert _extension_name(stored.schema.field('t')) == 'arrow.variable_shape_tensor'
    decoded = CODEC.decode_column(field, stored.column('t'))
    assert decoded.dtype == object
    assert (decoded[1] is None) == NULLS
    for got, expected in zip(decoded, values, strict=True):
        if expected is not None:
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, expected)
    sliced = CODEC.decode_column(field, column.slice(2, 2))
    assert sliced[0].shape == (0, 3, 2)
    assert sliced[1].shape == (1, 3, 1)


def test_variable_shape_column_with_equal_shapes_stacks():
    field = _field(np.int32, (None, 2))
    values = [np.full((3, 2), i, np.int32) for i in range(4)]
    decoded = CODEC.decode_column(field, CODEC.encode_column(field, values))
    assert decoded.shape == (4, 3, 2)
    np.testing.assert_array_equal(decoded, np.stack(values))


def test_null_fixed_tensors_and_a_column_of_nulls():
    field = _field(np.int16, (2, 2), nullable=True)
    values = [None, np.full((2, 2), 7, np.int16), None]
    decoded = CODEC.decode_column(field, CODEC.encode_column(field, values))
    assert decoded[0] is None
    assert decoded[2] is None
    np.testing.assert_array_equal(decoded[1], values[1])
    assert list(CODEC.decode_column(field, CODEC.encode_column(field, [None, None]))) == [None, None]
    empty = CODEC.decode_column(field, CODEC.encode_column(field, []))
    assert empty.shape == (0, 2, 2)


def test_zero_sized_shapes_are_variable_tensors():
    with pytest.raises(SchemaError, match=r'fixed shape \(0, 4\) holds no values.*as None'):
        arrow_type_of_field(_field(np.float32, (0, 4)))
    field = _field(np.float32, (None, 4))
    decoded = CODEC.decode_column(field, CODEC.encode_column(field, [np.zeros((0, 4), np.float32)] * 3))
    assert decoded.shape == (3, 0, 4)


def test_variable_shape_columns_past_the_offset_limit_are_split_into_arrays():
    field = _field(np.int32, (None, 2), nullable=True)
    values = [None if k == 3 else np.full((k, 2), k, np.int32) for k in (2, 4, 1, 3, 5, 0, 5)]
    column = _variable_shape_column(field, CODEC.arrow_type(field), np.dtype(np.int32), values, max_values=10)
    assert isinstance(column, pa.ChunkedArray)
    assert column.type == CODEC.arrow_type(field)
    # Greedy runs of rows holding at most 10 values: (4), (8, 2, null), (10, 0), (10).
    assert [len(chunk) for chunk in column.chunks] == [1, 3, 2, 1]
    assert [chunk.storage.field('data').offsets[-1].as_py() for chunk in column.chunks] == [4, 10, 10, 10]
    decoded = CODEC.decode_column(field, column)
    for got, expected in zip(decoded, values, strict=True):
        if expected is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, expected)


def test_a_variable_shape_tensor_larger_than_one_array_is_refused():
    field = _field(np.int32, (None,))
    with pytest.raises(SchemaError, match=r'field t: the tensor of row 1 holds 6 values.* at most 5'):
        _variable_shape_column(field, CODEC.arrow_type(field), np.dtype(np.int32),
                               [np.zeros(2, np.int32), np.zeros(6, np.int32)], max_values=5)


def test_the_writer_stores_a_tensor_column_built_in_several_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_module, '_MAX_LIST_VALUES', 10)
    schema = Unischema('Split', [UnischemaField('id', np.int32, (), None, False), _field(np.int32, (None, 2))])
    rows = [{'id': i, 't': np.full((i % 5, 2), i, np.int32)} for i in range(50)]
    url = f'file://{tmp_path}/ds'
    write_dataset(url, schema, rows, legacy_metadata=False)
    with make_reader(url, shuffle_row_groups=False) as reader:
        stored = {row.id: row.t for row in reader}
    assert sorted(stored) == list(range(50))
    for row in rows:
        np.testing.assert_array_equal(stored[row['id']], row['t'])


def test_spark_layout_flat_lists_and_struct_without_extension_metadata():
    fixed = _field(np.uint8, (2, 3), nullable=True)
    # Spark has no unsigned types: a uint8 field is written as a list of shorts, nulls as null lists.
    lists = pa.array([list(range(6)), None, list(range(6, 12))], type=pa.list_(pa.int16()))
    decoded = CODEC.decode_column(fixed, lists)
    assert decoded[1] is None
    assert decoded[2].dtype == np.uint8
    np.testing.assert_array_equal(decoded[2], np.arange(6, 12).reshape(2, 3))
    variable = _field(np.float64, (None, 2))
    struct = pa.array([{'data': [1.0, 2.0], 'shape': [1, 2]}, {'data': [1.0, 2.0, 3.0, 4.0], 'shape': [2, 2]}],
                      type=pa.struct([('data', pa.list_(pa.float64())), ('shape', pa.list_(pa.int32()))]))
    decoded = CODEC.decode_column(variable, struct)
    assert [v.shape for v in decoded] == [(1, 2), (2, 2)]


def test_encode_gives_spark_row_values():
    assert CODEC.encode(_field(np.int32, (2, 2)), np.arange(4, dtype=np.int32).reshape(2, 2)) == [0, 1, 2, 3]
    assert CODEC.encode(_field(np.int32, (None,)), np.arange(2, dtype=np.int32)) == {'data': [0, 1], 'shape': [2]}
    np.testing.assert_array_equal(CODEC.decode(_field(np.int32, (2, 2)), [0, 1, 2, 3]), [[0, 1], [2, 3]])


def test_bad_fields_and_values_are_refused_with_the_field_name():
    with pytest.raises(SchemaError, match='field text: ArrowTensorCodec stores integer and floating-point'):
        arrow_type_of_field(_field(np.str_, (3,), name='text'))
    with pytest.raises(SchemaError, match='field flag:'):
        arrow_type_of_field(_field(np.bool_, (3,), name='flag'))
    with pytest.raises(SchemaError, match='field scalar: .*at least one dimension'):
        arrow_type_of_field(_field(np.float32, (), name='scalar'))
    with pytest.raises(SchemaError, match='Unexpected dimensions of t'):
        CODEC.check_value(_field(np.float32, (2, 2)), np.zeros((2, 3), np.float32))
    with pytest.raises(SchemaError, match='Unexpected type of t'):
        CODEC.check_value(_field(np.float32, (2, 2)), np.zeros((2, 2), np.float64))
    with pytest.raises(SchemaError, match='needs the field'):
        CODEC.arrow_type()


def test_stored_shape_mismatch_and_permuted_tensors_are_refused():
    stored = pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(CodecError, match=r'field t: the stored tensors have shape \(3, 4\).*\(4, 3\)'):
        CODEC.decode_column(_field(np.float32, (4, 3)), stored)
    permuted_type = pa.fixed_shape_tensor(pa.float32(), [4, 3], permutation=[1, 0])
    permuted = pa.ExtensionArray.from_storage(permuted_type, stored.storage)
    with pytest.raises(CodecError, match='permutation'):
        CODEC.decode_column(_field(np.float32, (4, 3)), permuted)
    with pytest.raises(CodecError, match='expected a tensor column'):
        CODEC.decode_column(_field(np.float32, (2,)), pa.array([b'ab']))


def test_schema_json_stores_the_codec():
    schema = Unischema('S', [_field(np.float32, (None, 3), True, 'v'), _field(np.uint8, (28, 28), False, 'img')])
    restored = unischema_from_json(unischema_to_json(schema))
    assert restored == schema
    assert [type(f.codec) for f in restored.fields.values()] == [ArrowTensorCodec, ArrowTensorCodec]
    assert json.loads(unischema_to_json(schema))['fields'][0]['codec'] == {'codec': 'arrow_tensor'}
    assert codec_from_json({'codec': 'arrow_tensor'}) == CODEC


Tensors = Unischema('Tensors', [
    UnischemaField('id', np.int64, (), None, False),
    UnischemaField('image', np.uint8, (28, 28), CODEC, False),
    UnischemaField('cloud', np.float32, (None, 3), CODEC, True),
])


def _cloud(i):
    return None if i % 4 == 3 and NULLS else np.full((i % 3, 3), i, np.float32)


def _row(i):
    return {'id': i, 'image': np.full((28, 28), i, np.uint8), 'cloud': _cloud(i)}


@pytest.fixture(scope='module')
def tensor_dataset(tmp_path_factory):
    url = f'file://{tmp_path_factory.mktemp("tensors")}/ds'
    write_dataset(url, Tensors, [_row(i) for i in range(12)], legacy_metadata=False)
    return url


def test_our_readers_decode_the_columns(tensor_dataset):
    with make_batch_reader(tensor_dataset) as reader:
        batches = list(reader)
    ids = np.concatenate([b.id for b in batches])
    images = np.concatenate([b.image for b in batches])
    assert images.shape == (12, 28, 28)
    assert images.dtype == np.uint8
    np.testing.assert_array_equal(images[:, 0, 0], ids)
    with make_reader(tensor_dataset, shuffle_row_groups=False) as reader:
        rows = {row.id: row for row in reader}
    assert (rows[3].cloud is None) == NULLS
    assert rows[5].cloud.shape == (2, 3)
    np.testing.assert_array_equal(rows[7].image, np.full((28, 28), 7, np.uint8))


def test_process_pool_delivers_the_decoded_tensors(tensor_dataset):
    with make_batch_reader(tensor_dataset, reader_pool_type='process', workers_count=2) as reader:
        batches = list(reader)
    images = np.concatenate([b.image for b in batches])
    clouds = np.concatenate([b.cloud for b in batches])
    ids = np.concatenate([b.id for b in batches])
    np.testing.assert_array_equal(images[:, 9, 9], ids)
    assert [None if c is None else c.shape for c in clouds] == [None if _cloud(i) is None else (i % 3, 3) for i in ids]


def _data_file(url):
    return glob.glob(url[len('file://'):] + '/*.parquet')[0]


def test_plain_pyarrow_reads_tensors(tensor_dataset):
    table = pq.read_table(_data_file(tensor_dataset))
    images = table.column('image').combine_chunks().to_numpy_ndarray()
    assert images.shape == (12, 28, 28)
    assert images.dtype == np.uint8
    np.testing.assert_array_equal(images[:, 5, 5], table.column('id').to_numpy())
    assert _extension_name(table.schema.field('cloud')) == 'arrow.variable_shape_tensor'


def test_duckdb_and_polars_read_lists(tensor_dataset):
    duckdb = pytest.importorskip('duckdb', reason='duckdb is not installed on this platform')
    polars = pytest.importorskip('polars', reason='polars is not installed on this platform')
    path = _data_file(tensor_dataset)
    rows = duckdb.sql(f"SELECT id, image, cloud FROM '{path}' ORDER BY id").fetchall()
    assert len(rows[4][1]) == 28 * 28
    assert set(rows[4][1]) == {4}
    assert (rows[3][2] is None) == NULLS
    assert rows[5][2] == {'data': [5.0] * 6, 'shape': [2, 3]}
    frame = polars.read_parquet(path)
    assert frame.height == 12
    image = frame['image'].ext.storage() if hasattr(frame['image'], 'ext') else frame['image']
    assert image.to_list()[2] == [2] * (28 * 28)


def test_hugging_face_datasets_reads_tensors_given_flat_features(tensor_dataset, tmp_path):
    datasets = pytest.importorskip('datasets', reason='Hugging Face datasets is not installed on this platform')
    features = datasets.Features({'id': datasets.Value('int64'),
                                  'image': datasets.List(datasets.Value('uint8'), length=28 * 28)})
    dataset = datasets.Dataset.from_parquet(_data_file(tensor_dataset), features=features, columns=['id', 'image'],
                                            cache_dir=str(tmp_path))
    images = np.asarray(dataset.with_format('numpy')['image'][:]).reshape(-1, 28, 28)
    assert images.shape == (12, 28, 28)
    np.testing.assert_array_equal(images[:, 0, 0], np.asarray(dataset['id'][:]))


def test_plain_parquet_tensors_are_inferred_and_decoded(tmp_path):
    images = np.arange(5 * 4 * 3, dtype=np.float64).reshape(5, 4, 3)
    last = None if NULLS else np.ones((1, 2), np.int16)
    variable = CODEC.encode_column(_field(np.int16, (None, 2), True),
                                   [np.ones((i, 2), np.int16) for i in range(4)] + [last])
    pq.write_table(pa.table({'image': pa.FixedShapeTensorArray.from_numpy_ndarray(images), 'v': variable}),
                   tmp_path / 'plain.parquet')
    with make_batch_reader(f'file://{tmp_path}') as reader:
        fields = reader.schema.fields
        batch = next(iter(reader))
    assert (fields['image'].numpy_dtype, tuple(fields['image'].shape)) == (np.float64, (4, 3))
    assert isinstance(fields['image'].codec, ArrowTensorCodec)
    assert (fields['v'].numpy_dtype, tuple(fields['v'].shape)) == (np.int16, (None, None))
    np.testing.assert_array_equal(batch.image, images)
    assert (batch.v[4] is None) == NULLS
    assert batch.v[3].shape == (3, 2)




@pytest.mark.skipif(NULLS, reason='this pyarrow reads null tensors back from Parquet')
def test_null_tensors_are_refused_or_named_where_pyarrow_cannot_read_them(tmp_path):
    schema = Unischema('Nulls', [_field(np.int32, (2,), nullable=True), _field(np.int32, (None,), True, 'v')])
    rows = [{'t': np.zeros(2, np.int32), 'v': np.zeros(1, np.int32)}, {'t': None, 'v': np.zeros(3, np.int32)}]
    with pytest.raises(SchemaError, match=r"column 't' holds null rows .* pyarrow 26 and later can"):
        write_dataset(f'file://{tmp_path}/ds', schema, rows)
    with pytest.raises(SchemaError, match=r"column 'v' holds null rows"):
        write_dataset(f'file://{tmp_path}/ds', schema, [{'t': np.zeros(2, np.int32), 'v': None}])
    # A fixed_shape_tensor column [[0, 1], None, [4, 5]], written by pyarrow 26.
    with make_batch_reader(f'file://{DATA}/null_tensors/nulls.parquet') as reader, \
            pytest.raises(CorruptDataError, match=r'nulls.parquet: it holds null rows.* pyarrow 26 and later can'):
        next(iter(reader))


@pytest.fixture
def petastorm_logging_restored():
    """The tool's main configures the 'petastorm' logger for a command line (a handler, level INFO): undo it."""
    logger = logging.getLogger('petastorm')
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


@pytest.mark.usefixtures('petastorm_logging_restored')
def test_conversion_tool_rewrites_ndarray_columns(tmp_path, capsys):
    blobs = Unischema('Blobs', [UnischemaField('id', np.int32, (), None, False),
                                UnischemaField('a', np.float32, (3, 2), NdarrayCodec(), False),
                                UnischemaField('b', np.int64, (None,), CompressedNdarrayCodec(), True)])
    source = f'file://{tmp_path}/blobs'
    write_dataset(source, blobs, [{'id': i, 'a': np.full((3, 2), i, np.float32),
                                   'b': None if i == 1 and NULLS else np.arange(i, dtype=np.int64)} for i in range(6)])
    target = f'file://{tmp_path}/converted'
    tensor_columns_main([source, '--columns', 'a', 'b', '--output-url', target])
    assert 'converted a, b' in capsys.readouterr().out
    stored = pq.read_schema(_data_file(target))
    assert stored.field('a').type == pa.fixed_shape_tensor(pa.float32(), [3, 2])
    with make_reader(target, shuffle_row_groups=False) as reader:
        rows = sorted(reader, key=lambda r: r.id)
    assert isinstance(reader.schema.fields['a'].codec, ArrowTensorCodec)
    np.testing.assert_array_equal(rows[4].a, np.full((3, 2), 4, np.float32))
    assert (rows[1].b is None) == NULLS
    assert list(rows[5].b) == [0, 1, 2, 3, 4]
    with make_reader(source) as reader:  # the source is untouched
        assert isinstance(reader.schema.fields['a'].codec, NdarrayCodec)
    with pytest.raises(SystemExit) as exit_info:
        tensor_columns_main([source, '--columns', 'id'])
    assert exit_info.value.code == 2
    assert "field 'id' is stored with no codec" in capsys.readouterr().err


def test_conversion_tool_is_installed_as_a_command(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    command = Path(sys.executable).parent / 'petastorm-tensor-columns'
    version = subprocess.run([str(command), '--version'], capture_output=True, text=True, timeout=60, check=False)
    assert version.returncode == 0
    assert version.stdout.startswith('petastorm-tensor-columns ')
    missing = subprocess.run([str(command), f'file://{tmp_path}/nothing', '--columns', 'a'], capture_output=True,
                             text=True, timeout=60, check=False)
    assert missing.returncode == 2
    assert 'does not exist' in missing.stderr
