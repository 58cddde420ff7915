"""Parquet files written by Hugging Face ``datasets``: images, class labels, sequences and arrays, every loader.

The files are written with ``Dataset.to_parquet`` in the test, offline (nothing is fetched from a hub). Pixels are
compared with Pillow's decode of the stored bytes (what ``datasets`` itself gives), labels and boxes with pyarrow's
rows.
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

os.environ['HF_HUB_OFFLINE'] = '1'
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
datasets = pytest.importorskip('datasets')
from PIL import Image  # noqa: E402

from petastorm import make_batch_reader, make_reader  # noqa: E402
from petastorm.codecs import ClassLabelCodec, HFImageCodec  # noqa: E402
from petastorm.pytorch import BatchedDataLoader, DataLoader  # noqa: E402

ROWS = 24
NAMES = ['cat', 'dog', 'bird']


def _image(i: int) -> Image.Image:
    """Images of several sizes, modes and formats (PNG from arrays; JPEG, palette and alpha images too)."""
    rng = np.random.default_rng(i)
    kind = i % 5
    size = (6 + i % 3, 5 + i % 4)
    if kind == 0:
        return Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))
    if kind == 1:
        return Image.fromarray(rng.integers(0, 255, size, dtype=np.uint8), mode='L')
    if kind == 2:
        return Image.fromarray(rng.integers(0, 255, (*size, 4), dtype=np.uint8), mode='RGBA')
    if kind == 3:  # a JPEG, kept as JPEG bytes by datasets
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(buffer, format='JPEG', quality=90)
        return Image.open(io.BytesIO(buffer.getvalue()))
    return Image.fromarray(rng.integers(0, 255, size, dtype=np.uint8), mode='L').convert('P')


def _pixels(stored: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(stored)) as image:
        if image.mode == 'P':
            image = image.convert('RGBA' if 'transparency' in image.info else 'RGB')
        pixels = np.asarray(image)
    return pixels[..., np.newaxis] if pixels.ndim == 2 else pixels


@pytest.fixture(scope='module')
def hf_url(tmp_path_factory):
    path = tmp_path_factory.mktemp('hf')
    features = datasets.Features({
        'image': datasets.Image(),
        'label': datasets.ClassLabel(names=NAMES),
        'boxes': datasets.List(datasets.List(datasets.Value('float32'), length=4)),
        'objects': datasets.Sequence({'category': datasets.ClassLabel(names=NAMES),
                                      'area': datasets.Value('int32')}),
        'tokens': datasets.Sequence(datasets.Value('int64')),
        'mask': datasets.Array2D((2, 3), 'uint8'),
    })
    rows = {'image': [_image(i) for i in range(ROWS)], 'label': [i % 3 for i in range(ROWS)],
            'boxes': [[[float(i), float(k), 4.0, 5.0] for k in range(i % 3)] for i in range(ROWS)],
            'objects': [{'category': [k % 3 for k in range(i % 4)], 'area': [k * i for k in range(i % 4)]}
                        for i in range(ROWS)],
            'tokens': [list(range(i % 5)) for i in range(ROWS)],
            'mask': [np.full((2, 3), i, np.uint8) for i in range(ROWS)]}
    dataset = datasets.Dataset.from_dict(rows, features=features)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        dataset.to_parquet(str(path / 'train.parquet'), batch_size=8)
    return 'file://' + str(path), pq.read_table(path / 'train.parquet')


def test_the_features_make_the_fields(hf_url):
    url, _ = hf_url
    with make_batch_reader(url) as reader:
        fields = reader.schema.fields
    assert fields['image'].codec == HFImageCodec()
    assert fields['image'].shape == (None, None, None)
    assert fields['label'].codec == ClassLabelCodec(NAMES)
    assert fields['label'].codec.int2str(2) == 'bird'
    assert (fields['boxes'].numpy_dtype, fields['boxes'].shape) == (np.float32, (None, 4))
    assert (fields['mask'].numpy_dtype, fields['mask'].shape) == (np.uint8, (2, 3))
    assert fields['objects'].numpy_dtype is dict


@pytest.mark.parametrize('pool', ['dummy', 'process'])
def test_images_decode_to_pillows_pixels(hf_url, pool):
    url, table = hf_url
    expected = table.to_pylist()  # row i has mask value i
    with make_reader(url, reader_pool_type=pool, shuffle_rows=True, seed=3) as reader:
        rows = list(reader)
    assert sorted(int(row.mask[0, 0]) for row in rows) == list(range(ROWS))
    for row in rows:
        want = expected[int(row.mask[0, 0])]
        np.testing.assert_array_equal(row.image, _pixels(want['image']['bytes']))
        assert row.label == want['label']
        assert row.mask.shape == (2, 3)
        assert row.boxes.tolist() == want['boxes']
        assert {name: list(values) for name, values in row.objects.items()} == want['objects']
        assert list(row.tokens) == want['tokens']


def test_torch_loaders_train_on_the_images_and_boxes(hf_url):
    url, table = hf_url
    expected = table.to_pylist()
    reader = make_batch_reader(url, schema_fields=['image', 'label', 'boxes', 'mask'], reader_pool_type='dummy')
    with DataLoader(reader, batch_size=6, shuffling_queue_capacity=10, variable_length='jagged') as loader:
        batches = list(loader)
    for batch in batches:
        for k, key in enumerate(batch['mask'][:, 0, 0].tolist()):
            np.testing.assert_array_equal(batch['image'][k].numpy(), _pixels(expected[key]['image']['bytes']))
            start, stop = batch['boxes'].offsets[k], batch['boxes'].offsets[k + 1]
            assert batch['boxes'].values[start:stop].tolist() == expected[key]['boxes']
            assert batch['label'][k].item() == expected[key]['label']
    reader = make_batch_reader(url, schema_fields=['label', 'boxes', 'mask', 'tokens'], reader_pool_type='dummy')
    with BatchedDataLoader(reader, batch_size=5, shuffling_queue_capacity=12, variable_length='jagged') as loader:
        rows = sum(len(batch['label']) for batch in loader)
    assert rows == ROWS


def test_a_transform_sees_the_decoded_images(hf_url):
    from petastorm import TransformSpec

    url, table = hf_url
    spec = TransformSpec(lambda row: {'label': row['label'], 'height': np.int64(row['image'].shape[0])},
                         edit_fields=[('height', np.int64, (), False)], selected_fields=['label', 'height'])
    with make_reader(url, schema_fields=['image', 'label'], transform_spec=spec, reader_pool_type='dummy',
                     shuffle_row_groups=False) as reader:
        heights = [row.height for row in reader]
    assert heights == [_pixels(row['image']['bytes']).shape[0] for row in table.to_pylist()]


def test_images_stored_as_paths_are_read_next_to_the_data_file_or_refused(tmp_path):
    image_dir = tmp_path / 'data'
    image_dir.mkdir()
    arrays = [np.full((4, 3, 3), i * 10, np.uint8) for i in range(3)]
    for i, array in enumerate(arrays):
        Image.fromarray(array).save(image_dir / f'img{i}.png')
    dataset = datasets.Dataset.from_dict({'image': [str(image_dir / f'img{i}.png') for i in range(3)],
                                          'label': [0, 1, 2]}).cast_column('image', datasets.Image())
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        dataset.to_parquet(str(image_dir / 'train.parquet'))
    assert pq.read_table(image_dir / 'train.parquet').column('image')[0]['bytes'].as_py() is None
    url = 'file://' + str(image_dir / 'train.parquet')  # the images lie next to it
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False,
                     schema_fields=['image', 'label']) as reader:
        images = [row.image for row in reader]
    for image, array in zip(images, arrays, strict=True):
        np.testing.assert_array_equal(image, array)
    (image_dir / 'img1.png').unlink()
    with make_reader(url, reader_pool_type='dummy', schema_fields=['image']) as reader, \
            pytest.raises(Exception, match=r"field 'image', row 1 of row group 0 of .*train.parquet: the image is "
                                           r"stored as the path .*img1.png' only, and no file is at"):
        list(reader)


def test_the_in_memory_loader_and_tensorflow_read_the_hf_files(hf_url):
    from petastorm.pytorch import InMemBatchedDataLoader

    url, table = hf_url
    expected = table.to_pylist()
    reader = make_batch_reader(url, schema_fields=['label', 'boxes', 'mask'], reader_pool_type='dummy')
    with InMemBatchedDataLoader(reader, batch_size=7, shuffle=True, rows_capacity=ROWS,
                                variable_length='jagged') as loader:
        batches = list(loader)
    for batch in batches:
        for k, key in enumerate(batch['mask'][:, 0, 0].tolist()):
            boxes = batch['boxes']
            assert boxes.values[boxes.offsets[k]:boxes.offsets[k + 1]].tolist() == expected[key]['boxes']
    assert sum(len(batch['label']) for batch in batches) == ROWS

    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    tf = pytest.importorskip('tensorflow')
    from petastorm.tf_utils import make_petastorm_dataset

    with make_reader(url, schema_fields=['image', 'label', 'boxes', 'mask'], reader_pool_type='dummy') as reader:
        elements = list(make_petastorm_dataset(reader))
    assert len(elements) == ROWS
    for element in elements:
        want = expected[int(element.mask.numpy()[0, 0])]
        np.testing.assert_array_equal(element.image.numpy(), _pixels(want['image']['bytes']))
        assert element.boxes.numpy().tolist() == want['boxes']
        assert element.label.numpy() == want['label']
    assert isinstance(elements[0].boxes, tf.Tensor)  # one row's boxes: a (count, 4) tensor
