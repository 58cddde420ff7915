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

from petastorm.fs._errors import classify, operation_on, translate
from petastorm.fs._handler import OBJECT_STORE_SCHEMES, StorageHandler
from petastorm.fs._retry import DEFAULT_RETRY, RetriesExhausted, RetryPolicy
from petastorm.fs._throttle import limit_for

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


def is_object_store(filesystem: pafs.FileSystem) -> bool:
    """True when ``filesystem`` is an object store, whose directories are only key prefixes."""
    handler = _storage_handler(filesystem)
    if handler is not None:
        return handler.scheme in OBJECT_STORE_SCHEMES
    return _ARROW_SCHEMES.get(getattr(filesystem, 'type_name', '')) in OBJECT_STORE_SCHEMES


def remove_dir(filesystem: pafs.FileSystem, path: str) -> None:
    """Delete the directory ``path`` and what it holds; on an object store, one already emptied is gone already.

    Raises:
        FileNotFoundError: there is no such directory (on an object store: never).
    """
    try:
        filesystem.delete_dir(path)
    except FileNotFoundError:
        if not is_object_store(filesystem):
            raise


def move_file(filesystem: pafs.FileSystem, source: str, target: str) -> None:
    """Move a file; where the store has no move (pyarrow's Azure client without the hierarchical namespace), copy
    it and delete the source, as S3's and GCS's clients do themselves.
    """
    try:
        filesystem.move(source, target)
    except NotImplementedError:
        if not is_object_store(filesystem):
            raise
        filesystem.copy_file(source, target)
        filesystem.delete_file(source)


def retries_itself(filesystem: pafs.FileSystem) -> bool:
    """True when ``filesystem`` retries transient errors request by request (ours), or has none (local disk)."""
    return _storage_handler(filesystem) is not None or isinstance(filesystem, pafs.LocalFileSystem)


def with_retries(filesystem: pafs.FileSystem, func: Callable[[], T], operation: str, path: str,
                 retry: RetryPolicy = DEFAULT_RETRY, limited: bool = True) -> T:
    """``func()``, retried whole on transient errors unless the filesystem retries itself (:func:`retries_itself`).

    With ``limited``, each attempt holds a slot of the bucket's :class:`~petastorm.fs._throttle.AdaptiveLimit`
    (a call that may wait for another thread's request, such as a row group read once for two readers, must not).

    Raises:
        StorageError: every attempt failed with a transient error (the message names the URL and the attempts).
        StorageNotFoundError, StorageCredentialsError, StoragePermissionError: what the storage said about access.
        Exception: any other non-transient error, at once and unchanged.
    """
    if retries_itself(filesystem):
        return func()
    url = file_url(filesystem, path)
    try:
        limit = limit_for(getattr(filesystem, 'type_name', ''), path) if limited else None
        return retry.call(func, operation_on(operation, url), limit=limit)
    except RetriesExhausted as exhausted:
        raise translate(exhausted.error, operation, url, attempts=exhausted.attempts) from exhausted.error
    except OSError as err:
        # What the storage said about access (gone, credentials refused, no permission, nothing listening) names
        # the URL, as our own layer says it; anything else (a damaged file, say) is the caller's to tell.
        if classify(err) in ('not_found', 'credentials', 'permission', 'refused'):
            raise translate(err, operation, url) from err
        raise
