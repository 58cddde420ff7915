"""Where converters keep their Parquet copies.

The parent cache directory URL, the per-DataFrame subdirectory, the files written there, and deleting them.

The parent directory comes from the Spark conf ``petastorm.spark.converter.parentCacheDirUrl``. Spark writes the
files and our readers read them, so the URL must name storage both can reach: ``file:///...`` (a local disk in
local mode, or a shared mount such as ``/dbfs`` or Unity Catalog's ``/Volumes``), ``dbfs:/...`` (read as
``file:///dbfs/...``), ``hdfs://...``, ``s3://...``, ``gs://...`` or ``abfs://...``. A path without a scheme is
refused rather than guessed.

Nothing here imports pyspark; the callers pass what they read from the session.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.fs import display_url, resolve_location, resolve_url

__all__ = [
    'PARENT_CACHE_DIR_URL_CONF',
    'DeleteDirHandler',
    'StoreDescription',
    'check_parent_cache_dir_url',
    'delete_dir',
    'describe_store',
    'dir_exists',
    'make_sub_dir_url',
    'new_cache_dir_name',
    'normalize_dbfs_url',
    'wait_files_available',
    'warn_if_files_small',
    'warn_if_local_dir_on_cluster',
]

logger = logging.getLogger(__name__)

PARENT_CACHE_DIR_URL_CONF = 'petastorm.spark.converter.parentCacheDirUrl'

#: Schemes Spark can write and our readers can read; other fsspec schemes are let through with a warning.
_KNOWN_SCHEMES = frozenset({'file', 'hdfs', 'viewfs', 's3', 's3a', 's3n', 'gs', 'gcs', 'abfs', 'abfss', 'wasb',
                            'wasbs', 'dbfs'})
_SMALL_FILE_BYTES = 50 * 1024 * 1024
_FOOTER_READ_THREADS = 8
_POLL_INTERVAL_SECS = 0.1

DeleteDirHandler = Callable[[str], None]


def normalize_dbfs_url(url: str) -> str:
    """``dbfs:/x`` and ``file:/dbfs/x`` become ``file:///dbfs/x``: the FUSE mount every Databricks node has.

    Unity Catalog volumes are mounted at ``/Volumes`` instead: ``dbfs:/Volumes/x`` and ``file:/Volumes/x`` become
    ``file:///Volumes/x``. Spark reads and writes all these forms; the readers (pyarrow) need the local mount.
    """
    if url.startswith('dbfs:/'):
        path = url[len('dbfs:/'):].lstrip('/')
        return 'file:///' + path if _is_volumes_path('/' + path) else 'file:///dbfs/' + path
    if url.startswith('file:/dbfs/'):
        return 'file:///dbfs/' + url[len('file:/dbfs/'):]
    if url.startswith('file:/Volumes/'):
        return 'file:///Volumes/' + url[len('file:/Volumes/'):]
    return url


def _is_volumes_path(path: str) -> bool:
    return path == '/Volumes' or path.startswith('/Volumes/')


def _is_shared_mount(path: str) -> bool:
    """Whether a local path is on a mount every Databricks node shares (DBFS or a Unity Catalog volume)."""
    return path.startswith('/dbfs/') or _is_volumes_path(path)


def check_parent_cache_dir_url(url: Any) -> str:
    """The parent cache directory URL from the Spark conf, checked and normalized (no trailing ``/``).

    Raises:
        ValueError: the conf is unset or empty, the value has no scheme (a plain path), or it names a remote
            host in a ``file:`` URL or a relative path.
    """
    if url is None or (isinstance(url, str) and not url.strip()):
        raise ValueError(f'Please set the spark config {PARENT_CACHE_DIR_URL_CONF}. It is the directory URL under '
                         f'which make_spark_converter writes its Parquet copies, for example '
                         f"spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, 'file:///tmp/cache') "
                         f"(or an 'hdfs://', 's3://' or 'dbfs:/' URL on a cluster).")
    if not isinstance(url, str):
        raise ValueError(f'{PARENT_CACHE_DIR_URL_CONF} must be a URL string, got {url!r}')
    url = normalize_dbfs_url(url.strip()).rstrip('/')
    parsed = urlparse(url)
    if not parsed.scheme or len(parsed.scheme) == 1:  # 'C:\\x' parses with scheme 'c'
        raise ValueError(f'{PARENT_CACHE_DIR_URL_CONF} is the scheme-less path {url!r}; a URL with a scheme is '
                         f"needed. For a local directory use 'file://{url if url.startswith('/') else '/' + url}'.")
    scheme = parsed.scheme.lower()
    if scheme == 'file':
        if parsed.netloc not in ('', 'localhost'):
            raise ValueError(f'{PARENT_CACHE_DIR_URL_CONF}={display_url(url)!r} names the host {parsed.netloc!r}; '
                             f"a local directory URL is 'file:///absolute/path' (three slashes)")
        if not parsed.path.startswith('/') or parsed.path == '/':
            raise ValueError(f'{PARENT_CACHE_DIR_URL_CONF}={display_url(url)!r} must name an absolute directory '
                             f"below the root, like 'file:///tmp/petastorm_cache'")
    elif scheme not in _KNOWN_SCHEMES:
        logger.warning('%s uses the scheme %r, which is not one of %s: Spark must be able to write it and fsspec '
                       'to read it', PARENT_CACHE_DIR_URL_CONF, scheme, ', '.join(sorted(_KNOWN_SCHEMES)))
    return url


def warn_if_local_dir_on_cluster(url: str, master: str | None, connect_server_host: str | None = None) -> None:
    """Refuse a ``file://`` cache that the Spark driver or tasks cannot reach.

    A ``file://`` cache outside ``/dbfs`` and ``/Volumes`` only works when every Spark task, and the Spark
    driver, run on this machine.

    Args:
        url: the checked parent cache directory URL.
        master: the Spark master URL (None when unknown).
        connect_server_host: for a Spark Connect session whose server is on another machine, its host: the files
            are then written on the server's side, not this one's.
    """
    if urlparse(url).scheme != 'file' or _is_shared_mount(urlparse(url).path):
        return
    if connect_server_host is not None:
        logger.warning('%s=%s is a local directory, but this Spark Connect session runs on the server %r: Spark '
                       'writes the files on the cluster\'s disks, where this process cannot read them. Use shared '
                       "storage ('dbfs:/', '/Volumes/...', 's3://', 'hdfs://' ...).", PARENT_CACHE_DIR_URL_CONF,
                       display_url(url), connect_server_host)
    elif master is not None and not master.startswith('local'):
        logger.warning('%s=%s is a local directory, but the Spark master is %r: executors on other machines write '
                       "their part of the data to their own disks. Use shared storage ('hdfs://', 's3://', "
                       "'dbfs:/' ...) unless every executor runs on this machine.",
                       PARENT_CACHE_DIR_URL_CONF, display_url(url), master)


def make_sub_dir_url(dir_url: str, name: str) -> str:
    """``dir_url/name``: the URL of an entry of a directory."""
    return dir_url.rstrip('/') + '/' + name


def new_cache_dir_name(app_id: str | None) -> str:
    """A name no other conversion uses: UTC time, the Spark application id and a random part."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%d%H%M%S')
    return f'{stamp}-appid-{app_id or "unknown"}-{uuid.uuid4()}'


def _is_data_file(relative_path: str) -> bool:
    # Spark and pyarrow skip names starting with '_' or '.' (_SUCCESS, .crc checksums, our usage markers).
    return not any(part.startswith(('_', '.')) for part in relative_path.split('/'))


@dataclass(frozen=True)
class StoreDescription:
    """The Parquet files of a materialized DataFrame and the rows they hold."""

    file_urls: list[str]
    dataset_size: int
    file_sizes: list[int]


def describe_store(dir_url: str) -> StoreDescription:
    """List the data files under ``dir_url`` (sorted) and count their rows from the Parquet footers.

    Raises:
        OSError: the directory cannot be listed or a footer cannot be read.
        ValueError: the directory holds no Parquet data file.
    """
    filesystem, root = resolve_url(dir_url)
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    files = sorted((info for info in infos if info.type == pafs.FileType.File
                    and _is_data_file(info.path[len(root):].lstrip('/'))), key=lambda info: info.path)
    if not files:
        raise ValueError(f'no Parquet data file under {display_url(dir_url)}')
    paths = [info.path for info in files]

    def rows_in(path: str) -> int:
        with filesystem.open_input_file(path) as handle:
            return pq.ParquetFile(handle).metadata.num_rows

    with ThreadPoolExecutor(max_workers=min(_FOOTER_READ_THREADS, len(paths))) as pool:
        counts = list(pool.map(rows_in, paths))
    urls = [make_sub_dir_url(dir_url, path[len(root):].lstrip('/')) for path in paths]
    return StoreDescription(urls, sum(counts), [info.size or 0 for info in files])


def warn_if_files_small(dir_url: str, file_sizes: Sequence[int]) -> None:
    """Many small files make each reader open many footers; say how to get fewer, larger ones."""
    if len(file_sizes) < 2 or urlparse(dir_url).scheme != 'file' or sum(file_sizes) < _SMALL_FILE_BYTES:
        return  # one file, or so little data that the number of files does not matter
    median = statistics.median(file_sizes)
    if median < _SMALL_FILE_BYTES:
        logger.warning('The median size of the %d Parquet files under %s is %.1f MiB (< %d MiB): reading many '
                       'small files is slower; df.repartition(n) or df.coalesce(n) before make_spark_converter '
                       'gives fewer, larger files.', len(file_sizes), display_url(dir_url), median / 2 ** 20,
                       _SMALL_FILE_BYTES // 2 ** 20)


def wait_files_available(file_urls: Sequence[str], timeout_secs: float) -> None:
    """Return once every file exists (object stores may list a file late); poll until ``timeout_secs``.

    Raises:
        RuntimeError: some files still do not exist after the timeout (the message lists a few).
    """
    if not file_urls:
        return
    location = resolve_location(list(file_urls))
    filesystem = location.filesystem
    pending = dict(zip(location.url, location.path, strict=True))
    deadline = time.monotonic() + timeout_secs
    while True:
        urls = list(pending)
        infos = filesystem.get_file_info([pending[url] for url in urls])
        for url, info in zip(urls, infos, strict=True):
            if info.type != pafs.FileType.NotFound:
                del pending[url]
        if not pending:
            return
        if time.monotonic() >= deadline:
            shown = ', '.join(display_url(url) for url in sorted(pending)[:5])
            raise RuntimeError(f'Timeout while waiting for all parquet-store files to appear at urls: {shown}'
                               f'{" ..." if len(pending) > 5 else ""} ({len(pending)} of {len(file_urls)} missing '
                               f'after {timeout_secs} s)')
        time.sleep(_POLL_INTERVAL_SECS)


def delete_dir(dir_url: str) -> None:
    """The default way to delete a cache directory: recursively, through its filesystem; a missing one is fine."""
    filesystem, path = resolve_url(dir_url)
    try:
        filesystem.delete_dir(path)
    except FileNotFoundError:
        logger.debug('cache directory %s was already gone', display_url(dir_url))


def dir_exists(dir_url: str) -> bool:
    """Whether the directory is still there; True when its storage cannot be asked (so it is not rewritten)."""
    try:
        filesystem, path = resolve_url(dir_url)
        return filesystem.get_file_info(path).type == pafs.FileType.Directory
    except (OSError, ValueError, ImportError):
        return True
