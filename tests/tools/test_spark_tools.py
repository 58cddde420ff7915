"""Spark-side tools: row-group indexes built on Spark, dataset_as_rdd, copy_dataset, metadata regeneration, CLIs."""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

T = pytest.importorskip('pyspark.sql.types')

from petastorm import make_reader, write_dataset  # noqa: E402
from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url, load_row_groups  # noqa: E402
from petastorm.etl.petastorm_generate_metadata import generate_petastorm_metadata  # noqa: E402
from petastorm.etl.rowgroup_indexers import FieldNotNullIndexer, SingleFieldIndexer  # noqa: E402
from petastorm.etl.rowgroup_indexing import build_rowgroup_index, get_row_group_indexes  # noqa: E402
from petastorm.spark_utils import dataset_as_rdd  # noqa: E402
from petastorm.store import keys  # noqa: E402
from petastorm.tools.copy_dataset import copy_dataset  # noqa: E402
from petastorm.tools.spark_session_cli import add_configure_spark_arguments, configure_spark  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402

LEGACY = pathlib.Path(__file__).resolve().parents[1] / 'data' / 'legacy_0_13_1'
BIN = pathlib.Path(sys.executable).parent

Animals = Unischema('Animals', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('kind', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('image', np.uint8, (4, 4, 3), CompressedImageCodec('png'), True),
    UnischemaField('vector', np.float32, (3,), NdarrayCodec(), False),
])
KINDS = ['cat', 'dog', 'bird']


def animal_row(i):
    return {'id': i, 'kind': KINDS[i % 3], 'image': None if i % 4 == 0 else np.full((4, 4, 3), i, np.uint8),
            'vector': np.arange(3, dtype=np.float32) + i}


@pytest.fixture
def animals_url(tmp_path):
    url = f'file://{tmp_path}/animals'
    # Tiny row groups: several pieces, so indexes and copies have something to distinguish.
    write_dataset(url, Animals, (animal_row(i) for i in range(24)), row_group_size_mb=0.0005)
    assert len(load_row_groups(url)) > 3
    return url


def _rows(url, **kwargs):
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False, **kwargs) as reader:
        return sorted((r._asdict() for r in reader), key=lambda r: r['id'])


def _assert_rows_equal(left, right):
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(b[name], np.ndarray):
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
                assert a[name].dtype == b[name].dtype, name
            else:
                assert type(a[name]) is type(b[name]), name
                assert a[name] == b[name], name


# --- build_rowgroup_index on Spark --------------------------------------------------------------------------------

@pytest.mark.spark
def test_index_built_on_spark_equals_local_index(spark, animals_url):
    indexers = [SingleFieldIndexer('by_kind', 'kind'), SingleFieldIndexer('by_id', 'id'),
                FieldNotNullIndexer('has_image', 'image')]
    on_spark = build_rowgroup_index(animals_url, spark.sparkContext, indexers)
    stored_from_spark = get_row_group_indexes(animals_url)
    local = build_rowgroup_index(animals_url, None, indexers)
    for name in ('by_kind', 'by_id', 'has_image'):
        assert on_spark[name].to_json() == local[name].to_json() == stored_from_spark[name].to_json()
    assert set(local['by_kind'].indexed_values) == set(KINDS)


# --- dataset_as_rdd ---------------------------------------------------------------------------------------------

@pytest.mark.spark
def test_dataset_as_rdd_decodes_rows(spark, animals_url):
    rows = sorted(dataset_as_rdd(animals_url, spark).collect(), key=lambda r: r.id)
    assert [r.id for r in rows] == list(range(24))
    assert type(rows[0]).__name__ == 'Animals_view'
    assert rows[0]._fields == tuple(Animals.fields)
    assert rows[0].image is None
    np.testing.assert_array_equal(rows[5].image, np.full((4, 4, 3), 5, np.uint8))
    assert rows[5].vector.dtype == np.float32
    assert isinstance(rows[5].kind, np.str_)


@pytest.mark.spark
def test_dataset_as_rdd_selects_fields(spark, animals_url):
    rows = dataset_as_rdd(animals_url, spark, schema_fields=[Animals.kind, 'i.*']).collect()
    assert rows[0]._fields == ('kind', 'id', 'image')
    with pytest.raises(ValueError, match='does not belong'):
        dataset_as_rdd(animals_url, spark, schema_fields=[UnischemaField('nope', np.int8, (), None, False)])


# --- spark_session_cli --------------------------------------------------------------------------------------------

class _RecordingBuilder:
    def __init__(self):
        self.calls = []

    def master(self, url):
        self.calls.append(('master', url))
        return self

    def config(self, key, value):
        self.calls.append((key, value))
        return self


def test_configure_spark_applies_master_and_settings():
    parser = add_configure_spark_arguments(argparse.ArgumentParser())
    args = parser.parse_args(['--master', 'local[3]', '--spark-session-config', 'a.b=1', 'c=x=y'])
    builder = configure_spark(_RecordingBuilder(), args)
    assert builder.calls == [('master', 'local[3]'), ('a.b', '1'), ('c', 'x=y')]
    assert configure_spark(_RecordingBuilder(), parser.parse_args([])).calls == []


def test_configure_spark_errors():
    with pytest.raises(RuntimeError, match='add_configure_spark_arguments'):
        configure_spark(_RecordingBuilder(), argparse.Namespace())
    args = add_configure_spark_arguments(argparse.ArgumentParser()).parse_args(['--spark-session-config', 'novalue'])
    with pytest.raises(ValueError, match='key=value'):
        configure_spark(_RecordingBuilder(), args)


# --- copy_dataset -------------------------------------------------------------------------------------------------

@pytest.mark.spark
def test_copy_selected_fields_and_non_null_rows(spark, animals_url, tmp_path):
    target = f'file://{tmp_path}/copy'
    copy_dataset(spark, animals_url, target, ['id', 'im.*'], ['image'], False, 2, None)
    schema = get_schema_from_dataset_url(target)
    assert list(schema.fields) == ['id', 'image']
    assert len(list((tmp_path / 'copy').glob('*.parquet'))) == 2
    copied = _rows(target)
    expected = [{k: v for k, v in r.items() if k in ('id', 'image')} for r in _rows(animals_url)
                if r['image'] is not None]
    _assert_rows_equal(copied, expected)


@pytest.mark.spark
def test_copy_refuses_existing_target_unless_overwrite(spark, animals_url, tmp_path):
    target = f'file://{tmp_path}/copy'
    copy_dataset(spark, animals_url, target, None, None, False, None, None)
    before = (tmp_path / 'copy' / '_common_metadata').read_bytes()
    with pytest.raises(Exception, match='already exists') as raised:
        copy_dataset(spark, animals_url, target, ['id'], None, False, None, None)
    assert 'AnalysisException' in type(raised.value).__name__
    assert (tmp_path / 'copy' / '_common_metadata').read_bytes() == before
    copy_dataset(spark, animals_url, target, ['id'], None, True, None, 1)
    assert list(get_schema_from_dataset_url(target).fields) == ['id']
    assert [r['id'] for r in _rows(target)] == list(range(24))


@pytest.mark.spark
def test_copy_main_in_process_raises_and_keeps_the_callers_session(spark, animals_url, tmp_path):
    from petastorm.tools import copy_dataset as tool

    target = f'file://{tmp_path}/copy'
    tool._main([animals_url, target, '--field-regex', 'id', 'kind', '--partition-count', '1'])
    assert list(get_schema_from_dataset_url(target).fields) == ['id', 'kind']
    assert len(list((tmp_path / 'copy').glob('*.parquet'))) == 1
    # In process, errors are raised as copy_dataset raises them (no exit code), and the active session survives.
    with pytest.raises(Exception, match='already exists') as raised:
        tool._main([animals_url, target])
    assert 'AnalysisException' in type(raised.value).__name__
    tool._main([animals_url, target, '--overwrite', '--not-null-fields', 'image'])
    assert [r['id'] for r in _rows(target)] == [r['id'] for r in _rows(animals_url) if r['image'] is not None]
    assert spark.range(3).count() == 3


def test_copy_rejects_regexes_that_match_nothing(animals_url, tmp_path):
    with pytest.raises(ValueError, match='do not match any fields'):
        copy_dataset(None, animals_url, f'file://{tmp_path}/copy', ['nothing.*'], None, False, None, None)
    with pytest.raises(ValueError, match='not-null'):
        copy_dataset(None, animals_url, f'file://{tmp_path}/copy', ['id'], ['kind'], False, None, None)


# --- generate_petastorm_metadata ----------------------------------------------------------------------------------

def _legacy_copy(name, tmp_path):
    target = tmp_path / name
    shutil.copytree(LEGACY / name, target)
    return f'file://{target}'


@pytest.mark.parametrize('name', ['all_types', 'partitioned', 'summary_metadata', 'with_index'])
def test_regenerated_legacy_metadata_reads_back_identically(name, tmp_path):
    url = _legacy_copy(name, tmp_path)
    before = _rows(url)
    generate_petastorm_metadata(None, url)
    metadata = pq.read_metadata(tmp_path / name / '_common_metadata').metadata
    assert keys.SCHEMA_JSON_KEY in metadata
    assert keys.ROW_GROUPS_PER_FILE_KEY in metadata
    assert get_schema_from_dataset_url(url) == get_schema_from_dataset_url(f'file://{LEGACY / name}')
    _assert_rows_equal(_rows(url), before)
    if name == 'with_index':  # row-group indexes survive the regeneration
        assert set(get_row_group_indexes(url)) == {'id_index', 'label_index', 'image_not_null'}


def test_regenerate_with_a_named_schema_and_summary_file(animals_url, tmp_path):
    root = pathlib.Path(animals_url[len('file://'):])
    (root / '_common_metadata').unlink()
    generate_petastorm_metadata(None, animals_url)  # now a plain store: its summary, no schema asked for
    assert (root / '_metadata').exists()
    assert not (root / '_common_metadata').exists()
    generate_petastorm_metadata(None, animals_url, f'{__name__}.Animals', use_summary_metadata=True)
    assert get_schema_from_dataset_url(animals_url) == Animals
    summary = pq.read_metadata(root / '_metadata')
    assert summary.num_row_groups == len(load_row_groups(animals_url))
    assert [r['id'] for r in _rows(animals_url)] == list(range(24))
    with pytest.raises(ValueError, match='not a Unischema'):
        generate_petastorm_metadata(None, animals_url, f'{__name__}.KINDS')


def test_generate_metadata_main_in_process(animals_url, tmp_path):
    from petastorm.etl import petastorm_generate_metadata as tool

    root = pathlib.Path(animals_url[len('file://'):])
    (root / '_common_metadata').unlink()
    tool._main(['--dataset_url', animals_url])  # now a plain store: its summary, no schema asked for
    assert not (root / '_common_metadata').exists()
    tool._main(['--dataset_url', animals_url, '--unischema_class', f'{__name__}.Animals', '--use-summary-metadata'])
    assert get_schema_from_dataset_url(animals_url) == Animals
    assert (root / '_metadata').exists()
    assert [r['id'] for r in _rows(animals_url)] == list(range(24))


# --- command lines ------------------------------------------------------------------------------------------------

def _run(command, *args, timeout=300):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP='127.0.0.1')
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize('command', ['petastorm-copy-dataset.py', 'petastorm-generate-metadata.py'])
def test_cli_help(command):
    result = _run(command, '--help')
    assert result.returncode == 0
    assert 'usage:' in result.stdout
    assert '--master' in result.stdout


def test_cli_bad_urls_fail_fast_with_one_line(tmp_path, animals_url):
    cases = [
        ('petastorm-generate-metadata.py', ['--dataset_url', 'relative/dir'], 'scheme-less'),
        ('petastorm-generate-metadata.py', ['--dataset_url', f'file://{tmp_path}/missing'], 'does not exist'),
        ('petastorm-copy-dataset.py', [f'file://{tmp_path}/missing', f'file://{tmp_path}/out'], 'does not exist'),
        ('petastorm-copy-dataset.py', [animals_url, animals_url], 'already exists'),
        ('petastorm-copy-dataset.py', [animals_url, f'file://{tmp_path}/out', '--field-regex', 'zzz'],
         'do not match any fields'),
    ]
    for command, args, message in cases:
        result = _run(command, *args)
        assert result.returncode != 0, (command, args)
        errors = [line for line in result.stderr.splitlines() if 'error:' in line]
        assert len(errors) == 1, (command, args, result.stderr)
        assert message in errors[0], (command, args, result.stderr)
        assert 'Traceback' not in result.stderr


def test_generate_metadata_cli_regenerates_legacy_dataset(tmp_path):
    url = _legacy_copy('partitioned', tmp_path)
    before = _rows(url)
    result = _run('petastorm-generate-metadata.py', '--dataset_url', url)
    assert result.returncode == 0, result.stderr
    assert 'footers' in result.stderr  # progress on stderr
    assert keys.SCHEMA_JSON_KEY in pq.read_metadata(tmp_path / 'partitioned' / '_common_metadata').metadata
    _assert_rows_equal(_rows(url), before)


@pytest.mark.spark
def test_copy_dataset_cli(animals_url, tmp_path, spark_jvm_options):
    # Its own JVM: the command starts and stops a Spark session of its own.
    target = f'file://{tmp_path}/cli_copy'
    result = _run('petastorm-copy-dataset.py', animals_url, target, '--field-regex', 'id', 'kind',
                  '--not-null-fields', 'kind', '--partition-count', '1', '--master', 'local[1]',
                  '--spark-session-config', 'spark.ui.enabled=false', 'spark.driver.memory=512m',
                  f'spark.driver.extraJavaOptions={spark_jvm_options}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'copying 2 fields' in result.stderr
    assert list(get_schema_from_dataset_url(target).fields) == ['id', 'kind']
    assert [(r['id'], r['kind']) for r in _rows(target)] == [(i, KINDS[i % 3]) for i in range(24)]


def test_spark_side_modules_import_without_loading_pyspark():
    modules = ['petastorm.etl.dataset_metadata', 'petastorm.etl.materialize', 'petastorm.spark_utils',
               'petastorm.etl.petastorm_generate_metadata', 'petastorm.tools.copy_dataset',
               'petastorm.tools.spark_session_cli']
    code = f'import sys\nfor m in {modules!r}: __import__(m)\nprint(sorted(m for m in sys.modules if "pyspark" in m))'
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == '[]'
