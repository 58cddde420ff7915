"""SparkDatasetConverter's loaders and life cycle: dataset URLs, torch arguments, pickling, the clean-up at exit."""

import logging
import os
import pickle
import socket
import subprocess
import sys
import textwrap

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
from support.spark_converters import CONF, converter_ids, scalars_frame, write_plain_dataset  # noqa: E402

# ------------------------------------------------------------------------------------------------------ loaders

def test_converter_from_a_dataset_url_reads_it_and_delete_keeps_it(tmp_path, caplog):
    url = write_plain_dataset(tmp_path / 'plain')
    converter = make_spark_converter(url + '/')
    assert converter.cache_dir_url == url
    assert len(converter) == 40
    assert len(converter.file_urls) == 2
    assert converter_ids(converter) == list(range(40))
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
    assert converter_ids(converter) == list(range(100, 110))
    with pytest.raises(Exception, match='PATH_NOT_FOUND|does not exist'):
        make_spark_converter(str(tmp_path / 'missing'))


def test_dataset_url_whose_file_vanishes_keeps_the_original_error(tmp_path, monkeypatch):
    url = write_plain_dataset(tmp_path / 'plain')

    def footer_read_fails(dir_url):
        raise FileNotFoundError(f'{tmp_path}/plain/part-1.parquet')  # as when a file vanishes after the listing

    monkeypatch.setattr(cache_dir, 'describe_store', footer_read_fails)
    with pytest.raises(FileNotFoundError, match=r'plain/part-1\.parquet') as raised:
        make_spark_converter(url)
    assert 'no directory' not in str(raised.value)


def test_torch_dataloader_defaults_and_reader_kwargs(tmp_path):
    converter = make_spark_converter(write_plain_dataset(tmp_path / 'plain'))
    with converter.make_torch_dataloader() as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert type(loader).__name__ == 'BatchedDataLoader'
        assert loader.batch_size == 32
        assert loader.reader.diagnostics['workers_count'] == 4
        with pytest.raises(TypeError, match=r"repeats forever \(num_epochs=None, also the default of a Spark "
                                            r"converter's make_torch_dataloader\)\. Pass num_epochs=1 "
                                            r'\(make_torch_dataloader\(num_epochs=1\)'):
            len(loader)
        # num_epochs=None repeats forever: read more than three passes
        seen = []
        for batch in loader:
            seen.extend(int(i) for i in batch['id'])
            if len(seen) >= 130:
                break
        assert sorted(seen[:40]) == list(range(40))
        assert list((tmp_path / 'plain').glob('_*')) == []  # the caller's own dataset gets no in-use marker
    assert loader.reader.stopped

    shards = [converter_ids(converter, cur_shard=k, shard_count=2, workers_count=1) for k in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(40))
    with pytest.raises(TypeError, match='no_such_option'), converter.make_torch_dataloader(no_such_option=1):
        pass


def test_torch_dataloader_passes_drop_last_and_bool_dtype_to_the_loader(tmp_path):
    converter = make_spark_converter(write_plain_dataset(tmp_path / 'plain'))
    with converter.make_torch_dataloader(batch_size=7, num_epochs=1, drop_last=True, bool_dtype=torch.bool,
                                         cur_shard=0, shard_count=2, shard_mode='rows', seed=1) as loader:
        assert (loader.drop_last, loader.bool_dtype) == (True, torch.bool)
        sizes = [len(batch['id']) for batch in loader]
    assert sizes == [7, 7]  # 20 rows of this rank's share: the short batch of 6 is left out
    assert len(loader) == 2


def test_custom_data_loader_fn_gets_the_reader_and_batch_options(tmp_path):
    from petastorm.pytorch import DataLoader

    converter = make_spark_converter(write_plain_dataset(tmp_path / 'plain'))
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
    converter = make_spark_converter(write_plain_dataset(tmp_path / 'plain'))
    monkeypatch.setenv('OMPI_COMM_WORLD_RANK', '1')
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '2')
    with caplog.at_level(logging.WARNING, logger='petastorm.spark'):
        assert converter_ids(converter, cur_shard=1, shard_count=2) != []
        assert caplog.text == ''
        converter_ids(converter)
    assert 'rank 1 of 2' in caplog.text
    assert 'cur_shard=1, shard_count=2' in caplog.text


def test_missing_files_time_out_with_their_urls(tmp_path, monkeypatch):
    converter = make_spark_converter(write_plain_dataset(tmp_path / 'plain'))
    (tmp_path / 'plain' / 'part-1.parquet').unlink()
    monkeypatch.setattr(spark_dataset_converter, '_FILE_AVAILABILITY_WAIT_TIMEOUT_SECS', 0.3)
    with pytest.raises(RuntimeError, match=r'Timeout while waiting .*part-1\.parquet'), \
            converter.make_torch_dataloader(num_epochs=1):
        pass


@pytest.mark.spark
def test_a_deleted_converter_refuses_at_once_and_so_does_an_equal_one(spark, cache_parent, monkeypatch):
    import time

    first = make_spark_converter(scalars_frame(spark, rows=20))
    again = make_spark_converter(scalars_frame(spark, rows=20))  # the same copy
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
    converter = make_spark_converter(scalars_frame(spark, rows=60))
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
    converter = make_spark_converter(scalars_frame(spark, rows=5))
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
        converter = make_spark_converter(scalars_frame(spark, rows=5))
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
