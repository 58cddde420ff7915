"""petastorm.ray on a real local Ray instance: read_petastorm as make_reader reads, write_petastorm as write_dataset.

One Ray instance (2 CPUs, no dashboard, loopback) serves the module; it is shut down at the end, and no Ray worker
process may outlive it.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.predicates import in_lambda
from petastorm.selectors import SingleIndexSelector
from petastorm.unischema import Unischema, UnischemaField
from support.nested_tables import every_type_table
from support.ray_session import start_ray, stop_ray

# ray.data, not ray: without Ray, `import ray` finds this test folder (tests/adapters/ray) as a namespace package.
pytest.importorskip('ray.data')
import ray  # noqa: E402

from petastorm.ray import read_petastorm, write_petastorm  # noqa: E402

LEGACY = pathlib.Path(__file__).resolve().parents[2] / 'data' / 'legacy_0_13_1'
ROWS = 120

Shapes = Unischema('Shapes', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('vector', np.float32, (3,), NdarrayCodec(), False),
    UnischemaField('image', np.uint8, (8, 6, 3), CompressedImageCodec('png'), False),
])


def shape_rows(count: int = ROWS) -> list[dict]:
    rng = np.random.default_rng(7)
    return [{'id': i, 'name': f'shape-{i}', 'vector': np.array([i, -i, 0.5 * i], np.float32),
             'image': rng.integers(0, 255, (8, 6, 3), dtype=np.uint8)} for i in range(count)]


def _ray_worker_pids() -> set[int]:
    listing = subprocess.run(['ps', '-eo', 'pid=,args='], capture_output=True, text=True, check=True).stdout
    return {int(line.split(None, 1)[0]) for line in listing.splitlines()
            if 'ray::' in line or 'default_worker.py' in line or 'raylet' in line}


@pytest.fixture(scope='module')
def ray_cluster():
    before = _ray_worker_pids()
    start_ray(__name__)  # functions of this module (transforms, training loops) go to the workers by value
    yield
    stop_ray()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    deadline = time.monotonic() + 30
    while (left := _ray_worker_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f'Ray processes still running after ray.shutdown(): {sorted(left)}'


@pytest.fixture(scope='module')
def shapes_url(tmp_path_factory):
    url = tmp_path_factory.mktemp('ray').joinpath('shapes').as_uri()
    write_dataset(url, Shapes, shape_rows(), row_group_size_mb=0.004, progress=False)
    return url


def _columns(ds) -> dict[str, np.ndarray]:
    """Every row of ``ds``, as numpy columns in id order."""
    batches = list(ds.iter_batches(batch_size=None, batch_format='numpy'))
    columns = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}
    order = np.argsort(columns['id'], kind='stable')
    return {name: values[order] for name, values in columns.items()}


def _assert_same_values(ours, expected) -> None:
    assert type(ours) is type(expected) or isinstance(expected, str), (ours, expected)
    if isinstance(expected, np.ndarray):
        assert ours.dtype == expected.dtype
        assert ours.shape == expected.shape
        np.testing.assert_array_equal(ours, expected)
    else:
        assert ours == expected


def test_every_row_once_decoded_as_make_reader_decodes_it(ray_cluster, shapes_url):
    ds = read_petastorm(shapes_url)
    columns = _columns(ds)
    assert columns['id'].tolist() == list(range(ROWS))
    assert columns['vector'].dtype == np.float32
    assert columns['vector'].shape == (ROWS, 3)
    assert columns['image'].dtype == np.uint8
    assert columns['image'].shape == (ROWS, 8, 6, 3)
    with make_reader(shapes_url, shuffle_row_groups=False) as reader:
        for row in reader:
            for name in Shapes.fields:
                ours = columns[name][row.id]
                _assert_same_values(ours if name != 'name' else str(ours), getattr(row, name))
    # A second pass reads every row again, once.
    assert sorted(ds.to_pandas()['id']) == list(range(ROWS))


def test_torch_batches_and_map_batches_see_tensor_columns(ray_cluster, shapes_url):
    import torch

    ds = read_petastorm(shapes_url, schema_fields=['id', 'vector', 'image'])
    seen = 0
    for batch in ds.iter_torch_batches(batch_size=64):
        assert batch['image'].dtype == torch.uint8
        assert tuple(batch['image'].shape[1:]) == (8, 6, 3)
        assert batch['vector'].dtype == torch.float32
        torch.testing.assert_close(batch['vector'][:, 0], batch['id'].to(torch.float32))
        seen += len(batch['id'])
    assert seen == ROWS

    def brightness(batch):
        return {'id': batch['id'], 'mean': batch['image'].reshape(len(batch['id']), -1).mean(axis=1)}

    means = _columns(ds.map_batches(brightness, batch_format='numpy'))['mean']
    expected = np.array([row['image'].mean() for row in shape_rows()])
    np.testing.assert_allclose(means, expected)


def test_tensor_columns_follow_the_tensor_format_ray_is_configured_for(ray_cluster, shapes_url):
    from ray.data._internal.tensor_extensions.arrow import FixedShapeTensorFormat

    context = ray.data.DataContext.get_current()
    default = context.arrow_fixed_shape_tensor_format
    assert isinstance(read_petastorm(shapes_url).schema().base_schema.field('image').type,
                      ray.data.extensions.ArrowTensorTypeV2)
    context.arrow_fixed_shape_tensor_format = FixedShapeTensorFormat.ARROW_NATIVE
    try:
        ds = read_petastorm(shapes_url, schema_fields=['id', 'image'])
        image_type = ds.schema().base_schema.field('image').type
        images = _columns(ds)['image']
    finally:
        context.arrow_fixed_shape_tensor_format = default
    assert isinstance(image_type, pa.FixedShapeTensorType)
    assert image_type.shape == [8, 6, 3]
    np.testing.assert_array_equal(images, np.stack([row['image'] for row in shape_rows()]))


def test_schema_fields_predicate_and_filters_select_what_make_reader_selects(ray_cluster, shapes_url):
    ds = read_petastorm(shapes_url, schema_fields=['id', 'vec.*'], predicate=in_lambda(['id'], lambda i: i % 3 == 0),
                        filters=[('id', '<', 60)])
    columns = _columns(ds)
    assert set(columns) == {'id', 'vector'}
    assert columns['id'].tolist() == [i for i in range(60) if i % 3 == 0]
    with make_reader(shapes_url, schema_fields=['id', 'vec.*'], predicate=in_lambda(['id'], lambda i: i % 3 == 0),
                     filters=[('id', '<', 60)]) as reader:
        assert sorted(row.id for row in reader) == columns['id'].tolist()


def test_rowgroup_selector_of_a_petastorm_0_13_1_dataset(ray_cluster):
    url = (LEGACY / 'with_index').as_uri()
    ds = read_petastorm(url, rowgroup_selector=SingleIndexSelector('id_index', [3, 13]),
                        schema_fields=['id', 'label', 'vector'])
    with make_reader(url, rowgroup_selector=SingleIndexSelector('id_index', [3, 13]),
                     schema_fields=['id', 'label', 'vector']) as reader:
        expected = {row.id: row for row in reader}
    columns = _columns(ds)
    assert columns['id'].tolist() == sorted(expected)
    assert len(expected) == 8
    for i, vector in zip(columns['id'], columns['vector'], strict=True):
        np.testing.assert_array_equal(vector, expected[i].vector)


def test_every_field_kind_of_a_petastorm_0_13_1_dataset(ray_cluster):
    url = (LEGACY / 'all_types').as_uri()
    columns = _columns(read_petastorm(url))
    with make_reader(url) as reader:
        rows = sorted(reader, key=lambda row: row.id)
    assert columns['id'].tolist() == [row.id for row in rows]
    for name in rows[0]._fields:
        for k, row in enumerate(rows):
            expected, ours = getattr(row, name), columns[name][k]
            if isinstance(expected, np.ndarray):
                np.testing.assert_array_equal(ours, expected, err_msg=name)
                assert np.asarray(ours).dtype == expected.dtype or expected.dtype.kind == 'U', name
            elif expected is None:
                assert ours is None or (isinstance(ours, float) and np.isnan(ours)), (name, ours)
            else:
                assert ours == expected, (name, ours, expected)


def test_plain_parquet_reads_as_make_batch_reader_reads_it(ray_cluster):
    url = (LEGACY / 'plain_parquet').as_uri()
    columns = _columns(read_petastorm(url))
    with make_batch_reader(url) as reader:
        batches = list(reader)
    expected_ids = sorted(int(i) for batch in batches for i in batch.id)
    assert columns['id'].tolist() == expected_ids
    assert columns['list_col'].shape == (len(expected_ids), 3)


def test_nested_ragged_and_null_columns_come_back_as_pyarrow_wrote_them(ray_cluster, tmp_path):
    table = every_type_table(40, seed=5)
    pq.write_table(table, tmp_path / 'data.parquet', row_group_size=10)
    names = ['id', 'nint', 'text', 'ids', 'nested', 'boxes', 'holes', 'point', 'objects', 'attrs', 'when', 'price']
    ds = read_petastorm(tmp_path.as_uri(), schema_fields=names)
    blocks = pa.concat_tables(ray.get(ds.to_arrow_refs())).sort_by('id')
    expected = table.select(names)
    for name in names:
        assert blocks.column(name).to_pylist() == expected.column(name).to_pylist(), name


def test_ray_pushes_column_selection_and_scalar_filters_into_the_read(ray_cluster, shapes_url):
    from ray.data.expressions import col

    from petastorm.ray import PetastormDatasource

    ds = read_petastorm(shapes_url).filter(expr=col('id') >= 100).select_columns(['id', 'vector'])
    columns = _columns(ds)
    assert set(columns) == {'id', 'vector'}
    assert columns['id'].tolist() == list(range(100, ROWS))
    assert read_petastorm(shapes_url).filter(expr=col('id') < 7).count() == 7
    # The filter became statistics pruning: fewer row groups are planned; a filter on a codec column stays Ray's.
    source = PetastormDatasource(shapes_url)
    pruned = source.apply_predicate(col('id') >= 100)
    assert 0 < len(pruned._items) < len(source._items)
    assert source.apply_predicate(col('vector') == 1) is source


def test_more_blocks_than_row_groups_splits_row_groups(ray_cluster, shapes_url):
    with make_reader(shapes_url) as reader:
        row_groups = len(reader.work_items)
    materialized = read_petastorm(shapes_url, override_num_blocks=3 * row_groups).materialize()
    assert materialized.num_blocks() > row_groups
    assert sorted(materialized.to_pandas()['id']) == list(range(ROWS))


def test_an_error_in_a_read_task_names_the_file_and_row_group(ray_cluster, tmp_path):
    url = tmp_path.joinpath('broken').as_uri()
    write_dataset(url, Shapes, shape_rows(20), row_group_size_mb=0.004, progress=False)
    broken = sorted(tmp_path.joinpath('broken').glob('*.parquet'))[0]
    ds = read_petastorm(url)  # planned from the metadata, before the file is damaged
    # Garbage of the same size: a file of another size is a DataFileChangedError
    # (tests/storage/store/test_damaged_stores.py).
    broken.write_bytes(b'not parquet'.ljust(broken.stat().st_size, b'!'))
    with pytest.raises(Exception, match='row group') as caught:
        ds.take_all()
    assert broken.name in str(caught.value)
    assert 'CorruptDataError' in str(caught.value) or 'CorruptDataError' in type(caught.value).__name__


def test_write_petastorm_then_make_reader(ray_cluster, tmp_path):
    url = tmp_path.joinpath('written').as_uri()
    rows = shape_rows(50)
    ds = ray.data.from_items(rows, override_num_blocks=3)
    write_petastorm(ds, url, Shapes, row_group_size_mb=0.002)
    assert list(tmp_path.joinpath('written').glob('_petastorm_staging*')) == []
    with make_reader(url) as reader:
        read = {row.id: row for row in reader}
    assert sorted(read) == list(range(50))
    for row in rows:
        np.testing.assert_array_equal(read[row['id']].image, row['image'])
        np.testing.assert_array_equal(read[row['id']].vector, row['vector'])
        assert read[row['id']].name == row['name']
    with pytest.raises(FileExistsError, match='not empty'):
        write_petastorm(ds, url, Shapes)


def test_a_failed_write_leaves_nothing(ray_cluster, tmp_path):
    rows = shape_rows(30)
    rows[25]['vector'] = np.zeros(4, np.float32)  # not the field's shape
    target = tmp_path.joinpath('failed')
    with pytest.raises(Exception, match='vector'):
        write_petastorm(ray.data.from_items(rows, override_num_blocks=2), target.as_uri(), Shapes)
    assert not target.exists()


def test_write_petastorm_without_a_schema_column_names_the_field(ray_cluster, tmp_path):
    rows = [{name: value for name, value in row.items() if name != 'vector'} for row in shape_rows(6)]
    target = tmp_path.joinpath('missing_column')
    with pytest.raises(Exception, match=r"no column for the schema fields \['vector'\]"):
        write_petastorm(ray.data.from_items(rows), target.as_uri(), Shapes)
    assert not target.exists()


def test_streaming_split_gives_two_equal_disjoint_shares(ray_cluster, shapes_url):
    shards = read_petastorm(shapes_url, schema_fields=['id']).streaming_split(2, equal=True)
    seen: list[list[int]] = [[], []]

    def consume(k):
        for batch in shards[k].iter_batches(batch_size=16, batch_format='numpy'):
            seen[k].extend(batch['id'].tolist())

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert len(seen[0]) == len(seen[1]) == ROWS // 2
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(ROWS))


def test_torch_trainer_example_trains_one_epoch(ray_cluster, tmp_path):
    pytest.importorskip('sklearn')
    examples = pathlib.Path(__file__).resolve().parents[3] / 'examples'
    sys.path[:0] = [str(examples / 'ray'), str(examples / 'mnist')]
    try:
        import generate_petastorm_mnist
        import train_mnist_ray
    finally:
        del sys.path[:2]
    # Run as a script its training loop is sent by value; imported here, it must be too.
    ray.cloudpickle.register_pickle_by_value(train_mnist_ray)
    url = tmp_path.joinpath('mnist').as_uri()
    counts = generate_petastorm_mnist.generate(url, max_rows=300, row_group_size_mb=0.05)
    result = train_mnist_ray.train(f'{url}/train', epochs=1, batch_size=32, storage_path=str(tmp_path / 'runs'))
    assert result.error is None
    assert result.metrics['epoch'] == 0
    # Ray Train splits the dataset equally between the 2 workers: at most one row is left out.
    assert counts['train'] - 1 <= result.metrics['rows'] <= counts['train']
    assert np.isfinite(result.metrics['loss'])
    with result.checkpoint.as_directory() as directory:
        assert pathlib.Path(directory, 'model.pt').stat().st_size > 0


def test_importing_petastorm_ray_loads_no_ray():
    code = 'import sys, petastorm.ray; print("ray" in sys.modules)'
    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip() == \
        'False'


def test_without_ray_the_error_names_the_extra(monkeypatch):
    from petastorm.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, 'ray.data', None)  # makes `import ray.data` raise ImportError
    with pytest.raises(MissingDependencyError, match=r"neo-petastorm\[ray\]"):
        read_petastorm('file:///nowhere')


def test_read_petastorm_reads_delta_and_iceberg_tables_with_their_deletes(ray_cluster, tmp_path):
    deltalake = pytest.importorskip('deltalake')
    pytest.importorskip('pyiceberg')
    from pyiceberg.catalog.memory import InMemoryCatalog

    from support.tables_util import add_deletion_vector, current_adds, iceberg_position_deletes

    data = pa.table({'id': pa.array(range(100), pa.int64()), 'x': pa.array(np.arange(100, dtype=np.float32))})
    root = str(tmp_path / 'delta')
    deltalake.write_deltalake(root, data, configuration={'delta.enableDeletionVectors': 'true'})
    (path,) = current_adds(root)
    add_deletion_vector(root, path, list(range(0, 100, 2)))
    catalog = InMemoryCatalog('ray', warehouse=f'file://{tmp_path}/warehouse')
    catalog.create_namespace('ns')
    table = catalog.create_table('ns.t', schema=data.schema)
    table.append(data)
    (data_file,) = [task.file.file_path for task in table.scan().plan_files()]
    iceberg_position_deletes(table, {data_file: list(range(0, 100, 2))})
    for source in (f'file://{root}', catalog.load_table('ns.t')):
        ds = read_petastorm(source, filters=[('id', '<', 50)])
        assert _columns(ds)['id'].tolist() == list(range(1, 50, 2))
    assert _columns(read_petastorm(f'file://{root}', table_version=0))['id'].tolist() == list(range(100))
