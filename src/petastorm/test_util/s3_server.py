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

Throttling can be turned on (:meth:`S3DirectoryServer.throttle`): past a rate of requests per second (a token
bucket with a burst), requests are answered ``503 SlowDown`` (or ``429 Too Many Requests``) as a busy object
store answers them, and counted apart.

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

This module is the HTTP side (connections, request bodies, the loop in its thread, the counters); the S3 requests
are answered in ``petastorm.test_util._s3_requests``, over the directory seen as buckets and keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from petastorm.test_util._s3_requests import ErrorReply, S3Requests, Store, xml_error

__all__ = ['S3DirectoryServer', 'ServerStats', 'main']

_HEADER_LIMIT = 64 * 1024
_STATS_PATH = '/_stats'


@dataclass
class ServerStats:
    """Requests and body bytes served since the last reset.

    Attributes:
        requests: requests by kind (``'GET'``, ``'HEAD'``, ``'LIST'``, ``'PUT'``, ``'DELETE'``, ``'OTHER'``); each
            request of a multipart upload counts as a ``'PUT'``.
        bytes_sent: body bytes answered (headers not counted), counted as each answer starts.
        ranged_gets: ``GET`` requests that carried a ``Range`` header.
        objects: ``GET`` and ``HEAD`` requests by object (``'bucket/key'``), found or not.
        throttled: requests refused by the throttling of :meth:`S3DirectoryServer.throttle` (not in ``requests``).
    """

    requests: Counter = field(default_factory=Counter)
    bytes_sent: int = 0
    ranged_gets: int = 0
    objects: Counter = field(default_factory=Counter)
    throttled: int = 0

    @property
    def total_requests(self) -> int:
        """Every request counted."""
        return sum(self.requests.values())

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain JSON values."""
        return {'requests': dict(self.requests), 'bytes_sent': self.bytes_sent, 'ranged_gets': self.ranged_gets,
                'total_requests': self.total_requests, 'objects': dict(self.objects), 'throttled': self.throttled}



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
            if not isinstance(err, ErrorReply):
                err = ErrorReply(500, 'InternalError', f'{type(err).__name__}: {err}')
            payload = xml_error(err.code, str(err), target)
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
            416: 'Range Not Satisfiable', 429: 'Too Many Requests', 500: 'Internal Server Error',
            501: 'Not Implemented',
            503: 'Service Unavailable'}



class S3DirectoryServer:
    """The server on ``127.0.0.1`` in a thread of this process; a context manager (see the module docstring).

    Args:
        root: the directory whose subdirectories are the buckets (created if missing).
        port: the port to listen on (0: a free one, see :attr:`port`).
        buckets: buckets (directories) to create.
    """

    def __init__(self, root: str, port: int = 0, buckets: tuple[str, ...] = ()) -> None:
        self._store = Store(root)
        os.makedirs(self._store.root, exist_ok=True)
        for bucket in buckets:
            os.makedirs(self._store.bucket_dir(bucket), exist_ok=True)
        self._stats = ServerStats()
        self._stats_lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()  # open client connections, cut by stop()
        self._requests = S3Requests(self._store, self._count)
        self._counter = 0
        self._requested_port = port
        self._bucket: _TokenBucket | None = None
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

    def throttle(self, rate: float | None, burst: int = 10, status: int = 503) -> None:
        """Refuse requests past ``rate`` per second (after a burst of ``burst``) with ``status``; None: stop.

        Args:
            rate: requests answered per second at most, on average (None: no throttling).
            burst: requests answered at once before the rate applies.
            status: 503 (S3's ``SlowDown``) or 429 (``Too Many Requests``).
        """
        if status not in _THROTTLE_ERRORS:
            raise ValueError(f'status must be one of {sorted(_THROTTLE_ERRORS)}, got {status}')
        self._bucket = None if rate is None else _TokenBucket(rate, burst, status)

    # -- counters -------------------------------------------------------------------------------------------

    def stats(self) -> ServerStats:
        """A copy of the counters since the last :meth:`reset_stats`."""
        with self._stats_lock:
            return ServerStats(Counter(self._stats.requests), self._stats.bytes_sent, self._stats.ranged_gets,
                               Counter(self._stats.objects), self._stats.throttled)

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
        bucket = self._bucket
        if bucket is not None and not bucket.take():
            with self._stats_lock:
                self._stats.throttled += 1
            code, message = _THROTTLE_ERRORS[bucket.status]
            raise ErrorReply(bucket.status, code, message)
        await self._requests.answer(connection, method, target, path, query, headers, body)



_THROTTLE_ERRORS = {503: ('SlowDown', 'Please reduce your request rate.'),
                    429: ('TooManyRequests', 'Too Many Requests: please reduce your request rate.')}


class _TokenBucket:
    """``rate`` tokens a second, up to ``burst`` saved: a request takes one, or is refused (the server's loop only)."""

    def __init__(self, rate: float, burst: int, status: int) -> None:
        self.rate = rate
        self.burst = burst
        self.status = status
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def main(argv: list[str] | None = None) -> None:
    """Serve a directory until interrupted (see the module docstring)."""
    parser = argparse.ArgumentParser(description='An S3-compatible server on 127.0.0.1 over a local directory.')
    parser.add_argument('--root', required=True, help='the directory whose subdirectories are the buckets')
    parser.add_argument('--port', type=int, default=0, help='the port (default: a free one)')
    parser.add_argument('--bucket', action='append', default=[], help='create this bucket (repeatable)')
    parser.add_argument('--throttle-rate', type=float, default=None,
                        help='answer 503 SlowDown past this many requests per second (default: never)')
    parser.add_argument('--throttle-burst', type=int, default=10, help='requests at once before the rate applies')
    args = parser.parse_args(argv)
    server = S3DirectoryServer(args.root, args.port, tuple(args.bucket))
    if args.throttle_rate is not None:
        server.throttle(args.throttle_rate, args.throttle_burst)

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
