"""``materialize_dataset``: wrap a Spark write so that its output becomes a Petastorm dataset.

Example::

    with materialize_dataset(spark, url, HelloWorldSchema, row_group_size_mb=256):
        rows = sc.parallelize(range(10)).map(row_generator).map(lambda r: dict_to_spark_row(HelloWorldSchema, r))
        spark.createDataFrame(rows, HelloWorldSchema.as_spark_schema()).write.mode('overwrite').parquet(url)

Before the body runs, the Parquet writer settings of the session are adjusted (row-group size, summary files,
timestamp encoding); after the body, the schema and the row-group map are written to ``_common_metadata``
with the same code the Spark-free writer uses, so datasets written either way are interchangeable. The
session's settings are restored whatever happens. pyspark is never imported here: the session object the
caller passes in is all we touch.

A classic session gets the Parquet settings in its Hadoop configuration, as Petastorm set them. A Spark Connect
session has no Hadoop configuration the client can reach, so they are set as session confs instead: Spark copies
every session conf into the Hadoop configuration of each file write, where the Parquet writer finds them. The
metadata is written afterwards from this process, through our filesystem layer, in both cases.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import counted
from petastorm._warnings import warn_user
from petastorm.errors import PetastormMetadataGenerationError
from petastorm.fs import resolve_url
from petastorm.metadata.write import write_dataset_metadata
from petastorm.spark.session import is_connect_session
from petastorm.store.listing import SUMMARY_METADATA, list_data_files
from petastorm.unischema import Unischema

__all__ = ['check_workers_python', 'materialize_dataset', 'row_groups_from_summary', 'write_petastorm_metadata']

logger = logging.getLogger(__name__)

_MB = 1024 * 1024

# parquet-mr checks the buffered size of a row group only every N rows (100 at first). Checking from the third
# row on lets row groups of large rows (images, tensors) be flushed near the requested size. parquet-mr 1.17
# takes N from the page-size key; the two row-group keys are the ones Petastorm set, kept for other versions.
_ROW_CHECK_MIN = '3'
_ROW_CHECK_KEYS = ('parquet.page.size.row.check.min', 'parquet.block.size.row.check.min',
                   'parquet.row-group.size.row.check.min')

# Spark's default, INT96, is a deprecated Parquet type that pyarrow reads as nanoseconds without a time zone.
# Microseconds adjusted to UTC is what the Spark-free writer stores, so both writers produce identical columns.
_TIMESTAMP_TYPE_CONF = 'spark.sql.parquet.outputTimestampType'


@dataclass(frozen=True)
class _SavedSetting:
    key: str
    previous: str | None


def _hadoop_configuration(spark: Any) -> Any:
    try:
        return spark.sparkContext._jsc.hadoopConfiguration()
    except Exception as err:  # an object that is neither kind of SparkSession
        raise TypeError(f'materialize_dataset needs a pyspark SparkSession (classic or Spark Connect); got '
                        f'{type(spark).__name__} ({err})') from err


def _parquet_settings(row_group_size_mb: float | None, use_summary_metadata: bool) -> dict[str, str]:
    settings = {
        'parquet.summary.metadata.level': 'ALL' if use_summary_metadata else 'NONE',
        'parquet.summary.metadata.propagate-errors': 'true',
        **dict.fromkeys(_ROW_CHECK_KEYS, _ROW_CHECK_MIN),
    }
    if row_group_size_mb is not None:
        if not isinstance(row_group_size_mb, (int, float)) or row_group_size_mb <= 0:
            raise ValueError(f'row_group_size_mb must be a positive number of megabytes, got {row_group_size_mb!r}')
        settings['parquet.block.size'] = str(int(row_group_size_mb * _MB))
    return settings


def _apply_hadoop(conf: Any, settings: dict[str, str]) -> list[_SavedSetting]:
    saved = []
    for key, value in settings.items():
        saved.append(_SavedSetting(key, conf.get(key)))
        conf.set(key, value)
    return saved


def _restore_hadoop(conf: Any, saved: list[_SavedSetting]) -> None:
    for setting in reversed(saved):
        if setting.previous is None:
            conf.unset(setting.key)
        else:
            conf.set(setting.key, setting.previous)


def _apply_session(spark: Any, settings: dict[str, str]) -> list[_SavedSetting]:
    saved = []
    for key, value in settings.items():
        saved.append(_SavedSetting(key, spark.conf.get(key, None)))
        spark.conf.set(key, value)
    return saved


def _restore_session(spark: Any, saved: list[_SavedSetting]) -> None:
    for setting in reversed(saved):
        if setting.previous is None:
            spark.conf.unset(setting.key)
        else:
            spark.conf.set(setting.key, setting.previous)


def row_groups_from_summary(filesystem: pafs.FileSystem, root: str,
                            data_files: list[str]) -> dict[str, list[int]] | None:
    """The row-group map recorded in ``root/_metadata``, or None when it is missing or does not list every file."""
    path = posixpath.join(root, SUMMARY_METADATA)
    if filesystem.get_file_info(path).type != pafs.FileType.File:
        return None
    try:
        with filesystem.open_input_file(path) as f:
            summary = pq.read_metadata(f)
    except (OSError, pa.ArrowException):
        logger.warning('%s is unreadable; counting row groups from the data file footers instead', path)
        return None
    counts: dict[str, list[int]] = {}
    for i in range(summary.num_row_groups):
        row_group = summary.row_group(i)
        counts.setdefault(row_group.column(0).file_path, []).append(row_group.num_rows)
    expected = {posixpath.relpath(p, root) for p in data_files}
    return counts if set(counts) == expected else None


def write_petastorm_metadata(filesystem: pafs.FileSystem, root: str, schema: Unischema, dataset_url: str,
                             row_groups: dict[str, list[int]] | None = None, *,
                             legacy_metadata: bool = True) -> dict[str, list[int]]:
    """Write ``_common_metadata`` for the Parquet files under ``root``; return the row-group map written.

    With ``legacy_metadata`` the schema is also stored as Petastorm's pickled entry, for Petastorm releases.

    Row groups come from ``row_groups`` when given, else from a ``_metadata`` summary that lists every file,
    else from the file footers (read in parallel).

    Raises:
        PetastormMetadataGenerationError: the directory does not exist or holds no Parquet data files.
    """
    try:
        data_files = list_data_files(filesystem, root, dataset_url)
    except FileNotFoundError as err:
        raise PetastormMetadataGenerationError(
            f'{dataset_url} does not exist after the write: no dataset was produced, so no Petastorm metadata '
            f'was written. Check that the body of materialize_dataset writes to this same URL.') from err
    if not data_files:
        raise PetastormMetadataGenerationError(
            f'{dataset_url} holds no Parquet data files after the write, so no Petastorm metadata was written. '
            f'Check that the body of materialize_dataset writes Parquet to this same URL.')
    if row_groups is None:
        row_groups = row_groups_from_summary(filesystem, root, data_files)
    written = write_dataset_metadata(filesystem, root, schema, row_groups, legacy_metadata=legacy_metadata)
    logger.info('wrote Petastorm metadata for %s (%s) to %s', counted(len(written), 'file'),
                counted(sum(len(v) for v in written.values()), 'row group'), dataset_url)
    return written


def check_workers_python(context: Any, timeout: float = 30.0) -> None:
    """Warn, before any Spark job, when a local master's workers run a Python that cannot import petastorm.

    The workers run ``context.pythonExec`` (``PYSPARK_PYTHON`` or ``spark.pyspark.python``; ``python3`` unless set).
    When it is not this interpreter, it is asked to import petastorm, as a worker would; otherwise the first task
    fails after a long Java log ending in ``ModuleNotFoundError``. Remote masters' workers are not checked.
    """
    import shutil
    import subprocess
    import sys

    master = str(context.master or '')
    python = getattr(context, 'pythonExec', None) or 'python3'
    if not master.startswith('local') or shutil.which(python) is None:
        return
    if os.path.realpath(shutil.which(python) or python) == os.path.realpath(sys.executable):
        return
    try:
        answer = subprocess.run([python, '-c', 'import petastorm'], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    if answer.returncode:
        warn_user(f"Spark's workers run {python!r} (PYSPARK_PYTHON or spark.pyspark.python), not this interpreter "
                  f'({sys.executable}), and it cannot import petastorm: the job will fail in its workers. Set '
                  f'PYSPARK_PYTHON={sys.executable} before the session starts, or install petastorm there.')


@contextmanager
def materialize_dataset(spark: Any, dataset_url: str, schema: Unischema, row_group_size_mb: float | None = None,
                        use_summary_metadata: bool = False,
                        filesystem_factory: Callable[[], Any] | None = None, *,
                        legacy_metadata: bool = True) -> Iterator[None]:
    """Turn the Parquet store written inside the ``with`` block into a Petastorm dataset.

    Before the body: sets the Parquet settings of ``spark`` (row-group size, summary files, early row-group size
    checks; in the Hadoop configuration of a classic session, as session confs of a Spark Connect one) and makes
    Spark store timestamps as microseconds, remembering the previous values.
    After the body: writes the schema and the number of row groups of every file to ``_common_metadata``.
    The previous settings are restored in every case; when the body raises, no metadata is written.

    Args:
        spark: a ``pyspark.sql.SparkSession``, classic or Spark Connect (whose Parquet settings travel as session
            confs; the body must write through this same session).
        dataset_url: the URL the body writes to (``file:///...``, ``hdfs://...``, ``s3://...``).
        schema: the Unischema of the rows written.
        row_group_size_mb: target row-group size (Parquet ``parquet.block.size``); Spark's default if None.
        use_summary_metadata: let Spark also write a ``_metadata`` summary file (slow for many files).
        filesystem_factory: a callable returning the filesystem (pyarrow or fsspec) holding ``dataset_url``,
            instead of resolving it from the URL.
        legacy_metadata: also store the schema as Petastorm's pickled ``dataset-toolkit.unischema.v1`` entry so
            that Petastorm releases (0.13.1) can open the dataset; ``False`` stores only our JSON metadata.

    Raises:
        PetastormMetadataGenerationError: the body produced no Parquet files at ``dataset_url``.
        TypeError: ``spark`` is not a SparkSession.
        ValueError: a bad ``row_group_size_mb`` or ``dataset_url``.
    """
    if not isinstance(schema, Unischema):
        raise TypeError(f'materialize_dataset needs a Unischema, got {type(schema).__name__}')
    settings = _parquet_settings(row_group_size_mb, use_summary_metadata)
    filesystem = filesystem_factory() if filesystem_factory is not None else None
    fs, root = resolve_url(dataset_url, filesystem=filesystem)  # fail on a bad URL before Spark does any work
    session_settings = {_TIMESTAMP_TYPE_CONF: 'TIMESTAMP_MICROS'}
    conf = None
    if is_connect_session(spark):
        session_settings.update(settings)
    else:
        conf = _hadoop_configuration(spark)
        check_workers_python(spark.sparkContext)
    saved_hadoop: list[_SavedSetting] = []
    saved_session: list[_SavedSetting] = []
    try:
        if conf is not None:
            saved_hadoop = _apply_hadoop(conf, settings)
        saved_session = _apply_session(spark, session_settings)
        yield
        write_petastorm_metadata(fs, root, schema, dataset_url, legacy_metadata=legacy_metadata)
    finally:
        _restore_session(spark, saved_session)
        if conf is not None:
            _restore_hadoop(conf, saved_hadoop)
