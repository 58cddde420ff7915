"""Ranged reads of the version of an object that was listed, through s3fs, gcsfs and adlfs.

A store that rewrites an object in place gives the new object another version tag; a read that names the listed
tag then either gets the listed bytes or fails, never a mix of two versions:

* S3 (s3fs): the ETag, sent back as ``If-Match``; a rewritten object answers 412.
* Google Cloud Storage (gcsfs): the generation number, sent as ``generation=``; in a bucket without versioning the
  old generation of a rewritten object is gone (404), in one with versioning it is still read, whole.
* Azure Blob Storage (adlfs): the ETag, sent as ``If-Match`` (``MatchConditions.IfNotModified``); 412.

:func:`listed_version` reads the tag from a listing's details, :func:`read_version` reads a range of that version,
raising :class:`VersionGone` when the store no longer has it. Other fsspec filesystems have no tag here: their
reads are checked by size (:mod:`petastorm.fs._handler`).
"""

from __future__ import annotations

from typing import Any

from petastorm.fs._errors import classify, is_changed

__all__ = ['VersionGone', 'listed_version', 'read_version', 'read_versions_at_once', 'version_name']

#: per fsspec client (its top-level module): the key of the version tag in its details, and what the tag is called.
_TAGS = {'s3fs': ('ETag', 'ETag'), 'gcsfs': ('generation', 'generation'), 'adlfs': ('etag', 'ETag')}


class VersionGone(OSError):
    """The store refused a read of the listed version of an object: the object changed since it was listed."""


def _client(fs: Any) -> str:
    return type(fs).__module__.split('.')[0]


def version_name(fs: Any) -> str:
    """What the version tag of ``fs`` is called (for messages)."""
    return _TAGS.get(_client(fs), ('', 'version'))[1]


def listed_version(fs: Any, details: dict) -> str | None:
    """The version tag of a file in ``fs``'s listing details, or None (a directory, or a client without tags)."""
    tag = _TAGS.get(_client(fs))
    if tag is None or details.get('type') != 'file':
        return None
    value = details.get(tag[0])
    return str(value) if value not in (None, '') else None


def read_version(fs: Any, path: str, start: int, end: int, version: str) -> bytes:
    """Bytes ``[start, end)`` of ``path`` (fewer at its end) as they are in the version ``version``.

    Raises:
        VersionGone: the store has another version of the object now.
    """
    client = _client(fs)
    try:
        if client == 's3fs':
            return _s3_read(fs, path, start, end, version)
        if client == 'gcsfs':
            return fs.cat_file(path, start=start, end=end, **_gcs_version(version))  # type: ignore[no-any-return]
        if client == 'adlfs':
            return _azure_read(fs, path, start, end, version)
    except Exception as err:
        if is_changed(err) or (client == 'gcsfs' and classify(err) == 'not_found' and _still_there(fs, path)):
            raise VersionGone(f'{path}: version {version} is no longer there') from err
        raise
    return fs.cat_file(path, start=start, end=end)  # type: ignore[no-any-return]


def read_versions_at_once(fs: Any, ranges: list[tuple[str, int, int, str | None]], at_once: int) -> list[Any] | None:
    """Ranges read together from the client's event loop, ``at_once`` on their way; None where it cannot (gcsfs,
    s3fs and adlfs can).

    Each ``(path, start, end, version)`` is read as :func:`read_version` reads it (the object as it is where
    ``version`` is None); the answer of each is its bytes, or the exception of its failed read.
    """
    client = _client(fs)
    if client == 'gcsfs':
        # gcsfs's own cat_ranges takes one set of arguments for every range: each read names its generation here.
        reads = [fs._cat_file(path, start=start, end=end, **_gcs_version(version))
                 for path, start, end, version in ranges]
    elif client == 's3fs':
        reads = [_s3_get(fs, path, start, end, version) for path, start, end, version in ranges]
    elif client == 'adlfs':
        reads = [_azure_get(fs, path, start, end, version) for path, start, end, version in ranges]
    else:
        return None
    from fsspec.asyn import _run_coros_in_chunks, sync

    return sync(fs.loop, _run_coros_in_chunks, reads, batch_size=at_once,  # type: ignore[no-any-return]
                return_exceptions=True, nofiles=True)


def _gcs_version(version: str | None) -> dict[str, str]:
    """gcsfs's arguments of a read of generation ``version`` (none: the object as it is)."""
    return {'generation': version} if version else {}


def _still_there(fs: Any, path: str) -> bool:
    """Whether ``path`` exists now (asked anew): a generation of it was not found, the object may still be there."""
    fs.invalidate_cache(path)
    try:
        return bool(fs.exists(path))
    except Exception:  # the failed read is what is reported
        return False


def _s3_read(fs: Any, path: str, start: int, end: int, etag: str) -> bytes:
    from fsspec.asyn import sync

    return sync(fs.loop, _s3_get, fs, path, start, end, etag)  # type: ignore[no-any-return]


async def _s3_get(fs: Any, path: str, start: int, end: int, etag: str | None) -> bytes:
    """Bytes ``[start, end)`` of object ``path`` (fewer at its end), of ETag ``etag`` when given (else as it is)."""
    bucket, key, version = fs.split_path(path)
    extra = {'VersionId': version} if version else {}
    if etag:
        extra['IfMatch'] = etag
    answer = await fs._call_s3('get_object', Bucket=bucket, Key=key, Range=f'bytes={start}-{end - 1}', **extra)
    try:
        return await answer['Body'].read()  # type: ignore[no-any-return]
    finally:
        answer['Body'].close()


def _azure_read(fs: Any, path: str, start: int, end: int, etag: str) -> bytes:
    from fsspec.asyn import sync

    return sync(fs.loop, _azure_get, fs, path, start, end, etag)  # type: ignore[no-any-return]


async def _azure_get(fs: Any, path: str, start: int, end: int, etag: str | None) -> bytes:
    """Bytes ``[start, end)`` of blob ``path`` (fewer at its end), of ETag ``etag`` when given (else as it is)."""
    from azure.core import MatchConditions

    container, blob, version_id = fs.split_path(path)
    condition = {'etag': etag, 'match_condition': MatchConditions.IfNotModified} if etag else {}
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        stream = await client.download_blob(offset=start, length=end - start, version_id=version_id, **condition)
        return await stream.readall()  # type: ignore[no-any-return]
