"""An S3-compatible server on loopback for tests and benchmarks: moto's server mode, and a fault-injecting proxy.

(:class:`petastorm.test_util.s3_server.S3DirectoryServer` is the other server: objects are the files of a
directory, served much faster than moto; :func:`arrow_s3` is pyarrow's own S3 client for either.)

:class:`MotoServer` runs ``python -m moto.server`` in a subprocess on 127.0.0.1 with a free port.
:class:`FaultProxy` is a small HTTP/1.1 proxy in front of it that logs every request (method, path, ``Range``
header, status, body bytes) and, when given a :class:`FaultPlan`, answers some requests with a 503 ``SlowDown``,
drops the connection without answering, or cuts the body short, as flaky object stores and networks do.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.subprocesses import stop_process

BUCKET = 'petastorm-test'
ACCESS_KEY = 'AKIAPETASTORMTEST'
SECRET_KEY = 'petastorm-secret-never-shown-0123456789'


class MotoServer:
    """``moto.server`` in a subprocess on 127.0.0.1; use as a context manager.

    Args:
        enforce_auth: make the server check credentials (moto's ``INITIAL_NO_AUTH_ACTION_COUNT=0``), so that any
            key it does not know is refused.
    """

    def __init__(self, enforce_auth: bool = False):
        env = dict(os.environ)
        if enforce_auth:
            env['INITIAL_NO_AUTH_ACTION_COUNT'] = '0'
        self._log = tempfile.NamedTemporaryFile(prefix='moto-', suffix='.log', delete=False)  # noqa: SIM115
        self._process = subprocess.Popen([sys.executable, '-m', 'moto.server', '-H', '127.0.0.1', '-p', '0'],
                                         stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env)
        self.port = self._wait_for_port(timeout=60)
        self.endpoint = f'http://127.0.0.1:{self.port}'

    def _wait_for_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f'moto.server exited with {self._process.returncode}: {self.output()}')
            match = re.search(r'http://127\.0\.0\.1:(\d+)', self.output())
            if match:
                port = int(match.group(1))
                try:
                    socket.create_connection(('127.0.0.1', port), timeout=1).close()
                    return port
                except OSError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f'moto.server did not start within {timeout}s: {self.output()}')

    def output(self) -> str:
        with open(self._log.name, errors='replace') as f:
            return f.read()

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict:
        """s3fs options for this server (or for ``endpoint``, a proxy in front of it)."""
        return {'key': ACCESS_KEY, 'secret': SECRET_KEY, 'endpoint_url': endpoint or self.endpoint, **extra}

    def stop(self) -> None:
        stop_process(self._process)
        self._log.close()
        os.unlink(self._log.name)

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def arrow_s3(endpoint: str, **options: object):
    """pyarrow's ``S3FileSystem`` talking plain HTTP to ``endpoint`` (``http://127.0.0.1:PORT``)."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region='us-east-1', scheme='http',
                             endpoint_override=endpoint.removeprefix('http://'), **options)


@dataclass
class FaultPlan:
    """Every ``every``-th eligible request fails, cycling through ``kinds``.

    With ``first_try_only``, instead, the first request for each distinct (method, path, range) fails and its
    repetitions succeed, whatever the interleaving of concurrent requests.

    Kinds: ``'503'`` (an S3 ``SlowDown`` answer), ``'500'`` (``InternalError``), ``'drop'`` (close the
    connection without answering) and ``'truncate'`` (send the headers and half the body, then close).
    """

    every: int = 3
    kinds: tuple[str, ...] = ('503', 'drop', 'truncate')
    methods: tuple[str, ...] = ('GET', 'HEAD')
    first_try_only: bool = False
    seen: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    _keys: set[str] = field(default_factory=set)

    def next_fault(self, method: str, key: str = '') -> str | None:
        if method not in self.methods:
            return None
        self.seen += 1
        if self.first_try_only:
            if key in self._keys:
                return None
            self._keys.add(key)
        elif self.seen % self.every:
            return None
        # Cycle through the kinds in order of injection, so that a short run still sees each kind once.
        kind = self.kinds[sum(self.injected.values()) % len(self.kinds)]
        if kind == 'truncate' and method != 'GET':
            self.seen -= 1  # only a GET has a body to cut: try again on the next request
            return None
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return kind


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    fault: str | None


_HOP_BY_HOP = {'connection', 'keep-alive', 'transfer-encoding', 'proxy-connection', 'te', 'trailer', 'upgrade'}
_ERROR_BODIES = {
    '503': (503, b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your '
                 b'request rate.</Message></Error>'),
    '500': (500, b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered '
                 b'an internal error. Please try again.</Message></Error>'),
}


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        pass

    def _read_body(self) -> bytes:
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b';')[0].strip() or b'0', 16)
                if size == 0:
                    while self.rfile.readline() not in (b'\r\n', b'\n', b''):
                        pass
                    return b''.join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get('Content-Length') or 0)
        return self.rfile.read(length) if length else b''

    def _proxy(self) -> None:
        proxy = self.server.proxy
        proxy.arrive(self.path)
        body = self._read_body()
        requested_range = self.headers.get('Range')
        fault = proxy.next_fault(self.command, f'{self.command} {self.path} {requested_range}')
        if fault == 'drop':
            proxy.record(Request(self.command, self.path, requested_range, 0, 0, fault))
            self.close_connection = True
            return
        if fault in _ERROR_BODIES:
            status, payload = _ERROR_BODIES[fault]
            self.send_response(status)
            self.send_header('Content-Type', 'application/xml')
            self.send_header('Content-Length', str(len(payload) if self.command != 'HEAD' else 0))
            self.end_headers()
            if self.command != 'HEAD':
                self.wfile.write(payload)
            proxy.record(Request(self.command, self.path, requested_range, status, 0, fault))
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in ('PUT', 'POST'):
            headers['Content-Length'] = str(len(body))
        upstream = http.client.HTTPConnection('127.0.0.1', proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            response_headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        finally:
            upstream.close()
        self.send_response(response.status)
        for key, value in response_headers:
            if key.lower() != 'content-length' or self.command == 'HEAD':
                self.send_header(key, value)
        if self.command != 'HEAD':
            self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        sent = 0
        if self.command != 'HEAD':
            if fault == 'truncate' and len(data) > 1:
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                sent = len(data) // 2
            else:
                self.wfile.write(data)
                sent = len(data)
        proxy.record(Request(self.command, self.path, requested_range, response.status, sent, fault))

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _proxy  # noqa: N815 - http.server's names


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream_port``; use as a context manager.

    Attributes:
        endpoint: the proxy's URL, to use as the S3 endpoint.
        requests: every request served (or failed on purpose), in order.
        plan: the :class:`FaultPlan` in force, or None for none.
        holds: of each request held (:meth:`hold_until`), in order: whether the hold ran out before the request
            it waited for came.
    """

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.requests: list[Request] = []
        self.plan: FaultPlan | None = None
        self.holds: list[bool] = []
        self._hold: tuple[str, str, float] | None = None
        self._came = threading.Event()
        self._lock = threading.Lock()
        self._server = _ProxyServer(('127.0.0.1', 0), _ProxyHandler)
        self._server.proxy = self
        self.endpoint = f'http://127.0.0.1:{self._server.server_address[1]}'
        self._thread = threading.Thread(target=self._server.serve_forever, name='fault-proxy', daemon=True)
        self._thread.start()

    def hold_until(self, held: str, until: str, timeout: float) -> None:
        """Make requests whose path holds ``held`` wait (at most ``timeout`` seconds) until a request whose path
        holds ``until`` has come: two reads made at once both pass, one made after the other waits it out."""
        with self._lock:
            self._hold = (held, until, timeout)
            self._came.clear()
            self.holds = []

    def arrive(self, path: str) -> None:
        """A request for ``path`` came: it may release held ones, or be held itself (:meth:`hold_until`)."""
        with self._lock:
            hold = self._hold
        if hold is None:
            return
        held, until, timeout = hold
        if until in path:
            self._came.set()
        if held in path:
            came = self._came.wait(timeout)
            with self._lock:
                self.holds.append(not came)

    def next_fault(self, method: str, key: str) -> str | None:
        with self._lock:
            return self.plan.next_fault(method, key) if self.plan is not None else None

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def reset(self, plan: FaultPlan | None = None) -> None:
        """Forget the request log and use ``plan`` from now on."""
        with self._lock:
            self.requests = []
            self.plan = plan

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
