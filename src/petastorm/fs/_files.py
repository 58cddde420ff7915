"""Data files on any ``pyarrow.fs`` filesystem: their URL for messages, and retries where the client has none.

Readers hold a filesystem and a path; an error should name the URL the user wrote (``s3://bucket/key``), not the
path (``bucket/key``). And where the filesystem is not ours (a ``pyarrow.fs.S3FileSystem`` given as
``filesystem=``), a read that its client gave up on with a transient error (throttling, a dropped connection, a
body cut short) is retried here, whole, so that it delivers the same rows once or fails with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pyarrow.fs as pafs

from petastorm.fs._errors import translate
from petastorm.fs._handler import StorageHandler
from petastorm.fs._retry import DEFAULT_RETRY, RetriesExhausted, RetryPolicy

T = TypeVar('T')

#: URL schemes of pyarrow's own filesystems, by ``type_name``.
_ARROW_SCHEMES = {'local': 'file', 's3': 's3', 'gcs': 'gs', 'hdfs': 'hdfs', 'abfs': 'abfs'}


def _storage_handler(filesystem: pafs.FileSystem) -> StorageHandler | None:
    if isinstance(filesystem, pafs.PyFileSystem) and isinstance(filesystem.handler, StorageHandler):
        return filesystem.handler
    return None


def file_url(filesystem: pafs.FileSystem, path: str) -> str:
    """The URL of ``path`` on ``filesystem`` (``s3://bucket/key``, ``file:///data/x.parquet``), for messages."""
    handler = _storage_handler(filesystem)
    if handler is not None:
        return handler.url_of(path)
    scheme = _ARROW_SCHEMES.get(getattr(filesystem, 'type_name', ''))
    if scheme is None:
        return path
    return f'{scheme}://{path}' if path.startswith('/') or scheme != 'file' else f'file:///{path}'


def retries_itself(filesystem: pafs.FileSystem) -> bool:
    """True when ``filesystem`` retries transient errors request by request (ours), or has none (local disk)."""
    return _storage_handler(filesystem) is not None or isinstance(filesystem, pafs.LocalFileSystem)


def with_retries(filesystem: pafs.FileSystem, func: Callable[[], T], operation: str, path: str,
                 retry: RetryPolicy = DEFAULT_RETRY) -> T:
    """``func()``, retried whole on transient errors unless the filesystem retries itself (:func:`retries_itself`).

    Raises:
        StorageError: every attempt failed with a transient error (the message names the URL and the attempts).
        Exception: a non-transient error, at once and unchanged.
    """
    if retries_itself(filesystem):
        return func()
    url = file_url(filesystem, path)
    try:
        return retry.call(func, f'{operation} {url}')
    except RetriesExhausted as exhausted:
        raise translate(exhausted.error, operation, url, attempts=exhausted.attempts) from exhausted.error
