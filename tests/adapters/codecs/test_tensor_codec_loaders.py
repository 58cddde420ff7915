"""Arrow tensor columns reach the torch and TensorFlow loaders and Ray Data, and Spark writes them (real frameworks)."""

import numpy as np
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import ArrowTensorCodec
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
from support.ray_session import stop_ray

pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')

ROWS = 16
Tensors = Unischema('Tensors', [
    UnischemaField('id', np.int32, (), None, False),
    UnischemaField('image', np.uint8, (4, 5, 3), ArrowTensorCodec(), False),
    UnischemaField('points', np.float32, (None, 2), ArrowTensorCodec(), False),
])


def _row(i):
    return {'id': np.int32(i), 'image': np.full((4, 5, 3), i, np.uint8),
            'points': np.full((1 + i % 3, 2), i, np.float32)}


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    url = f'file://{tmp_path_factory.mktemp("tensor-loaders")}/ds'
    write_dataset(url, Tensors, [_row(i) for i in range(ROWS)], legacy_metadata=False)
    return url


@pytest.mark.torch
def test_torch_batched_loader_gets_tensor_batches(url):
    torch = pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader

    with make_batch_reader(url, schema_fields=['id', 'image']) as reader:
        batches = list(BatchedDataLoader(reader, batch_size=5))
    images = torch.cat([b['image'] for b in batches])
    assert images.shape == (ROWS, 4, 5, 3)
    assert images.dtype == torch.uint8
    assert torch.equal(images[:, 0, 0, 0].long(), torch.cat([b['id'] for b in batches]).long())


@pytest.mark.torch
def test_torch_row_loader_collates_fixed_tensors(url):
    torch = pytest.importorskip('torch')
    from petastorm.pytorch import DataLoader

    with make_reader(url, schema_fields=['id', 'image'], shuffle_row_groups=False) as reader:
        batch = next(iter(DataLoader(reader, batch_size=4)))
    assert batch['image'].shape == (4, 4, 5, 3)
    assert torch.equal(batch['image'][:, 1, 1, 1].long(), batch['id'].long())


@pytest.mark.tf
def test_tf_dataset_gets_tensors_with_static_shapes(url):
    tf = pytest.importorskip('tensorflow')
    from petastorm.tf_utils import make_petastorm_dataset

    with make_batch_reader(url, schema_fields=['id', 'image']) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec.image.shape.as_list() == [None, 4, 5, 3]
        batches = list(dataset)
    images = tf.concat([b.image for b in batches], axis=0).numpy()
    ids = tf.concat([b.id for b in batches], axis=0).numpy()
    assert images.dtype == np.uint8
    np.testing.assert_array_equal(images[:, 3, 4, 2], ids)


@pytest.mark.spark
def test_spark_materialize_writes_flat_arrays_our_readers_decode(spark, tmp_path):
    from petastorm.etl.dataset_metadata import materialize_dataset

    url = f'file://{tmp_path}/spark_tensors'
    with materialize_dataset(spark, url, Tensors, row_group_size_mb=1):
        rows = spark.sparkContext.parallelize(range(ROWS), 2).map(lambda i: dict_to_spark_row(Tensors, _row(i)))
        spark.createDataFrame(rows, Tensors.as_spark_schema()).write.mode('overwrite').parquet(url)
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert isinstance(reader.schema.fields['image'].codec, ArrowTensorCodec)
        got = {int(row.id): row for row in reader}
    assert sorted(got) == list(range(ROWS))
    for i, row in got.items():
        np.testing.assert_array_equal(row.image, _row(i)['image'])
        np.testing.assert_array_equal(row.points, _row(i)['points'])
    with make_batch_reader(url, schema_fields=['image']) as reader:
        images = np.concatenate([b.image for b in reader])
    assert images.shape == (ROWS, 4, 5, 3)
    assert images.dtype == np.uint8


@pytest.mark.slow
def test_ray_data_reads_fixed_tensor_columns_as_arrays(url):
    pytest.importorskip('ray.data', reason='Ray Data is not installed on this platform')  # not the test folder
    import glob

    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        files = glob.glob(url[len('file://'):] + '/*.parquet')
        # Only the fixed-shape column: Ray pickles the schema, and pyarrow cannot pickle its variable_shape_tensor.
        batch = ray.data.read_parquet(files, columns=['id', 'image']).take_batch(ROWS, batch_format='numpy')
    finally:
        if started_here:
            stop_ray()
    assert batch['image'].shape == (ROWS, 4, 5, 3)
    assert batch['image'].dtype == np.uint8
    np.testing.assert_array_equal(batch['image'][:, 0, 0, 0], batch['id'])
