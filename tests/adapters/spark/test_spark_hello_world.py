"""The hello-world examples: the documented Spark generator, then the Python and PyTorch readers."""

import importlib.util
import pathlib

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip('pyspark')

from petastorm import make_batch_reader, make_reader  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'examples' / 'hello_world'


def _load_example(name):
    # Loaded without registering a module name, as when run as a script: Spark then ships the example's
    # functions by value, since workers cannot import the examples directory.
    spec = importlib.util.spec_from_file_location(f'_example_{name}', EXAMPLES / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def hello_world_url(spark, tmp_path_factory):
    url = f'file://{tmp_path_factory.mktemp("hello_world")}/dataset'
    _load_example('generate_hello_world_dataset').generate_petastorm_dataset(url)
    return url


def _stored_rows(url):
    """Every row decoded straight from the Parquet files with the schema's codecs, by id."""
    generator = _load_example('generate_hello_world_dataset')
    rows = {}
    for path in sorted(pathlib.Path(url[len('file://'):]).glob('*.parquet')):
        for record in pq.read_table(path).to_pylist():
            rows[record['id']] = {name: field.codec.decode(field, record[name])
                                  for name, field in generator.HelloWorldSchema.fields.items()}
    return rows


@pytest.mark.spark
def test_generated_dataset_reads_back_with_make_reader(hello_world_url):
    stored = _stored_rows(hello_world_url)
    assert sorted(stored) == list(range(10))
    with make_reader(hello_world_url, reader_pool_type='dummy') as reader:
        rows = list(reader)
    assert sorted(int(r.id) for r in rows) == list(range(10))
    for row in rows:
        assert row.image1.shape == (128, 256, 3)
        assert row.array_4d.shape == (4, 128, 30, 3)
        np.testing.assert_array_equal(row.image1, stored[int(row.id)]['image1'])
        np.testing.assert_array_equal(row.array_4d, stored[int(row.id)]['array_4d'])


@pytest.mark.spark
def test_generated_dataset_reads_back_with_make_batch_reader(hello_world_url):
    stored = _stored_rows(hello_world_url)
    with make_batch_reader(hello_world_url, reader_pool_type='dummy') as reader:  # decodes: no advice to give
        batches = list(reader)
    ids = np.concatenate([b.id for b in batches])
    assert sorted(ids.tolist()) == list(range(10))
    for batch in batches:
        for position, row_id in enumerate(batch.id):
            np.testing.assert_array_equal(batch.image1[position], stored[int(row_id)]['image1'])
            np.testing.assert_array_equal(batch.array_4d[position], stored[int(row_id)]['array_4d'])


@pytest.mark.spark
def test_python_hello_world_prints_every_row(hello_world_url, capsys):
    _load_example('python_hello_world').python_hello_world(hello_world_url)
    lines = capsys.readouterr().out.splitlines()
    row_lines = [line for line in lines if '(128, 256, 3)' in line]
    assert sorted(int(line.split()[0]) for line in row_lines) == list(range(10))
    assert all('(4, 128, 30, 3)' in line for line in row_lines)


@pytest.mark.spark
def test_pytorch_hello_world_batches_every_row(hello_world_url, capsys):
    pytest.importorskip('petastorm.pytorch', reason='petastorm.pytorch is not available yet')
    _load_example('pytorch_hello_world').pytorch_hello_world(hello_world_url)
    out = capsys.readouterr().out
    assert out.count('torch.Size([') >= 3  # 10 rows in batches of 4
    assert 'tensor(' in out


@pytest.mark.spark
@pytest.mark.tf
def test_tensorflow_hello_world_yields_every_row(hello_world_url, capsys):
    pytest.importorskip('tensorflow')
    _load_example('tensorflow_hello_world').tensorflow_hello_world(hello_world_url)
    row_lines = [line for line in capsys.readouterr().out.splitlines() if '(128, 256, 3)' in line]
    assert sorted(int(line.split()[0]) for line in row_lines) == list(range(10))
    assert all('(4, 128, 30, 3)' in line for line in row_lines)
