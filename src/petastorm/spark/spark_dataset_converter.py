"""Spark DataFrames as PyTorch ``DataLoader`` s and TensorFlow datasets: ``make_spark_converter``.

``make_spark_converter(df)`` writes the DataFrame once as Parquet under the directory named by the Spark conf
``petastorm.spark.converter.parentCacheDirUrl`` and returns a :class:`SparkDatasetConverter`, a small picklable
handle on those files. Its ``make_torch_dataloader()`` / ``make_tf_dataset()`` context managers read them with
``make_batch_reader``; ``delete()`` removes them.

Example:
    >>> spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, 'file:///tmp/petastorm_cache')
    >>> converter = make_spark_converter(df)
    >>> with converter.make_torch_dataloader(batch_size=256, num_epochs=1) as loader:
    ...     for batch in loader:
    ...         train_step(batch['features'], batch['label'])
    >>> converter.delete()
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from petastorm._progress import SparkJobProgress, check_progress_argument
from petastorm.fs import display_url, normalize_dir_url
from petastorm.spark import cache_dir, loaders, session
from petastorm.spark.converter_cache import CacheEntry, ConverterCache
from petastorm.spark.dataframe_prep import DEFAULT_ROW_GROUP_SIZE_BYTES, ConversionOptions, prepare_dataframe

logger = logging.getLogger(__name__)

__all__ = ['DEFAULT_ROW_GROUP_SIZE_BYTES', 'SparkDatasetConverter', 'make_spark_converter',
           'register_delete_dir_handler']

#: How long the loaders wait for the converter's files to be visible (object stores may list them late).
_FILE_AVAILABILITY_WAIT_TIMEOUT_SECS = 30


class SparkDatasetConverter:
    """The Parquet copy of a DataFrame, and the loaders that read it.

    Made by :func:`make_spark_converter`. Picklable: a converter sent to another process (a Spark task, a
    training worker) reads the same files there.

    Attributes:
        cache_dir_url: the directory holding the files.
        file_urls: the Parquet files, sorted.
        dataset_size: the number of rows (also ``len(converter)``).
    """

    PARENT_CACHE_DIR_URL_CONF = cache_dir.PARENT_CACHE_DIR_URL_CONF

    def __init__(self, cache_dir_url: str, file_urls: list[str], dataset_size: int) -> None:
        self.cache_dir_url = cache_dir_url
        self.file_urls = list(file_urls)
        self.dataset_size = int(dataset_size)
        # Whether the files are a copy made by make_spark_converter (delete() removes it) or the caller's own
        # dataset given as a path (delete() leaves it alone).
        self._owns_directory = False
        self._cache: ConverterCache | None = None  # the session's cache; not sent along when pickled
        self._deleted = False  # delete() removed the files: loaders refuse at once instead of waiting for them

    @property
    def is_cached_copy(self) -> bool:
        """True for files written by :func:`make_spark_converter`; False for a dataset given by its URL."""
        return self._owns_directory

    def __len__(self) -> int:
        return self.dataset_size

    def __repr__(self) -> str:
        return (f'SparkDatasetConverter(cache_dir_url={display_url(self.cache_dir_url)!r}, '
                f'files={len(self.file_urls)}, dataset_size={self.dataset_size})')

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state['_cache'] = None
        return state

    def make_torch_dataloader(self, batch_size: int = 32, num_epochs: int | None = None,
                              workers_count: int | None = None, shuffling_queue_capacity: int = 0,
                              data_loader_fn: Callable | None = None,
                              **petastorm_reader_kwargs: Any) -> contextlib.AbstractContextManager:
        """A context manager giving a ``torch.utils.data.DataLoader`` over the converter's rows.

        Args:
            batch_size: rows per batch.
            num_epochs: passes over the data; None (the default) repeats forever, so stop iterating yourself.
            workers_count: reader threads; None means 4.
            shuffling_queue_capacity: 0 keeps the file order; otherwise rows are drawn at random from a buffer of
                about this many rows.
            data_loader_fn: called as ``data_loader_fn(reader=..., batch_size=..., shuffling_queue_capacity=...)``;
                None uses :class:`petastorm.pytorch.BatchedDataLoader` (batches cut from whole columns, dicts of
                tensors), or :class:`petastorm.pytorch.DataLoader` when a column holds strings or decimals.
            **petastorm_reader_kwargs: more ``make_batch_reader`` arguments (``cur_shard``, ``shard_count``,
                ``seed``, ``shuffle_row_groups``, ``reader_pool_type``, ``transform_spec``...), and the loaders'
                ``drop_last`` and ``bool_dtype`` (see :class:`petastorm.pytorch.DataLoader`), which go to the loader.

        Leaving the ``with`` block stops and joins the reader.
        """
        self._check_not_deleted()
        return loaders.torch_dataloader(self, batch_size, num_epochs, workers_count, shuffling_queue_capacity,
                                        data_loader_fn, petastorm_reader_kwargs, _FILE_AVAILABILITY_WAIT_TIMEOUT_SECS)

    def make_tf_dataset(self, batch_size: int | None = None, prefetch: int | None = None,
                        num_epochs: int | None = None, workers_count: int | None = None,
                        shuffling_queue_capacity: int | None = None,
                        **petastorm_reader_kwargs: Any) -> contextlib.AbstractContextManager:
        """A context manager giving a ``tf.data.Dataset`` of batches (named tuples of tensors) of the rows.

        Args:
            batch_size: rows per batch; None means 32.
            prefetch: batches prefetched; None lets TensorFlow tune it (``tf.data.AUTOTUNE``).
            num_epochs: passes over the data; None repeats forever.
            workers_count: reader threads; None means 4.
            shuffling_queue_capacity: rows of the shuffling buffer; None or 0 keeps the file order.
            **petastorm_reader_kwargs: more ``make_batch_reader`` arguments.

        The dataset is built through ``tf.compat.v1.data`` (as :func:`petastorm.tf_utils.make_petastorm_dataset`):
        TF2 code iterates it or hands it to Keras, and TF1 graph code reads it with
        ``dataset.make_one_shot_iterator().get_next()`` in a ``tf.compat.v1.Session``, both inside the ``with``
        block. Leaving the ``with`` block stops and joins the reader.
        """
        self._check_not_deleted()
        return loaders.tf_dataset(self, batch_size, prefetch, num_epochs, workers_count, shuffling_queue_capacity,
                                  petastorm_reader_kwargs, _FILE_AVAILABILITY_WAIT_TIMEOUT_SECS)

    def delete(self) -> None:
        """Delete the cached files, and forget them so that the same DataFrame is written again if converted.

        A converter made from a path to an existing dataset leaves that dataset in place.
        """
        if not self.is_cached_copy:
            logger.warning('%s is the dataset the converter was made from, not a copy: delete() leaves it in place',
                           display_url(self.cache_dir_url))
            return
        if self._cache is not None:
            self._cache.delete(self.cache_dir_url)
        else:
            cache_dir.delete_dir(self.cache_dir_url)
        self._deleted = True

    def _check_not_deleted(self) -> None:
        """Refuse at once to read a copy that ``delete()`` removed (through this converter or an equal one)."""
        forgotten = self._owns_directory and self._cache is not None and not self._cache.created_here(
            self.cache_dir_url)
        if getattr(self, '_deleted', False) or forgotten:
            raise RuntimeError(f'this SparkDatasetConverter was deleted: delete() removed its copy of the DataFrame '
                               f'at {display_url(self.cache_dir_url)}. Make a new converter with '
                               f'make_spark_converter(df) to read the DataFrame again')


def make_spark_converter(df: Any, parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
                         compression_codec: str | None = None, dtype: str | None = 'float32', *,
                         progress: bool | None = None) -> SparkDatasetConverter:
    """Write a DataFrame once as Parquet under the parent cache directory and return a converter for it.

    The parent directory is the Spark conf ``SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF``
    (``'petastorm.spark.converter.parentCacheDirUrl'``): ``file:///...``, ``dbfs:/...``, ``hdfs://...``,
    ``s3://...``... Each DataFrame gets its own subdirectory. Converting a DataFrame with the same analyzed plan
    and the same arguments again in this session reuses the files written the first time.

    Before writing, Spark ML vector columns become arrays and floating point columns (also inside arrays) are cast
    to ``dtype``.

    Args:
        df: a ``pyspark.sql.DataFrame``; or the URL of an existing Parquet dataset, which is used as it is. A path
            without a scheme (``'/data/saved'``) means what it means to Spark: a path on its default filesystem.
        parquet_row_group_size_bytes: the Parquet row group size to write (``parquet.block.size``).
        compression_codec: ``'uncompressed'`` (None), ``'snappy'``, ``'gzip'``, ``'lz4'``, ``'lz4_raw'``,
            ``'zstd'`` or ``'brotli'``.
        dtype: ``'float32'`` (default), ``'float64'``, or None to keep the DataFrame's float types.
        progress: show the Spark tasks of the write: None (default) draws a ``tqdm`` bar when it is installed and
            stderr is a terminal (unless Spark draws its own console progress), else logs a line every few seconds;
            True always shows it; False never.

    Raises:
        ValueError: the parent cache directory conf is unset, has no scheme or is not a directory URL; or an
            argument is not supported (:class:`~petastorm.spark.dataframe_prep.ConverterOptionError`, also a
            ``RuntimeError``).
    """
    progress = check_progress_argument(progress)
    if isinstance(df, str):
        return _converter_for_dataset_url(df)
    spark = df.sparkSession
    parent = cache_dir.check_parent_cache_dir_url(spark.conf.get(cache_dir.PARENT_CACHE_DIR_URL_CONF, None))
    cache_dir.warn_if_local_dir_on_cluster(parent, _spark_master(spark), session.remote_connect_host(spark))
    options = ConversionOptions.validated(parent, parquet_row_group_size_bytes, compression_codec, dtype)
    cache = ConverterCache.of_session(spark)
    with cache.lock:
        plan_hash = df.semanticHash()
        entry = cache.find(df, plan_hash, options)
        if entry is None:
            entry = _materialize(df, plan_hash, options, cache, progress)
        else:
            logger.info('reusing the copy of an equal DataFrame at %s', display_url(entry.dir_url))
    converter = SparkDatasetConverter(entry.dir_url, entry.file_urls, entry.dataset_size)
    converter._owns_directory = True
    converter._cache = cache
    return converter


def _materialize(df: Any, plan_hash: int, options: ConversionOptions, cache: ConverterCache,
                 progress: bool | None = None) -> CacheEntry:
    spark = df.sparkSession
    dir_url = cache_dir.make_sub_dir_url(options.parent_dir_url, cache_dir.new_cache_dir_name(_application_id(spark)))
    cache.record_created(dir_url)  # before writing, so that exit also removes what a failed write left
    try:
        prepared = prepare_dataframe(df, options.dtype)
        logger.info('writing the DataFrame to %s', display_url(dir_url))
        with SparkJobProgress(spark, f'make_spark_converter: writing {display_url(dir_url)}', progress, logger):
            (prepared.write
             .option('compression', options.compression_codec)
             .option('parquet.block.size', options.row_group_size_bytes)
             .parquet(dir_url))
        file_urls, dataset_size, file_sizes = _describe(dir_url, spark)
    except BaseException:
        try:
            cache.delete(dir_url)
        except Exception as err:  # noqa: BLE001 - the write's own error is the one to raise
            logger.warning('could not remove the partly written %s: %s', display_url(dir_url), err)
        raise
    cache_dir.warn_if_files_small(dir_url, file_sizes)
    entry = CacheEntry(df, plan_hash, options, dir_url, file_urls, dataset_size)
    cache.add(entry)
    return entry


def _describe(dir_url: str, spark: Any) -> tuple[list[str], int, list[int]]:
    """Files and row count of a written directory: from the footers, or through Spark when we cannot read them."""
    try:
        store = cache_dir.describe_store(dir_url)
        return store.file_urls, store.dataset_size, store.file_sizes
    except (OSError, ImportError) as err:
        logger.info('listing %s directly failed (%s); asking Spark', display_url(dir_url), err)
    written = spark.read.parquet(dir_url)
    urls = sorted(_full_file_url(url) for url in written.inputFiles())
    return urls, written.count(), []


def _full_file_url(url: str) -> str:
    # Spark spells local files 'file:/x'; our readers want 'file:///x'.
    return 'file:///' + url[len('file:/'):].lstrip('/') if url.startswith('file:/') else url


def _converter_for_spark_path(path: str) -> SparkDatasetConverter:
    """A converter for a saved Parquet directory named by a scheme-less path.

    The path is qualified the way Spark qualifies it (against its default filesystem, ``file:`` in local mode),
    since Spark is what wrote and names such paths.
    """
    saved = _get_spark_session().read.parquet(path)
    files = list(saved.inputFiles())
    if not files:
        raise FileNotFoundError(f'make_spark_converter was given the path {path!r}, which holds no Parquet files')
    # The first file's URL is the directory's qualified URL, then the file's place inside it.
    marker = '/' + path.strip('/') + '/'
    at = files[0].rfind(marker)
    if at < 0:
        raise ValueError(f'make_spark_converter could not tell which URL Spark gives the path {path!r} (it lists '
                         f'{display_url(files[0])}); pass the dataset as a URL with a scheme, e.g. file:///...')
    dir_url = cache_dir.normalize_dbfs_url(_full_file_url(files[0][:at + len(marker) - 1]))
    file_urls = sorted(cache_dir.normalize_dbfs_url(_full_file_url(f)) for f in files)
    logger.info('make_spark_converter: the path %s is %s to Spark', path, display_url(dir_url))
    return SparkDatasetConverter(dir_url, file_urls, saved.count())


def _converter_for_dataset_url(url: str) -> SparkDatasetConverter:
    if not urlparse(url).scheme:
        return _converter_for_spark_path(url)
    dataset_url = normalize_dir_url(cache_dir.normalize_dbfs_url(url))
    try:
        store = cache_dir.describe_store(dataset_url)
        file_urls, dataset_size = store.file_urls, store.dataset_size
    except FileNotFoundError as err:
        # describe_store also raises this when a footer read fails (a file vanished mid-listing); only a missing
        # root earns the "no directory" message, any other keeps the original error, which names the file.
        if cache_dir.dir_exists(dataset_url):
            raise
        raise FileNotFoundError(f'make_spark_converter was given the dataset URL {display_url(url)!r}, but there is '
                                f'no directory there') from err
    except (OSError, ImportError) as err:
        logger.info('listing %s directly failed (%s); asking Spark', display_url(dataset_url), err)
        file_urls, dataset_size, _ = _describe(dataset_url, _get_spark_session())
    return SparkDatasetConverter(dataset_url, file_urls, dataset_size)


def _get_spark_session() -> Any:
    """The active SparkSession (made if there is none); refused inside a Spark task."""
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    if TaskContext.get() is not None:
        raise RuntimeError('make_spark_converter and register_delete_dir_handler run on the Spark driver, not '
                           'inside a Spark task')
    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def _spark_master(spark: Any) -> str | None:
    return session.spark_master(spark)


def _application_id(spark: Any) -> str | None:
    return session.application_id(spark)


def _is_spark_local_mode() -> bool:
    return (_spark_master(_get_spark_session()) or '').startswith('local')


def register_delete_dir_handler(handler: Callable[[str], None] | None) -> None:
    """Delete cache directories of the active session's converters with ``handler(dir_url)``.

    For storage the default (``pyarrow.fs`` through the URL's filesystem) cannot delete from. None restores it.
    """
    cache = ConverterCache.of_session(_get_spark_session())
    cache.delete_dir_handler = cache_dir.delete_dir if handler is None else handler


# Petastorm's private helper names, kept for code that imported them.
_make_sub_dir_url = cache_dir.make_sub_dir_url
_get_horovod_rank_and_size = loaders.horovod_rank_and_size
_check_rank_and_size_consistent_with_horovod = loaders.check_rank_and_size_consistent_with_horovod


def _wait_file_available(url_list: list[str]) -> None:
    cache_dir.wait_files_available(url_list, _FILE_AVAILABILITY_WAIT_TIMEOUT_SECS)

