"""make_spark_converter and SparkDatasetConverter: the seed's workflow, reuse, dtypes, vectors, errors, loaders,
pickling and the clean-up of cache directories at exit."""

import logging
import os
import pickle
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip('torch')
F = pytest.importorskip('pyspark.sql.functions')

from petastorm.errors import MissingDependencyError  # noqa: E402
from petastorm.spark import (  # noqa: E402
    SparkDatasetConverter,
    cache_dir,
    in_use,
    make_spark_converter,
    spark_dataset_converter,
)
from petastorm.spark.converter_cache import ConverterCache  # noqa: E402
from petastorm.spark.dataframe_prep import ConverterOptionError  # noqa: E402

CONF = SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF


@pytest.fixture
def cache_parent(spark, tmp_path):
    """The parent cache directory, set in the session conf for one test."""
    parent = tmp_path / 'converter_cache'
    spark.conf.set(CONF, f'file://{parent}')
    yield parent
    spark.conf.unset(CONF)


def _subdirs(parent):
    return sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.exists() else []


def _entries_under(spark, parent):
    """The session cache's entries for copies under ``parent`` (each test has its own parent)."""
    return [entry for entry in ConverterCache.of_session(spark).entries
            if entry.dir_url.startswith(f'file://{parent}/')]


def _scalars(spark, rows=100, partitions=2):
    """id bigint, d double, f float, arr array<double>: computed in the JVM (no Python workers)."""
    return spark.range(0, rows, 1, partitions).select(
        'id', (F.col('id') / 2).alias('d'), (F.col('id') * 3).cast('float').alias('f'),
        F.array(F.col('id').cast('double'), F.lit(0.5)).alias('arr'))


def _write_plain_dataset(directory, rows=40, files=2):
    """A Parquet store written by pyarrow: ``files`` files of ids and float32 values."""
    directory.mkdir()
    per_file = rows // files
    for k in range(files):
        ids = np.arange(k * per_file, (k + 1) * per_file, dtype=np.int64)
        pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), directory / f'part-{k}.parquet')
    return f'file://{directory}'


def _ids(converter, **kwargs):
    with converter.make_torch_dataloader(batch_size=7, num_epochs=1, **kwargs) as loader:
        return sorted(int(i) for batch in loader for i in batch['id'])


# ----------------------------------------------------------------------------------------------- the seed workflow

# The converter workflow of the project's seed description, verbatim (trailing spaces stripped); only the cache
# URL and the "df_train, df_test = ..." placeholder are replaced.
SEED_BLOCK = '''
from petastorm.spark import SparkDatasetConverter, make_spark_converter

# 1. Specify a cache directory
spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, 'hdfs:/...')

df_train, df_test = ...
model = Net()

# 2. Create converters
converter_train = make_spark_converter(df_train)
converter_test = make_spark_converter(df_test)

# 3. Use context managers for PyTorch DataLoaders
with converter_train.make_torch_dataloader() as dataloader_train:
    # dataloader_train is a torch.utils.data.DataLoader
    train(model, dataloader_train, ...)

with converter_test.make_torch_dataloader() as dataloader_test:
    test(model, dataloader_test, ...)

# 4. Clean up
converter_train.delete()
converter_test.delete()
'''


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.linear(x).squeeze(1)


@pytest.mark.spark
def test_seed_converter_workflow_runs_verbatim(spark, cache_parent):
    # label = x0 > x1: a linear model learns it. 300 train rows, 100 test rows.
    points = spark.range(0, 400, 1, 2).select(
        'id', F.rand(seed=1).alias('x0'), F.rand(seed=2).alias('x1'))
    rows = points.select('id', F.array('x0', 'x1').alias('features'),
                         (F.col('x0') > F.col('x1')).cast('double').alias('label'))
    df_train, df_test = rows.where(F.col('id') < 300), rows.where(F.col('id') >= 300)
    seen = {}

    def train(model, loader, *_):
        seen['train_loader'] = loader
        seen['train_dir'] = _subdirs(cache_parent)
        torch.manual_seed(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        for step, batch in enumerate(loader):  # the loader repeats forever (num_epochs=None)
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch['features']), batch['label'])
            loss.backward()
            optimizer.step()
            if step == 200:
                break

    def test(model, loader, *_):
        seen['test_loader'] = loader
        correct = total = 0
        with torch.no_grad():
            for step, batch in enumerate(loader):
                correct += int(((model(batch['features']) > 0) == (batch['label'] > 0.5)).sum())
                total += len(batch['label'])
                if step == 3:
                    break
        seen['accuracy'] = correct / total

    block = SEED_BLOCK.replace("'hdfs:/...'", repr(f'file://{cache_parent}')).replace(
        'df_train, df_test = ...', 'df_train, df_test = dataframes')
    namespace = {'spark': spark, 'dataframes': (df_train, df_test), 'Net': _Net, 'train': train, 'test': test}
    exec(block, namespace)  # noqa: S102

    assert isinstance(seen['train_loader'], torch.utils.data.DataLoader)
    assert isinstance(seen['test_loader'], torch.utils.data.DataLoader)
    assert len(seen['train_dir']) == 2  # one cached copy per DataFrame
    assert len(namespace['converter_train']) == 300
    assert len(namespace['converter_test']) == 100
    assert seen['accuracy'] > 0.8
    assert _subdirs(cache_parent) == []  # delete() removed both copies


# ------------------------------------------------------------------------------------------ materialization, reuse

@pytest.mark.spark
def test_converter_files_and_len_match_the_dataframe(spark, cache_parent):
    converter = make_spark_converter(_scalars(spark, rows=100, partitions=2))
    try:
        assert len(converter) == converter.dataset_size == 100
        assert converter.cache_dir_url.startswith(f'file://{cache_parent}/')
        assert converter.file_urls == sorted(converter.file_urls)
        assert len(converter.file_urls) == 2
        paths = [url[len('file://'):] for url in converter.file_urls]
        assert all(os.path.exists(path) and path.endswith('.parquet') for path in paths)
        table = pa.concat_tables(pq.read_table(path) for path in paths)
        assert sorted(table.column('id').to_pylist()) == list(range(100))
        # default dtype float32: doubles (also inside arrays) are cast, floats stay
        assert table.schema.field('d').type == pa.float32()
        assert table.schema.field('f').type == pa.float32()
        assert table.schema.field('arr').type.value_type == pa.float32()
        with converter.make_torch_dataloader(batch_size=7, num_epochs=1) as loader:
            # while open, the loader marks the copy as read by this process
            assert [m.pid for m in in_use.markers(*_fs_and_path(converter))] == [os.getpid()]
            assert sorted(int(i) for batch in loader for i in batch['id']) == list(range(100))
        assert in_use.markers(*_fs_and_path(converter)) == []
    finally:
        converter.delete()
    assert not os.path.exists(converter.cache_dir_url[len('file://'):])


@pytest.mark.spark
def test_equal_dataframes_reuse_one_copy_until_deleted(spark, cache_parent):
    first = make_spark_converter(_scalars(spark))
    again = make_spark_converter(_scalars(spark))  # built again: same analyzed plan
    assert again.cache_dir_url == first.cache_dir_url
    assert again.file_urls == first.file_urls
    other_rows = make_spark_converter(_scalars(spark, rows=50))
    other_dtype = make_spark_converter(_scalars(spark), dtype='float64')
    other_size = make_spark_converter(_scalars(spark), parquet_row_group_size_bytes=1024 * 1024)
    other_codec = make_spark_converter(_scalars(spark), compression_codec='SNAPPY')
    urls = {c.cache_dir_url for c in (first, other_rows, other_dtype, other_size, other_codec)}
    assert len(urls) == 5
    assert len(_subdirs(cache_parent)) == 5
    assert pq.ParquetFile(other_codec.file_urls[0][len('file://'):]).metadata.row_group(0).column(0).compression \
        == 'SNAPPY'

    first.delete()
    rewritten = make_spark_converter(_scalars(spark))
    assert rewritten.cache_dir_url != first.cache_dir_url
    for converter in (rewritten, other_rows, other_dtype, other_size, other_codec):
        converter.delete()
    assert _subdirs(cache_parent) == []
    assert _entries_under(spark, cache_parent) == []


@pytest.mark.spark
def test_copy_deleted_behind_our_back_is_written_again(spark, cache_parent, caplog):
    import shutil

    first = make_spark_converter(_scalars(spark, rows=30))
    shutil.rmtree(first.cache_dir_url[len('file://'):])
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        second = make_spark_converter(_scalars(spark, rows=30))
    assert second.cache_dir_url != first.cache_dir_url
    assert len(second) == 30
    assert 'deleted outside petastorm' in caplog.text
    second.delete()


@pytest.mark.spark
def test_dtype_float64_and_none(spark, cache_parent):
    df = _scalars(spark, rows=10, partitions=1)
    up = make_spark_converter(df, dtype='float64')
    kept = make_spark_converter(df, dtype=None)
    try:
        up_schema = pq.read_schema(up.file_urls[0][len('file://'):])
        assert up_schema.field('f').type == pa.float64()
        assert up_schema.field('d').type == pa.float64()
        kept_schema = pq.read_schema(kept.file_urls[0][len('file://'):])
        assert kept_schema.field('f').type == pa.float32()
        assert kept_schema.field('d').type == pa.float64()
        assert kept_schema.field('arr').type.value_type == pa.float64()
        with up.make_torch_dataloader(batch_size=10, num_epochs=1) as loader:
            batch = next(iter(loader))
        assert batch['f'].dtype == torch.float64
        assert batch['arr'].shape == (10, 2)
    finally:
        up.delete()
        kept.delete()


@pytest.mark.spark
def test_vectors_become_arrays_of_the_dtype(spark, cache_parent):
    ml_functions = pytest.importorskip('pyspark.ml.functions')
    df = spark.range(0, 12, 1, 1).select(
        'id', ml_functions.array_to_vector(F.array(F.col('id').cast('double'), F.lit(1.5))).alias('vec'))
    assert type(df.schema['vec'].dataType).__name__ == 'VectorUDT'
    as_float = make_spark_converter(df)
    as_double = make_spark_converter(df, dtype=None)
    try:
        with as_float.make_torch_dataloader(batch_size=12, num_epochs=1) as loader:
            batch = next(iter(loader))
        assert batch['vec'].dtype == torch.float32
        assert batch['vec'].shape == (12, 2)
        order = torch.argsort(batch['id'])
        np.testing.assert_array_equal(batch['vec'][order].numpy(),
                                      np.stack([np.arange(12), np.full(12, 1.5)], axis=1).astype(np.float32))
        schema = pq.read_schema(as_double.file_urls[0][len('file://'):])
        assert schema.field('vec').type.value_type == pa.float64()
    finally:
        as_float.delete()
        as_double.delete()


@pytest.mark.spark
def test_string_columns_use_the_row_collating_loader(spark, cache_parent):
    df = spark.range(0, 8, 1, 1).select('id', F.concat(F.lit('n'), F.col('id').cast('string')).alias('name'))
    converter = make_spark_converter(df)
    try:
        with converter.make_torch_dataloader(batch_size=8, num_epochs=1) as loader:
            batch = next(iter(loader))
        assert sorted(batch['name']) == [f'n{i}' for i in range(8)]
        with converter.make_torch_dataloader(batch_size=8, num_epochs=1, schema_fields=['id']) as loader:
            assert type(loader).__name__ == 'BatchedDataLoader'
    finally:
        converter.delete()


@pytest.mark.spark
def test_empty_dataframe_with_a_dotted_column_name(spark, cache_parent):
    converter = make_spark_converter(spark.range(0).select(F.col('id').cast('double').alias('a.b')))
    try:
        assert len(converter) == 0
        assert converter.file_urls
        assert pq.read_schema(converter.file_urls[0][len('file://'):]).field('a.b').type == pa.float32()
    finally:
        converter.delete()


# -------------------------------------------------------------------------------------------------------- errors

@pytest.mark.spark
def test_unset_parent_cache_dir_is_a_clear_error(spark):
    spark.conf.unset(CONF)
    with pytest.raises(ValueError, match='Please set the spark config petastorm.spark.converter.parentCacheDirUrl'):
        make_spark_converter(spark.range(3))


@pytest.mark.parametrize(('value', 'message'), [
    ('/tmp/cache', r"scheme-less.*'file:///tmp/cache'"),
    ('tmp/cache', r"scheme-less.*'file:///tmp/cache'"),
    ('file://otherhost/tmp/cache', 'names the host'),
    ('file:///', 'absolute directory'),
    ('   ', 'Please set the spark config'),
])
def test_invalid_parent_cache_dir_urls(value, message):
    with pytest.raises(ValueError, match=message):
        cache_dir.check_parent_cache_dir_url(value)


@pytest.mark.parametrize(('value', 'normalized'), [
    ('file:///tmp/cache/', 'file:///tmp/cache'),
    ('dbfs:/ml/cache', 'file:///dbfs/ml/cache'),
    ('dbfs:///ml/cache', 'file:///dbfs/ml/cache'),
    ('file:/dbfs/ml/cache', 'file:///dbfs/ml/cache'),
    ('file:///dbfs/ml/cache', 'file:///dbfs/ml/cache'),
    ('s3://bucket/cache', 's3://bucket/cache'),
    ('hdfs://namenode:8020/cache', 'hdfs://namenode:8020/cache'),
])
def test_valid_parent_cache_dir_urls(value, normalized):
    assert cache_dir.check_parent_cache_dir_url(value) == normalized


def test_local_cache_dir_on_a_cluster_warns(caplog):
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        cache_dir.warn_if_local_dir_on_cluster('file:///tmp/cache', 'yarn')
        cache_dir.warn_if_local_dir_on_cluster('file:///dbfs/cache', 'yarn')
        cache_dir.warn_if_local_dir_on_cluster('file:///tmp/cache', 'local[2]')
    assert len(caplog.records) == 1
    assert 'file:///tmp/cache' in caplog.text
    assert "'yarn'" in caplog.text


@pytest.mark.spark
@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'dtype': 'float16'}, r"^dtype float16 is not supported\. +Use 'float32' or float64"),
    ({'dtype': 'int32'}, 'is not supported'),
    ({'compression_codec': 'bzip2'}, "compression_codec 'bzip2' is not supported"),
    ({'parquet_row_group_size_bytes': 0}, 'positive integer'),
    ({'parquet_row_group_size_bytes': '32MB'}, 'positive integer'),
])
def test_invalid_arguments_are_refused_before_writing(spark, cache_parent, kwargs, message):
    with pytest.raises(ConverterOptionError, match=message) as raised:
        make_spark_converter(spark.range(3), **kwargs)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, RuntimeError)
    assert _subdirs(cache_parent) == []


@pytest.mark.spark
def test_failed_write_leaves_nothing_behind(spark, cache_parent):
    failing = spark.range(0, 10, 1, 1).select(F.assert_true(F.col('id') < 5).alias('checked'))
    with pytest.raises(Exception, match='id < 5'):
        make_spark_converter(failing)
    assert _subdirs(cache_parent) == []
    assert _entries_under(spark, cache_parent) == []


# ------------------------------------------------------------------------------------------------------ loaders

def test_converter_from_a_dataset_url_reads_it_and_delete_keeps_it(tmp_path, caplog):
    url = _write_plain_dataset(tmp_path / 'plain')
    converter = make_spark_converter(url + '/')
    assert converter.cache_dir_url == url
    assert len(converter) == 40
    assert len(converter.file_urls) == 2
    assert _ids(converter) == list(range(40))
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        converter.delete()
    assert (tmp_path / 'plain' / 'part-0.parquet').exists()
    assert 'leaves it in place' in caplog.text


def test_dataset_url_with_nothing_there_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset URL 'file://.*/missing', but there is no directory"):
        make_spark_converter(f'file://{tmp_path}/missing')


@pytest.mark.spark
def test_scheme_less_path_is_qualified_as_spark_does(spark, tmp_path):
    # A saved DataFrame named by its bare path, as Spark users name it: Spark's default filesystem (file: here).
    saved = tmp_path / 'saved'
    spark.range(100, 110, 1, 2).write.parquet(str(saved))
    converter = make_spark_converter(str(saved))
    assert converter.cache_dir_url == f'file://{saved}'
    assert len(converter) == 10
    assert all(u.startswith(f'file://{saved}/part-') for u in converter.file_urls)
    assert len(converter.file_urls) == 2
    assert _ids(converter) == list(range(100, 110))
    with pytest.raises(Exception, match='PATH_NOT_FOUND|does not exist'):
        make_spark_converter(str(tmp_path / 'missing'))


def test_dataset_url_whose_file_vanishes_keeps_the_original_error(tmp_path, monkeypatch):
    url = _write_plain_dataset(tmp_path / 'plain')

    def footer_read_fails(dir_url):
        raise FileNotFoundError(f'{tmp_path}/plain/part-1.parquet')  # as when a file vanishes after the listing

    monkeypatch.setattr(cache_dir, 'describe_store', footer_read_fails)
    with pytest.raises(FileNotFoundError, match=r'plain/part-1\.parquet') as raised:
        make_spark_converter(url)
    assert 'no directory' not in str(raised.value)


def test_torch_dataloader_defaults_and_reader_kwargs(tmp_path):
    converter = make_spark_converter(_write_plain_dataset(tmp_path / 'plain'))
    with converter.make_torch_dataloader() as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert type(loader).__name__ == 'BatchedDataLoader'
        assert loader.batch_size == 32
        assert loader.reader.diagnostics['workers_count'] == 4
        # num_epochs=None repeats forever: read more than three passes
        seen = []
        for batch in loader:
            seen.extend(int(i) for i in batch['id'])
            if len(seen) >= 130:
                break
        assert sorted(seen[:40]) == list(range(40))
        assert list((tmp_path / 'plain').glob('_*')) == []  # the caller's own dataset gets no in-use marker
    assert loader.reader.stopped

    shards = [_ids(converter, cur_shard=k, shard_count=2, workers_count=1) for k in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(40))
    with pytest.raises(TypeError, match='no_such_option'), converter.make_torch_dataloader(no_such_option=1):
        pass


def test_torch_dataloader_passes_drop_last_and_bool_dtype_to_the_loader(tmp_path):
    converter = make_spark_converter(_write_plain_dataset(tmp_path / 'plain'))
    with converter.make_torch_dataloader(batch_size=7, num_epochs=1, drop_last=True, bool_dtype=torch.bool,
                                         cur_shard=0, shard_count=2, shard_mode='rows', seed=1) as loader:
        assert (loader.drop_last, loader.bool_dtype) == (True, torch.bool)
        sizes = [len(batch['id']) for batch in loader]
    assert sizes == [7, 7]  # 20 rows of this rank's share: the short batch of 6 is left out
    assert len(loader) == 2


def _fs_and_path(converter):
    from petastorm.fs import resolve_url

    return resolve_url(converter.cache_dir_url)


def test_custom_data_loader_fn_gets_the_reader_and_batch_options(tmp_path):
    from petastorm.pytorch import DataLoader

    converter = make_spark_converter(_write_plain_dataset(tmp_path / 'plain'))
    calls = []

    def data_loader_fn(reader, batch_size, shuffling_queue_capacity):
        calls.append((batch_size, shuffling_queue_capacity))
        return DataLoader(reader, batch_size=batch_size, shuffling_queue_capacity=shuffling_queue_capacity)

    with converter.make_torch_dataloader(batch_size=5, num_epochs=1, shuffling_queue_capacity=16,
                                         data_loader_fn=data_loader_fn, seed=3) as loader:
        ids = sorted(int(i) for batch in loader for i in batch['id'])
    assert calls == [(5, 16)]
    assert ids == list(range(40))


def test_horovod_rank_mismatch_warns(tmp_path, monkeypatch, caplog):
    converter = make_spark_converter(_write_plain_dataset(tmp_path / 'plain'))
    monkeypatch.setenv('OMPI_COMM_WORLD_RANK', '1')
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '2')
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        assert _ids(converter, cur_shard=1, shard_count=2) != []
        assert caplog.text == ''
        _ids(converter)
    assert 'rank 1 of 2' in caplog.text
    assert 'cur_shard=1, shard_count=2' in caplog.text


def test_missing_files_time_out_with_their_urls(tmp_path, monkeypatch):
    converter = make_spark_converter(_write_plain_dataset(tmp_path / 'plain'))
    (tmp_path / 'plain' / 'part-1.parquet').unlink()
    monkeypatch.setattr(spark_dataset_converter, '_FILE_AVAILABILITY_WAIT_TIMEOUT_SECS', 0.3)
    with pytest.raises(RuntimeError, match=r'Timeout while waiting .*part-1\.parquet'), \
            converter.make_torch_dataloader(num_epochs=1):
        pass


@pytest.mark.spark
def test_a_deleted_converter_refuses_at_once_and_so_does_an_equal_one(spark, cache_parent, monkeypatch):
    import time

    first = make_spark_converter(_scalars(spark, rows=20))
    again = make_spark_converter(_scalars(spark, rows=20))  # the same copy
    first.delete()
    monkeypatch.setattr(spark_dataset_converter, '_FILE_AVAILABILITY_WAIT_TIMEOUT_SECS', 5)
    for converter in (first, again, pickle.loads(pickle.dumps(first))):
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r'this SparkDatasetConverter was deleted: delete\(\) removed its copy '
                                               r'.*make_spark_converter\(df\)'), \
                converter.make_torch_dataloader(num_epochs=1):
            pass
        with pytest.raises(RuntimeError, match='this SparkDatasetConverter was deleted'), \
                converter.make_tf_dataset(num_epochs=1):
            pass
        assert time.monotonic() - started < 1


def test_make_tf_dataset_without_tensorflow_names_the_extra(monkeypatch):
    import importlib.util

    if importlib.util.find_spec('tensorflow') is not None:
        pytest.skip('TensorFlow is installed; the TensorFlow tests cover make_tf_dataset')
    monkeypatch.setitem(sys.modules, 'tensorflow', None)
    converter = SparkDatasetConverter('file:///nowhere', ['file:///nowhere/part-0.parquet'], 1)
    with pytest.raises(MissingDependencyError, match=r"petastorm\[tf\]"), converter.make_tf_dataset():
        pass


# ------------------------------------------------------------------------------------- pickling and clean-up

@pytest.mark.spark
@pytest.mark.slow  # a fresh interpreter imports torch
def test_pickled_converter_reads_in_another_process_which_deletes_nothing_at_exit(spark, cache_parent, tmp_path):
    converter = make_spark_converter(_scalars(spark, rows=60))
    copy = pickle.loads(pickle.dumps(converter))
    assert (copy.cache_dir_url, copy.file_urls, len(copy)) == (converter.cache_dir_url, converter.file_urls, 60)
    pickled = tmp_path / 'converter.pkl'
    pickled.write_bytes(pickle.dumps(converter))
    script = textwrap.dedent(f'''
        import pickle
        converter = pickle.loads(open({str(pickled)!r}, 'rb').read())
        with converter.make_torch_dataloader(batch_size=16, num_epochs=1) as loader:
            print(sum(int(batch['id'].sum()) for batch in loader))
    ''')
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == sum(range(60))
    assert os.path.isdir(converter.cache_dir_url[len('file://'):])  # the reader's exit left the copy alone
    copy.delete()  # a pickled copy deletes the files too
    assert not os.path.exists(converter.cache_dir_url[len('file://'):])


@pytest.mark.spark
def test_make_spark_converter_registers_its_directory_for_exit(spark, cache_parent):
    converter = make_spark_converter(_scalars(spark, rows=5))
    cache = ConverterCache.of_session(spark)
    assert cache.created_here(converter.cache_dir_url)
    converter.delete()
    assert not cache.created_here(converter.cache_dir_url)


_EXIT_SCRIPT = '''
import sys
from petastorm.spark.converter_cache import ConverterCache
cache = ConverterCache()
for url in sys.argv[1:]:
    cache.record_created(url)
'''


def _cache_dir(parent, name):
    directory = parent / name
    directory.mkdir(parents=True)
    (directory / 'part-0.parquet').write_bytes(b'data')
    return directory, f'file://{directory}'


def test_exit_removes_undeleted_directories_except_those_other_processes_read(tmp_path):
    abandoned, abandoned_url = _cache_dir(tmp_path, 'abandoned')
    read_here, read_here_url = _cache_dir(tmp_path, 'read_here')
    stale, stale_url = _cache_dir(tmp_path, 'stale')
    # a marker of a process of this host that has ended does not protect a directory
    ended = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True,
                           check=True)
    (stale / f'{in_use.MARKER_PREFIX}{ended.stdout.strip()}-abc@{socket.gethostname()}').write_bytes(b'')
    with in_use.reading(read_here_url):  # this test process reads it while the creator exits
        done = subprocess.run([sys.executable, '-c', _EXIT_SCRIPT, abandoned_url, read_here_url, stale_url],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert not abandoned.exists()
        assert not stale.exists()
        assert (read_here / 'part-0.parquet').exists()
        assert 'still read it' in done.stderr
        assert (read_here / in_use.DELETE_WHEN_UNUSED).exists()
    assert not read_here.exists()  # handed over: the last reader deleted it when done


def test_a_handed_over_directory_waits_for_its_last_reader(tmp_path):
    directory, url = _cache_dir(tmp_path, 'two_readers')
    with in_use.reading(url):
        with in_use.reading(url):
            (directory / in_use.DELETE_WHEN_UNUSED).write_bytes(b'')  # as the exiting creator does
        assert directory.exists()  # another reader (of this process) is still open
    assert not directory.exists()


def test_a_handed_over_directory_that_cannot_be_deleted_is_warned_about(tmp_path, monkeypatch, caplog):
    directory, url = _cache_dir(tmp_path, 'undeletable')

    def refuse(dir_url):
        raise PermissionError(f'cannot delete {dir_url}')

    monkeypatch.setattr(cache_dir, 'delete_dir', refuse)
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'), in_use.reading(url):
        (directory / in_use.DELETE_WHEN_UNUSED).write_bytes(b'')
    assert directory.exists()
    assert f'could not delete converter cache {url}' in caplog.text


def test_markers_of_other_hosts_count_as_live(tmp_path):
    directory, url = _cache_dir(tmp_path, 'remote_reader')
    (directory / f'{in_use.MARKER_PREFIX}1-abc@some-other-host').write_bytes(b'')
    assert [(m.pid, m.host) for m in in_use.other_live_readers(url)] == [(1, 'some-other-host')]


def test_a_forked_child_never_cleans_its_parents_directories(tmp_path):
    directory, url = _cache_dir(tmp_path, 'parents')
    cache = ConverterCache()
    cache.record_created(url)
    cache._creator_pid = os.getpid() + 1  # as a child process sees the hook it inherited
    cache.cleanup_at_exit()
    assert directory.exists()
    cache.forget(url)


@pytest.mark.spark
def test_registered_delete_handler_is_used(spark, cache_parent):
    deleted = []
    spark_dataset_converter.register_delete_dir_handler(deleted.append)
    try:
        converter = make_spark_converter(_scalars(spark, rows=5))
        converter.delete()
    finally:
        spark_dataset_converter.register_delete_dir_handler(None)
    assert deleted == [converter.cache_dir_url]
    cache_dir.delete_dir(converter.cache_dir_url)


def test_importing_the_package_loads_no_framework():
    code = ('import sys, petastorm.spark\n'
            'print(",".join(m for m in sys.modules if m.split(".")[0] in ("torch", "pyspark", "tensorflow")))')
    loaded = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ''


def test_converter_repr_and_package_exports():
    import petastorm.spark as package

    assert package.__all__ == ['SparkDatasetConverter', 'make_spark_converter']
    assert CONF == 'petastorm.spark.converter.parentCacheDirUrl'
    converter = SparkDatasetConverter('file:///c/d', ['file:///c/d/a.parquet'], 3)
    assert repr(converter) == "SparkDatasetConverter(cache_dir_url='file:///c/d', files=1, dataset_size=3)"
