"""An S3-compatible HTTP server on loopback over a local directory, fast enough not to be what a benchmark measures.

Each directory under ``root`` is a bucket and each file under it an object (``root/bucket/a/b.parquet`` is key
``a/b.parquet`` of bucket ``bucket``). The server answers what readers ask of an object store:

* ``GET`` and ``HEAD`` of an object, with a ``Range`` header (one range: ``bytes=a-b``, ``bytes=a-``,
  ``bytes=-n``); bodies are sent with ``sendfile``, so the bytes never pass through Python;
* ``ListObjectsV2`` (``prefix``, ``delimiter``, ``max-keys``, ``continuation-token``, ``start-after``),
  ``ListObjects`` (``marker``), ``HeadBucket`` and ``GetBucketLocation``;
* ``GET`` with ``If-Match`` / ``If-None-Match`` (``412 PreconditionFailed`` / ``304``), as clients use to notice
  an object that changed between two reads;
* ``PUT`` of an object in one request (plain, ``chunked`` or ``aws-chunked`` bodies), multipart uploads (what
  pyarrow's ``S3FileSystem`` always uses and s3fs uses past its block size) and ``DELETE`` of one object or
  many, and ``CopyObject``, written and removed atomically, so that test writes need no other server.

Everything else is answered with ``501 NotImplemented``. Authentication headers are accepted and not checked.

Every request is counted (by kind) with the body bytes sent, so a benchmark can say how many requests and bytes
one epoch took (:meth:`S3DirectoryServer.stats`). Objects carry an ``ETag`` made of the file's modification time and
size, as static web servers make them, so a file rewritten in place gets another one; a ``PUT`` answers with the
ETag that later ``HEAD`` and ``GET`` requests show.

In a thread of the calling process (tests)::

    with S3DirectoryServer('/tmp/objects') as server:
        options = server.storage_options()          # for s3fs, or the reader's storage_options
        ...

or in a process of its own (benchmarks: then it does not share the reader's interpreter), which prints
``listening on http://127.0.0.1:PORT``::

    python -m petastorm.test_util.s3_server --root /tmp/objects --port 9000

A subprocess is asked for its counters with ``GET /_stats`` (JSON) and resets them with ``POST /_stats``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import hashlib
import html
import json
import os
import posixpath
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ['S3DirectoryServer', 'ServerStats', 'main']

_RANGE = re.compile(r'^bytes=(\d*)-(\d*)$')
_MAX_KEYS = 1000
_HEADER_LIMIT = 64 * 1024
_STATS_PATH = '/_stats'
#: where the parts of multipart uploads wait, under the root (not a bucket: the name is refused as one).
_UPLOADS_DIR = '.s3tmp-uploads'


@dataclass
class ServerStats:
    """Requests and body bytes served since the last reset.

    Attributes:
        requests: requests by kind (``'GET'``, ``'HEAD'``, ``'LIST'``, ``'PUT'``, ``'DELETE'``, ``'OTHER'``); each
            request of a multipart upload counts as a ``'PUT'``.
        bytes_sent: body bytes answered (headers not counted), counted as each answer starts.
        ranged_gets: ``GET`` requests that carried a ``Range`` header.
        objects: ``GET`` and ``HEAD`` requests by object (``'bucket/key'``), found or not.
    """

    requests: Counter = field(default_factory=Counter)
    bytes_sent: int = 0
    ranged_gets: int = 0
    objects: Counter = field(default_factory=Counter)

    @property
    def total_requests(self) -> int:
        """Every request counted."""
        return sum(self.requests.values())

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain JSON values."""
        return {'requests': dict(self.requests), 'bytes_sent': self.bytes_sent, 'ranged_gets': self.ranged_gets,
                'total_requests': self.total_requests, 'objects': dict(self.objects)}


class _BadRequest(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers or {}


def _xml_error(code: str, message: str, resource: str = '') -> bytes:
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


class _Store:
    """The directory tree as buckets and keys."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def bucket_dir(self, bucket: str) -> str:
        if not bucket or bucket in ('.', '..', _UPLOADS_DIR) or '/' in bucket:
            raise _BadRequest(400, 'InvalidBucketName', f'invalid bucket name {bucket!r}')
        return os.path.join(self.root, bucket)

    def object_path(self, bucket: str, key: str) -> str:
        parts = key.split('/')
        if not key or any(part in ('.', '..') for part in parts):
            raise _BadRequest(400, 'InvalidArgument', f'invalid key {key!r}')
        return os.path.join(self.bucket_dir(bucket), *parts)

    def keys(self, bucket: str, prefix: str) -> list[tuple[str, os.stat_result]]:
        """Every key of ``bucket`` that starts with ``prefix``, sorted, with its file's stat."""
        base = self.bucket_dir(bucket)
        # Only the directories the prefix can lead to are walked.
        directory = posixpath.dirname(prefix)
        start = os.path.join(base, *directory.split('/')) if directory else base
        found = []
        for dirpath, dirnames, filenames in os.walk(start):
            relative_dir = os.path.relpath(dirpath, base).replace(os.sep, '/')
            relative_dir = '' if relative_dir == '.' else relative_dir + '/'
            dirnames.sort()
            for name in filenames:
                key = relative_dir + name
                if key.startswith(prefix) and not name.startswith('.s3tmp-'):
                    with contextlib.suppress(FileNotFoundError):
                        found.append((key, os.stat(os.path.join(dirpath, name))))
        found.sort(key=lambda pair: pair[0])
        return found


def _list_objects(store: _Store, bucket: str, query: dict[str, str]) -> bytes:
    if not os.path.isdir(store.bucket_dir(bucket)):
        raise _BadRequest(404, 'NoSuchBucket', f'the bucket {bucket} does not exist')
    version2 = query.get('list-type') == '2'
    prefix = query.get('prefix', '')
    delimiter = query.get('delimiter', '')
    try:
        max_keys = min(_MAX_KEYS, int(query.get('max-keys', _MAX_KEYS)))
    except ValueError as err:
        raise _BadRequest(400, 'InvalidArgument', f'max-keys: {err}') from err
    after = query.get('continuation-token') or query.get('start-after', '') if version2 else query.get('marker', '')
    contents: list[tuple[str, os.stat_result]] = []
    prefixes: list[str] = []
    truncated = False
    last = ''
    for key, stat in store.keys(bucket, prefix):
        if key <= after:
            continue
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                common = key[:cut + len(delimiter)]
                if common <= after or (prefixes and prefixes[-1] == common):
                    continue
                if len(contents) + len(prefixes) >= max_keys:
                    truncated = True
                    break
                prefixes.append(common)
                last = common
                continue
        if len(contents) + len(prefixes) >= max_keys:
            truncated = True
            break
        contents.append((key, stat))
        last = key
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
           f'<Name>{html.escape(bucket)}</Name><Prefix>{html.escape(prefix)}</Prefix>',
           f'<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{"true" if truncated else "false"}</IsTruncated>']
    if delimiter:
        out.append(f'<Delimiter>{html.escape(delimiter)}</Delimiter>')
    if version2:
        out.append(f'<KeyCount>{len(contents) + len(prefixes)}</KeyCount>')
        if query.get('continuation-token'):
            out.append(f'<ContinuationToken>{html.escape(query["continuation-token"])}</ContinuationToken>')
        if truncated:
            out.append(f'<NextContinuationToken>{html.escape(last)}</NextContinuationToken>')
    elif truncated:
        out.append(f'<NextMarker>{html.escape(last)}</NextMarker>')
    for key, stat in contents:
        out.append(f'<Contents><Key>{html.escape(key)}</Key><LastModified>{_iso_date(stat.st_mtime)}</LastModified>'
                   f'<ETag>{html.escape(_etag(stat))}</ETag><Size>{stat.st_size}</Size>'
                   f'<StorageClass>STANDARD</StorageClass></Contents>')
    for common in prefixes:
        out.append(f'<CommonPrefixes><Prefix>{html.escape(common)}</Prefix></CommonPrefixes>')
    out.append('</ListBucketResult>')
    return ''.join(out).encode()


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
            raise _BadRequest(416, 'InvalidRange', 'The requested range is not satisfiable')
        return max(0, size - length), size
    start = int(first)
    stop = size if not last else min(size, int(last) + 1)
    if start >= size or stop <= start:
        raise _BadRequest(416, 'InvalidRange', 'The requested range is not satisfiable')
    return start, stop


def _decode_aws_chunked(body: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (chunks of ``hex-size[;signature]`` CRLF data CRLF, then trailers)."""
    out: list[bytes] = []
    position = 0
    while True:
        line_end = body.index(b'\r\n', position)
        size = int(body[position:line_end].split(b';')[0], 16)
        position = line_end + 2
        if size == 0:
            return b''.join(out)
        out.append(body[position:position + size])
        position += size + 2


class _Connection:
    """One client connection: requests answered in order (HTTP/1.1 keep-alive)."""

    def __init__(self, server: S3DirectoryServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer

    async def serve(self) -> None:
        self.server._writers.add(self.writer)
        try:
            while await self._one_request():
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            self.server._writers.discard(self.writer)
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        if headers.get('expect', '').lower() == '100-continue':
            self.writer.write(b'HTTP/1.1 100 Continue\r\n\r\n')
        if headers.get('transfer-encoding', '').lower() == 'chunked':
            chunks: list[bytes] = []
            while True:
                size = int((await self.reader.readline()).split(b';')[0].strip() or b'0', 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b'\r\n', b'\n', b''):
                        pass
                    body = b''.join(chunks)
                    break
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readline()
        else:
            length = int(headers.get('content-length') or 0)
            body = await self.reader.readexactly(length) if length else b''
        if 'aws-chunked' in headers.get('content-encoding', '') or headers.get(
                'x-amz-content-sha256', '').startswith('STREAMING-'):
            body = _decode_aws_chunked(body)
        return body

    async def _one_request(self) -> bool:
        try:
            head = await self.reader.readuntil(b'\r\n\r\n')
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode('latin-1').split('\r\n')
        try:
            method, target, version = lines[0].split(' ', 2)
        except ValueError:
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ':' in line:
                name, value = line.split(':', 1)
                headers[name.strip().lower()] = value.strip()
        body = await self._read_body(headers) if method in ('PUT', 'POST') else b''
        keep_alive = headers.get('connection', '').lower() != 'close' and version == 'HTTP/1.1'
        try:
            await self.server._answer(self, method, target, headers, body)
        except Exception as err:  # a bug of this server or a bad request: an S3 error answer, not a dropped connection
            if not isinstance(err, _BadRequest):
                err = _BadRequest(500, 'InternalError', f'{type(err).__name__}: {err}')
            payload = _xml_error(err.code, str(err), target)
            self.send(err.status, {'Content-Type': 'application/xml', **err.headers},
                      payload if method != 'HEAD' else b'', len(payload))
        await self.writer.drain()
        return keep_alive

    def send(self, status: int, headers: dict[str, str], body: bytes = b'', content_length: int | None = None) -> None:
        reason = _REASONS.get(status, 'OK')
        length = len(body) if content_length is None else content_length
        head = [f'HTTP/1.1 {status} {reason}', f'Content-Length: {length}', 'Server: petastorm-test-s3',
                f'x-amz-request-id: {self.server._request_id()}']
        head.extend(f'{name}: {value}' for name, value in headers.items())
        self.writer.write(('\r\n'.join(head) + '\r\n\r\n').encode('latin-1') + body)


_REASONS = {200: 'OK', 204: 'No Content', 206: 'Partial Content', 304: 'Not Modified', 400: 'Bad Request',
            403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 409: 'Conflict', 412: 'Precondition Failed',
            416: 'Range Not Satisfiable', 500: 'Internal Server Error', 501: 'Not Implemented',
            503: 'Service Unavailable'}


class S3DirectoryServer:
    """The server on ``127.0.0.1`` in a thread of this process; a context manager (see the module docstring).

    Args:
        root: the directory whose subdirectories are the buckets (created if missing).
        port: the port to listen on (0: a free one, see :attr:`port`).
        buckets: buckets (directories) to create.
    """

    def __init__(self, root: str, port: int = 0, buckets: tuple[str, ...] = ()) -> None:
        self._store = _Store(root)
        os.makedirs(self._store.root, exist_ok=True)
        for bucket in buckets:
            os.makedirs(self._store.bucket_dir(bucket), exist_ok=True)
        self._stats = ServerStats()
        self._stats_lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()  # open client connections, cut by stop()
        self._uploads: dict[str, str] = {}  # upload id -> the object path it will become
        self._counter = 0
        self._requested_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def root(self) -> str:
        """The directory served."""
        return self._store.root

    @property
    def endpoint(self) -> str:
        """The server's URL, the ``endpoint_url`` of an S3 client."""
        return f'http://127.0.0.1:{self.port}'

    def storage_options(self, endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
        """s3fs ``storage_options`` for this server (or for ``endpoint``, a proxy in front of it)."""
        return {'key': 'test-key', 'secret': 'test-secret', 'endpoint_url': endpoint or self.endpoint, **extra}

    # -- running --------------------------------------------------------------------------------------------

    def start(self) -> S3DirectoryServer:
        """Start serving in a thread; returns once the port is bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # this thread's loop (gather() and the tasks look it up)
            self._loop = loop
            try:
                self._server = loop.run_until_complete(self._listen())
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as err:  # reported to start()
                failure.append(err)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._server.close()
                # Clients keep connections open between requests: cut them (wait_closed() waits for them), end
                # their tasks, and join the threads that listed directories.
                for writer in list(self._writers):
                    writer.transport.abort()
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(self._server.wait_closed())
                loop.run_until_complete(loop.shutdown_default_executor())
                loop.close()

        self._thread = threading.Thread(target=run, name='s3-directory-server', daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(lambda r, w: _Connection(self, r, w).serve(), '127.0.0.1',
                                          self._requested_port, limit=_HEADER_LIMIT, backlog=1024)

    def stop(self) -> None:
        """Stop serving and join the thread; idempotent."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> S3DirectoryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- counters -------------------------------------------------------------------------------------------

    def stats(self) -> ServerStats:
        """A copy of the counters since the last :meth:`reset_stats`."""
        with self._stats_lock:
            return ServerStats(Counter(self._stats.requests), self._stats.bytes_sent, self._stats.ranged_gets,
                               Counter(self._stats.objects))

    def reset_stats(self) -> ServerStats:
        """Zero the counters; returns what they held."""
        with self._stats_lock:
            old, self._stats = self._stats, ServerStats()
        return old

    def _count(self, kind: str, sent: int = 0, ranged: bool = False, obj: str | None = None) -> None:
        with self._stats_lock:
            self._stats.requests[kind] += 1
            self._stats.bytes_sent += sent
            self._stats.ranged_gets += ranged
            if obj is not None:
                self._stats.objects[obj] += 1

    def _request_id(self) -> str:
        self._counter += 1
        return f'{self._counter:016X}'

    # -- requests -------------------------------------------------------------------------------------------

    async def _answer(self, connection: _Connection, method: str, target: str, headers: dict[str, str],
                      body: bytes) -> None:
        parsed = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(parsed.path)
        query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        if path == _STATS_PATH:
            snapshot = self.reset_stats() if method == 'POST' else self.stats()
            connection.send(200, {'Content-Type': 'application/json'}, json.dumps(snapshot.as_dict()).encode())
            return
        bucket, _, key = path.lstrip('/').partition('/')
        if not bucket:
            self._count('OTHER')
            raise _BadRequest(501, 'NotImplemented', 'listing buckets is not implemented')
        if not key:
            await self._bucket_request(connection, method, bucket, query, body)
            return
        if method in ('GET', 'HEAD') and not (set(query) - {'versionId', 'partNumber'}):
            await self._get(connection, method, bucket, key, headers)
        elif method == 'PUT' and not query and 'x-amz-copy-source' in headers:
            self._copy(connection, bucket, key, headers['x-amz-copy-source'])
        elif method == 'PUT' and not query:
            self._put(connection, bucket, key, body)
        elif 'x-amz-copy-source' in headers:
            self._count('OTHER')
            raise _BadRequest(501, 'NotImplemented', 'copying into a part is not implemented by this test server')
        elif 'uploads' in query or 'uploadId' in query:
            self._multipart(connection, method, bucket, key, query, body)
        elif method == 'DELETE' and not query:
            self._count('DELETE')
            self._delete(bucket, key)
            connection.send(204, {})
        else:
            self._count('OTHER')
            raise _BadRequest(501, 'NotImplemented', f'{method} {target} is not implemented by this test server')

    async def _bucket_request(self, connection: _Connection, method: str, bucket: str, query: dict[str, str],
                              body: bytes) -> None:
        directory = self._store.bucket_dir(bucket)
        if method == 'HEAD':
            self._count('HEAD')
            connection.send(200 if os.path.isdir(directory) else 404, {})
        elif method == 'GET' and 'location' in query:
            self._count('OTHER')
            connection.send(200, {'Content-Type': 'application/xml'},
                            b'<?xml version="1.0" encoding="UTF-8"?><LocationConstraint '
                            b'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></LocationConstraint>')
        elif method == 'GET' and not (set(query) - {'list-type', 'prefix', 'delimiter', 'max-keys', 'marker',
                                                    'continuation-token', 'start-after', 'encoding-type',
                                                    'fetch-owner'}):
            self._count('LIST')
            loop = asyncio.get_running_loop()
            payload = await loop.run_in_executor(None, _list_objects, self._store, bucket, query)
            connection.send(200, {'Content-Type': 'application/xml'}, payload)
        elif method == 'PUT' and not query:
            self._count('PUT')
            os.makedirs(directory, exist_ok=True)
            connection.send(200, {})
        elif method == 'POST' and set(query) == {'delete'}:
            self._count('DELETE')
            connection.send(200, {'Content-Type': 'application/xml'}, self._delete_objects(bucket, body))
        else:
            self._count('OTHER')
            raise _BadRequest(501, 'NotImplemented', f'{method} on bucket {bucket} with {sorted(query)} is not '
                                                     f'implemented by this test server')

    async def _get(self, connection: _Connection, method: str, bucket: str, key: str,
                   headers: dict[str, str]) -> None:
        path = self._store.object_path(bucket, key)
        try:
            handle = open(path, 'rb')  # noqa: SIM115 - closed below, after sendfile
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self._count(method, obj=f'{bucket}/{key}')
            if not os.path.isdir(self._store.bucket_dir(bucket)):
                raise _BadRequest(404, 'NoSuchBucket', f'the bucket {bucket} does not exist') from None
            raise _BadRequest(404, 'NoSuchKey', 'The specified key does not exist.') from None
        with handle:
            stat = os.fstat(handle.fileno())
            etag = _etag(stat)
            answer = {'ETag': etag, 'Last-Modified': _http_date(stat.st_mtime), 'Accept-Ranges': 'bytes',
                      'Content-Type': 'application/octet-stream'}
            if not _etag_matches(headers.get('if-match'), etag, absent=True):
                self._count(method, obj=f'{bucket}/{key}')
                raise _BadRequest(412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did '
                                                             'not hold', {'ETag': etag})
            if _etag_matches(headers.get('if-none-match'), etag, absent=False):
                self._count(method, obj=f'{bucket}/{key}')
                connection.send(304, {'ETag': etag})
                return
            try:
                span = _byte_range(headers.get('range'), stat.st_size)
            except _BadRequest as err:
                self._count(method, obj=f'{bucket}/{key}')
                err.headers['Content-Range'] = f'bytes */{stat.st_size}'
                raise
            start, stop = span if span is not None else (0, stat.st_size)
            if span is not None:
                answer['Content-Range'] = f'bytes {start}-{stop - 1}/{stat.st_size}'
            # Counted before the answer leaves: a client that has its answer finds its request counted.
            self._count(method, stop - start if method == 'GET' else 0, ranged=span is not None and method == 'GET',
                        obj=f'{bucket}/{key}')
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
        return ('<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
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

    def _put(self, connection: _Connection, bucket: str, key: str, body: bytes) -> None:
        self._count('PUT')
        if not os.path.isdir(self._store.bucket_dir(bucket)):
            raise _BadRequest(404, 'NoSuchBucket', f'the bucket {bucket} does not exist')
        if key.endswith('/') and not body:
            # A directory marker (what pyarrow's create_dir writes): the directory, which lists as nothing.
            os.makedirs(self._store.object_path(bucket, key.rstrip('/')), exist_ok=True)
            connection.send(200, {'ETag': '"d41d8cd98f00b204e9800998ecf8427e"'})
            return
        path = self._store.object_path(bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix='.s3tmp-', dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, 'wb') as out:
                out.write(body)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        connection.send(200, {'ETag': _etag(os.stat(path))})

    def _copy(self, connection: _Connection, bucket: str, key: str, source: str) -> None:
        """``CopyObject`` (what s3fs's ``copy`` and ``mv`` send): the source file copied to the key, atomically."""
        self._count('PUT')
        source_bucket, _, source_key = urllib.parse.unquote(source.split('?')[0]).lstrip('/').partition('/')
        source_path = self._store.object_path(source_bucket, source_key)
        if not os.path.isfile(source_path):
            raise _BadRequest(404, 'NoSuchKey', f'the copy source {source_bucket}/{source_key} does not exist')
        if not os.path.isdir(self._store.bucket_dir(bucket)):
            raise _BadRequest(404, 'NoSuchBucket', f'the bucket {bucket} does not exist')
        path = self._store.object_path(bucket, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix='.s3tmp-', dir=os.path.dirname(path))
        os.close(fd)
        shutil.copyfile(source_path, temporary)
        os.replace(temporary, path)
        stat = os.stat(path)
        connection.send(200, {'Content-Type': 'application/xml'}, (
            '<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult><LastModified>'
            f'{_iso_date(stat.st_mtime)}</LastModified><ETag>{html.escape(_etag(stat))}</ETag></CopyObjectResult>'
        ).encode())

    def _multipart(self, connection: _Connection, method: str, bucket: str, key: str, query: dict[str, str],
                   body: bytes) -> None:
        """``CreateMultipartUpload``, ``UploadPart``, ``CompleteMultipartUpload`` and ``AbortMultipartUpload``.

        Parts wait in a directory of their own under the root; completing concatenates them into the object and
        replaces it atomically, as a single ``PUT`` does.
        """
        self._count('PUT')
        if not os.path.isdir(self._store.bucket_dir(bucket)):
            raise _BadRequest(404, 'NoSuchBucket', f'the bucket {bucket} does not exist')
        target = self._store.object_path(bucket, key)
        if method == 'POST' and 'uploads' in query:
            upload_id = uuid.uuid4().hex
            with self._stats_lock:
                self._uploads[upload_id] = target
            os.makedirs(self._upload_dir(upload_id))
            connection.send(200, {'Content-Type': 'application/xml'}, (
                '<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult '
                f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>{html.escape(bucket)}</Bucket>'
                f'<Key>{html.escape(key)}</Key><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>'
            ).encode())
            return
        upload_id = query.get('uploadId', '')
        with self._stats_lock:
            known = self._uploads.get(upload_id)
        if known != target:
            raise _BadRequest(404, 'NoSuchUpload', f'no upload {upload_id!r} of {bucket}/{key} is in progress')
        parts = self._upload_dir(upload_id)
        if method == 'PUT' and 'partNumber' in query:
            number = int(query['partNumber'])
            if not 1 <= number <= 10000:
                raise _BadRequest(400, 'InvalidArgument', f'partNumber {number} should be in 1..10000')
            with open(os.path.join(parts, f'{number:05d}'), 'wb') as out:
                out.write(body)
            connection.send(200, {'ETag': f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'})
        elif method == 'POST':
            import xml.etree.ElementTree as ElementTree

            numbers = sorted(int(element.text or 0) for element in ElementTree.fromstring(body).iter()
                             if element.tag.rsplit('}', 1)[-1] == 'PartNumber')
            missing = [n for n in numbers if not os.path.isfile(os.path.join(parts, f'{n:05d}'))]
            if not numbers or missing:
                raise _BadRequest(400, 'InvalidPart', f'parts {missing or numbers} of upload {upload_id} were not '
                                                      f'uploaded')
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix='.s3tmp-', dir=os.path.dirname(target))
            with os.fdopen(fd, 'wb') as out:
                for number in numbers:
                    with open(os.path.join(parts, f'{number:05d}'), 'rb') as part:
                        shutil.copyfileobj(part, out)
            os.replace(temporary, target)
            self._end_upload(upload_id)
            connection.send(200, {'Content-Type': 'application/xml'}, (
                '<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult '
                f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>{html.escape(bucket)}</Bucket>'
                f'<Key>{html.escape(key)}</Key><ETag>{html.escape(_etag(os.stat(target)))}</ETag>'
                '</CompleteMultipartUploadResult>').encode())
        elif method == 'DELETE':
            self._end_upload(upload_id)
            connection.send(204, {})
        else:
            raise _BadRequest(501, 'NotImplemented', f'{method} of upload {upload_id} is not implemented by this '
                                                     f'test server')

    def _upload_dir(self, upload_id: str) -> str:
        return os.path.join(self._store.root, _UPLOADS_DIR, upload_id)

    def _end_upload(self, upload_id: str) -> None:
        with self._stats_lock:
            self._uploads.pop(upload_id, None)
        shutil.rmtree(self._upload_dir(upload_id), ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """Serve a directory until interrupted (see the module docstring)."""
    parser = argparse.ArgumentParser(description='An S3-compatible server on 127.0.0.1 over a local directory.')
    parser.add_argument('--root', required=True, help='the directory whose subdirectories are the buckets')
    parser.add_argument('--port', type=int, default=0, help='the port (default: a free one)')
    parser.add_argument('--bucket', action='append', default=[], help='create this bucket (repeatable)')
    args = parser.parse_args(argv)
    server = S3DirectoryServer(args.root, args.port, tuple(args.bucket))

    async def serve() -> None:
        listening = await server._listen()
        server.port = listening.sockets[0].getsockname()[1]
        print(f'listening on {server.endpoint}', flush=True)
        async with listening:
            await listening.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == '__main__':
    main()
