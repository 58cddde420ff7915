"""The S3 requests of :class:`~petastorm.test_util.s3_server.S3DirectoryServer`, answered over a local directory.

:class:`S3Requests` answers one parsed request (method, target, headers, body) through the server's connection,
which sends what it is given (:class:`Reply`); the HTTP side (connections, bodies, the running loop, the counters'
endpoint) is the server's. :class:`Store` is the directory seen as buckets and keys. A request that cannot be
answered raises :class:`ErrorReply`, which the connection sends as S3's XML error.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import email.utils
import hashlib
import html
import os
import posixpath
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

_RANGE = re.compile(r'^bytes=(\d*)-(\d*)$')
_MAX_KEYS = 1000
#: where the parts of multipart uploads wait, under the root (not a bucket: the name is refused as one).
_UPLOADS_DIR = '.s3tmp-uploads'
_XML = {'Content-Type': 'application/xml'}
_S3_NAMESPACE = 'http://s3.amazonaws.com/doc/2006-03-01/'
_LIST_PARAMETERS = {'list-type', 'prefix', 'delimiter', 'max-keys', 'marker', 'continuation-token', 'start-after',
                    'encoding-type', 'fetch-owner'}


class ErrorReply(Exception):
    """An S3 error answer to send instead of the request's answer (never leaves the server)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers or {}


def xml_error(code: str, message: str, resource: str = '') -> bytes:
    """The XML body of an S3 error answer."""
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{html.escape(message)}'
            f'</Message><Resource>{html.escape(resource)}</Resource></Error>').encode()


def _etag(stat: os.stat_result) -> str:
    return f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'


def _etag_matches(header: str | None, etag: str, absent: bool) -> bool:
    """Whether an ``If-Match``/``If-None-Match`` header (ETags, or ``*``) names ``etag``; ``absent`` without one."""
    if not header:
        return absent
    tags = [tag.strip().removeprefix('W/') for tag in header.split(',')]
    return '*' in tags or etag in tags or etag.strip('"') in tags


def _http_date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


def _iso_date(seconds: float) -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime(seconds))


class Reply(Protocol):
    """What the handlers need of a connection: sending an answer, and its stream for ``sendfile``."""

    writer: asyncio.StreamWriter

    def send(self, status: int, headers: dict[str, str], body: bytes = b'', content_length: int | None = None) -> None:
        """Send an answer's status line, headers and body (``content_length`` when the body follows by sendfile)."""


class Store:
    """The directory tree as buckets and keys."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def bucket_dir(self, bucket: str) -> str:
        """The directory of ``bucket`` (which may not exist)."""
        if not bucket or bucket in ('.', '..', _UPLOADS_DIR) or '/' in bucket:
            raise ErrorReply(400, 'InvalidBucketName', f'invalid bucket name {bucket!r}')
        return os.path.join(self.root, bucket)

    def object_path(self, bucket: str, key: str) -> str:
        """The file of an object (which may not exist)."""
        parts = key.split('/')
        if not key or any(part in ('.', '..') for part in parts):
            raise ErrorReply(400, 'InvalidArgument', f'invalid key {key!r}')
        return os.path.join(self.bucket_dir(bucket), *parts)

    def check_bucket(self, bucket: str) -> None:
        """Refuse a bucket that does not exist."""
        if not os.path.isdir(self.bucket_dir(bucket)):
            raise ErrorReply(404, 'NoSuchBucket', f'the bucket {bucket} does not exist')

    def keys(self, bucket: str, prefix: str) -> list[str]:
        """Every key of ``bucket`` that starts with ``prefix``, sorted (names only: a page stats its own keys)."""
        base = self.bucket_dir(bucket)
        # Only the directories the prefix can lead to are walked.
        directory = posixpath.dirname(prefix)
        start = os.path.join(base, *directory.split('/')) if directory else base
        found: list[str] = []
        for dirpath, _, filenames in os.walk(start):
            relative_dir = os.path.relpath(dirpath, base).replace(os.sep, '/')
            relative_dir = '' if relative_dir == '.' else relative_dir + '/'
            found.extend(key for key in (relative_dir + name for name in filenames if not name.startswith('.s3tmp-'))
                         if key.startswith(prefix))
        found.sort()
        return found

    def stat(self, bucket: str, key: str) -> os.stat_result | None:
        """The stat of the file of ``key``, or None when it went away since it was listed."""
        try:
            return os.stat(os.path.join(self.bucket_dir(bucket), *key.split('/')))
        except FileNotFoundError:
            return None

    def replace_atomically(self, path: str, write: Callable[[Any], None]) -> None:
        """Write a new file with ``write(file object)`` beside ``path`` and move it there at once."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix='.s3tmp-', dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, 'wb') as out:
                write(out)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise


# -- listing ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ListQuery:
    """What a ``ListObjects`` or ``ListObjectsV2`` request asks for."""

    version2: bool
    prefix: str
    delimiter: str
    max_keys: int
    after: str
    continuation_token: str

    @classmethod
    def parse(cls, query: dict[str, str]) -> _ListQuery:
        version2 = query.get('list-type') == '2'
        try:
            max_keys = min(_MAX_KEYS, int(query.get('max-keys', _MAX_KEYS)))
        except ValueError as err:
            raise ErrorReply(400, 'InvalidArgument', f'max-keys: {err}') from err
        after = query.get('continuation-token') or query.get('start-after', '') if version2 else query.get('marker', '')
        return cls(version2, query.get('prefix', ''), query.get('delimiter', ''), max_keys, after,
                   query.get('continuation-token', ''))


@dataclass
class _ListPage:
    """The keys and common prefixes of one page of a listing, and where the next page starts."""

    contents: list[tuple[str, os.stat_result]]
    prefixes: list[str]
    truncated: bool = False
    last: str = ''

    def full(self, max_keys: int) -> bool:
        return len(self.contents) + len(self.prefixes) >= max_keys


def _list_page(store: Store, bucket: str, keys: list[str], request: _ListQuery) -> _ListPage:
    """The page of ``keys`` (sorted) the request asks for: keys past ``after``, those under a delimiter as prefixes;
    only the page's keys are stat'ed (a listing of 100,000 keys is a hundred pages)."""
    page = _ListPage([], [])
    for key in keys[bisect.bisect_right(keys, request.after):]:
        cut = key.find(request.delimiter, len(request.prefix)) if request.delimiter else -1
        common = key[:cut + len(request.delimiter)] if cut >= 0 else None
        if common is not None and (common <= request.after or (page.prefixes and page.prefixes[-1] == common)):
            continue
        stat = store.stat(bucket, key) if common is None else None
        if common is None and stat is None:
            continue  # deleted since the walk
        if page.full(request.max_keys):
            page.truncated = True
            break
        if common is not None:
            page.prefixes.append(common)
        else:
            assert stat is not None
            page.contents.append((key, stat))
        page.last = common or key
    return page


def _list_xml(bucket: str, request: _ListQuery, page: _ListPage) -> bytes:
    """The ``ListBucketResult`` of a page."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>', f'<ListBucketResult xmlns="{_S3_NAMESPACE}">',
           f'<Name>{html.escape(bucket)}</Name><Prefix>{html.escape(request.prefix)}</Prefix>',
           f'<MaxKeys>{request.max_keys}</MaxKeys><IsTruncated>{"true" if page.truncated else "false"}</IsTruncated>']
    if request.delimiter:
        out.append(f'<Delimiter>{html.escape(request.delimiter)}</Delimiter>')
    if request.version2:
        out.append(f'<KeyCount>{len(page.contents) + len(page.prefixes)}</KeyCount>')
        if request.continuation_token:
            out.append(f'<ContinuationToken>{html.escape(request.continuation_token)}</ContinuationToken>')
        if page.truncated:
            out.append(f'<NextContinuationToken>{html.escape(page.last)}</NextContinuationToken>')
    elif page.truncated:
        out.append(f'<NextMarker>{html.escape(page.last)}</NextMarker>')
    for key, stat in page.contents:
        out.append(f'<Contents><Key>{html.escape(key)}</Key><LastModified>{_iso_date(stat.st_mtime)}</LastModified>'
                   f'<ETag>{html.escape(_etag(stat))}</ETag><Size>{stat.st_size}</Size>'
                   f'<StorageClass>STANDARD</StorageClass></Contents>')
    for common in page.prefixes:
        out.append(f'<CommonPrefixes><Prefix>{html.escape(common)}</Prefix></CommonPrefixes>')
    out.append('</ListBucketResult>')
    return ''.join(out).encode()


def list_objects(store: Store, bucket: str, query: dict[str, str]) -> bytes:
    """The XML answer of ``ListObjects`` / ``ListObjectsV2`` (run in a thread: it walks the directory)."""
    store.check_bucket(bucket)
    request = _ListQuery.parse(query)
    return _list_xml(bucket, request, _list_page(store, bucket, store.keys(bucket, request.prefix), request))


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, stop)`` of a ``Range`` header, or None for the whole object; raises 416 when unsatisfiable."""
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None  # several ranges or another unit: RFC 9110 lets a server send the whole representation
    first, last = match.groups()
    if not first:
        if not last:
            return None
        length = int(last)
        if length == 0:
            raise ErrorReply(416, 'InvalidRange', 'The requested range is not satisfiable')
        return max(0, size - length), size
    start = int(first)
    stop = size if not last else min(size, int(last) + 1)
    if start >= size or stop <= start:
        raise ErrorReply(416, 'InvalidRange', 'The requested range is not satisfiable')
    return start, stop


# -- the requests ----------------------------------------------------------------------------------------------

class S3Requests:
    """The answers to S3 requests over a :class:`Store`, each request counted by ``count``.

    Args:
        store: the directory served.
        count: ``count(kind, sent=0, ranged=False, obj=None)``, the server's counters.
    """

    def __init__(self, store: Store, count: Callable[..., None]) -> None:
        self._store = store
        self._count = count
        self._uploads: dict[str, str] = {}  # upload id -> the object path it will become
        self._uploads_lock = threading.Lock()

    async def answer(self, connection: Reply, method: str, target: str, path: str, query: dict[str, str],
                     headers: dict[str, str], body: bytes) -> None:
        """Answer one request for ``path`` (unquoted) with its ``query``, through ``connection``."""
        bucket, _, key = path.lstrip('/').partition('/')
        if not bucket:
            self._count('OTHER')
            raise ErrorReply(501, 'NotImplemented', 'listing buckets is not implemented')
        if not key:
            await self._bucket_request(connection, method, bucket, query, body)
        elif method in ('GET', 'HEAD') and not (set(query) - {'versionId', 'partNumber'}):
            await self._get(connection, method, bucket, key, headers)
        elif method == 'PUT' and not query and 'x-amz-copy-source' in headers:
            self._copy(connection, bucket, key, headers['x-amz-copy-source'])
        elif method == 'PUT' and not query:
            self._put(connection, bucket, key, body)
        elif 'x-amz-copy-source' in headers:
            self._count('OTHER')
            raise ErrorReply(501, 'NotImplemented', 'copying into a part is not implemented by this test server')
        elif 'uploads' in query or 'uploadId' in query:
            self._multipart(connection, method, bucket, key, query, body)
        elif method == 'DELETE' and not query:
            self._count('DELETE')
            self._delete(bucket, key)
            connection.send(204, {})
        else:
            self._count('OTHER')
            raise ErrorReply(501, 'NotImplemented', f'{method} {target} is not implemented by this test server')

    async def _bucket_request(self, connection: Reply, method: str, bucket: str, query: dict[str, str],
                              body: bytes) -> None:
        directory = self._store.bucket_dir(bucket)
        if method == 'HEAD':
            self._count('HEAD')
            connection.send(200 if os.path.isdir(directory) else 404, {})
        elif method == 'GET' and 'location' in query:
            self._count('OTHER')
            connection.send(200, _XML, b'<?xml version="1.0" encoding="UTF-8"?><LocationConstraint '
                                       b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></LocationConstraint>')
        elif method == 'GET' and not (set(query) - _LIST_PARAMETERS):
            self._count('LIST')
            loop = asyncio.get_running_loop()
            connection.send(200, _XML, await loop.run_in_executor(None, list_objects, self._store, bucket, query))
        elif method == 'PUT' and not query:
            self._count('PUT')
            os.makedirs(directory, exist_ok=True)
            connection.send(200, {})
        elif method == 'POST' and set(query) == {'delete'}:
            self._count('DELETE')
            connection.send(200, _XML, self._delete_objects(bucket, body))
        else:
            self._count('OTHER')
            raise ErrorReply(501, 'NotImplemented', f'{method} on bucket {bucket} with {sorted(query)} is not '
                                                    f'implemented by this test server')

    async def _get(self, connection: Reply, method: str, bucket: str, key: str, headers: dict[str, str]) -> None:
        path = self._store.object_path(bucket, key)
        obj = f'{bucket}/{key}'
        try:
            handle = open(path, 'rb')  # noqa: SIM115 - closed below, after sendfile
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self._count(method, obj=obj)
            self._store.check_bucket(bucket)
            raise ErrorReply(404, 'NoSuchKey', 'The specified key does not exist.') from None
        with handle:
            stat = os.fstat(handle.fileno())
            etag = _etag(stat)
            answer = {'ETag': etag, 'Last-Modified': _http_date(stat.st_mtime), 'Accept-Ranges': 'bytes',
                      'Content-Type': 'application/octet-stream'}
            if not _etag_matches(headers.get('if-match'), etag, absent=True):
                self._count(method, obj=obj)
                raise ErrorReply(412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did '
                                                            'not hold', {'ETag': etag})
            if _etag_matches(headers.get('if-none-match'), etag, absent=False):
                self._count(method, obj=obj)
                connection.send(304, {'ETag': etag})
                return
            try:
                span = _byte_range(headers.get('range'), stat.st_size)
            except ErrorReply as err:
                self._count(method, obj=obj)
                err.headers['Content-Range'] = f'bytes */{stat.st_size}'
                raise
            start, stop = span if span is not None else (0, stat.st_size)
            if span is not None:
                answer['Content-Range'] = f'bytes {start}-{stop - 1}/{stat.st_size}'
            # Counted before the answer leaves: a client that has its answer finds its request counted.
            self._count(method, stop - start if method == 'GET' else 0, ranged=span is not None and method == 'GET',
                        obj=obj)
            connection.send(206 if span is not None else 200, answer, content_length=stop - start)
            if method == 'GET' and stop > start:
                await connection.writer.drain()
                await asyncio.get_running_loop().sendfile(connection.writer.transport, handle, start, stop - start)

    def _delete_objects(self, bucket: str, body: bytes) -> bytes:
        """``DeleteObjects``: remove every key the XML body names; a missing key counts as deleted, as on S3."""
        import xml.etree.ElementTree as ElementTree

        deleted = []
        for element in ElementTree.fromstring(body).iter():
            if element.tag.rsplit('}', 1)[-1] == 'Key' and element.text:
                self._delete(bucket, element.text)
                deleted.append(f'<Deleted><Key>{html.escape(element.text)}</Key></Deleted>')
        return (f'<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="{_S3_NAMESPACE}">'
                + ''.join(deleted) + '</DeleteResult>').encode()

    def _delete(self, bucket: str, key: str) -> None:
        """Remove an object (a missing one counts as removed, as on S3); a directory marker, its empty directory."""
        path = self._store.object_path(bucket, key.rstrip('/') if key.endswith('/') else key)
        try:
            if key.endswith('/'):
                os.rmdir(path)
            else:
                os.unlink(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, OSError):
            pass  # gone already, or a directory that still holds objects (they stay listed)

    def _put(self, connection: Reply, bucket: str, key: str, body: bytes) -> None:
        self._count('PUT')
        self._store.check_bucket(bucket)
        if key.endswith('/') and not body:
            # A directory marker (what pyarrow's create_dir writes): the directory, which lists as nothing.
            os.makedirs(self._store.object_path(bucket, key.rstrip('/')), exist_ok=True)
            connection.send(200, {'ETag': '"d41d8cd98f00b204e9800998ecf8427e"'})
            return
        path = self._store.object_path(bucket, key)
        self._store.replace_atomically(path, lambda out: out.write(body))
        connection.send(200, {'ETag': _etag(os.stat(path))})

    def _copy(self, connection: Reply, bucket: str, key: str, source: str) -> None:
        """``CopyObject`` (what s3fs's ``copy`` and ``mv`` send): the source file copied to the key, atomically."""
        self._count('PUT')
        source_bucket, _, source_key = urllib.parse.unquote(source.split('?')[0]).lstrip('/').partition('/')
        source_path = self._store.object_path(source_bucket, source_key)
        if not os.path.isfile(source_path):
            raise ErrorReply(404, 'NoSuchKey', f'the copy source {source_bucket}/{source_key} does not exist')
        self._store.check_bucket(bucket)
        path = self._store.object_path(bucket, key)

        def copy(out: Any) -> None:
            with open(source_path, 'rb') as source_file:
                shutil.copyfileobj(source_file, out)

        self._store.replace_atomically(path, copy)
        stat = os.stat(path)
        connection.send(200, _XML, (
            '<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult><LastModified>'
            f'{_iso_date(stat.st_mtime)}</LastModified><ETag>{html.escape(_etag(stat))}</ETag></CopyObjectResult>'
        ).encode())

    # -- multipart uploads ----------------------------------------------------------------------------------------

    def _multipart(self, connection: Reply, method: str, bucket: str, key: str, query: dict[str, str],
                   body: bytes) -> None:
        """``CreateMultipartUpload``, ``UploadPart``, ``CompleteMultipartUpload`` and ``AbortMultipartUpload``.

        Parts wait in a directory of their own under the root; completing concatenates them into the object and
        replaces it atomically, as a single ``PUT`` does.
        """
        self._count('PUT')
        self._store.check_bucket(bucket)
        target = self._store.object_path(bucket, key)
        if method == 'POST' and 'uploads' in query:
            self._create_upload(connection, bucket, key, target)
            return
        upload_id = query.get('uploadId', '')
        with self._uploads_lock:
            known = self._uploads.get(upload_id)
        if known != target:
            raise ErrorReply(404, 'NoSuchUpload', f'no upload {upload_id!r} of {bucket}/{key} is in progress')
        if method == 'PUT' and 'partNumber' in query:
            self._upload_part(connection, upload_id, query['partNumber'], body)
        elif method == 'POST':
            self._complete_upload(connection, bucket, key, target, upload_id, body)
        elif method == 'DELETE':
            self._end_upload(upload_id)
            connection.send(204, {})
        else:
            raise ErrorReply(501, 'NotImplemented', f'{method} of upload {upload_id} is not implemented by this '
                                                    f'test server')

    def _create_upload(self, connection: Reply, bucket: str, key: str, target: str) -> None:
        upload_id = uuid.uuid4().hex
        with self._uploads_lock:
            self._uploads[upload_id] = target
        os.makedirs(self._upload_dir(upload_id))
        connection.send(200, _XML, (
            f'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult xmlns="{_S3_NAMESPACE}">'
            f'<Bucket>{html.escape(bucket)}</Bucket><Key>{html.escape(key)}</Key><UploadId>{upload_id}</UploadId>'
            '</InitiateMultipartUploadResult>').encode())

    def _upload_part(self, connection: Reply, upload_id: str, part_number: str, body: bytes) -> None:
        number = int(part_number)
        if not 1 <= number <= 10000:
            raise ErrorReply(400, 'InvalidArgument', f'partNumber {number} should be in 1..10000')
        with open(self._part_path(upload_id, number), 'wb') as out:
            out.write(body)
        connection.send(200, {'ETag': f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'})

    def _complete_upload(self, connection: Reply, bucket: str, key: str, target: str, upload_id: str,
                         body: bytes) -> None:
        import xml.etree.ElementTree as ElementTree

        numbers = sorted(int(element.text or 0) for element in ElementTree.fromstring(body).iter()
                         if element.tag.rsplit('}', 1)[-1] == 'PartNumber')
        missing = [n for n in numbers if not os.path.isfile(self._part_path(upload_id, n))]
        if not numbers or missing:
            raise ErrorReply(400, 'InvalidPart', f'parts {missing or numbers} of upload {upload_id} were not uploaded')

        def concatenate(out: Any) -> None:
            for number in numbers:
                with open(self._part_path(upload_id, number), 'rb') as part:
                    shutil.copyfileobj(part, out)

        self._store.replace_atomically(target, concatenate)
        self._end_upload(upload_id)
        connection.send(200, _XML, (
            f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult xmlns="{_S3_NAMESPACE}">'
            f'<Bucket>{html.escape(bucket)}</Bucket><Key>{html.escape(key)}</Key>'
            f'<ETag>{html.escape(_etag(os.stat(target)))}</ETag></CompleteMultipartUploadResult>').encode())

    def _upload_dir(self, upload_id: str) -> str:
        return os.path.join(self._store.root, _UPLOADS_DIR, upload_id)

    def _part_path(self, upload_id: str, number: int) -> str:
        return os.path.join(self._upload_dir(upload_id), f'{number:05d}')

    def _end_upload(self, upload_id: str) -> None:
        with self._uploads_lock:
            self._uploads.pop(upload_id, None)
        shutil.rmtree(self._upload_dir(upload_id), ignore_errors=True)
