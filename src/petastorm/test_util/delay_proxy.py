"""A TCP proxy on loopback that adds one-way latency and caps bandwidth: a slow network without root or ``netem``.

Every byte that passes the proxy, in either direction, leaves it ``delay`` seconds after it arrived, so a request
and its answer take one round trip more than without the proxy (``2 * delay``). Opening a connection costs one
round trip more, as TCP's handshake does: the kernel accepts at once, so the proxy holds a new connection's first
bytes until ``2 * delay`` after it was accepted (the first request of a connection answers after ``4 * delay``).
Optional limits model the rest of a wide-area path:

* ``bandwidth``: bytes per second shared by every connection and both directions (one network link);
* ``window``: bytes one connection may have in flight in one direction (a TCP window that does not grow
  further): a connection then moves at most ``window / (2 * delay)`` bytes per second, as on a real
  long-distance path, so that reading with several connections at once is what pays.

It works below HTTP, so any client (pyarrow's S3 client, botocore, a browser) sees the same latency, and it counts
connections and bytes in each direction.

In a thread of this process (tests)::

    with DelayProxy(('127.0.0.1', server_port), delay=0.010) as proxy:
        options = {'endpoint_url': proxy.endpoint, ...}

In a process of its own (benchmarks), printing ``listening on http://127.0.0.1:PORT``::

    python -m petastorm.test_util.delay_proxy --upstream 127.0.0.1:9000 --delay-ms 10 [--bandwidth-mbps 1000]

A proxy run as a process answers ``GET /stats`` (JSON counters) and ``POST /stats`` (read and reset) on its
``--control-port``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
from collections import deque
from dataclasses import dataclass

__all__ = ['DelayProxy', 'ProxyStats', 'main']

#: Bytes buffered in one direction of a connection before the proxy stops reading from its sender.
_MAX_PENDING = 32 << 20


@dataclass
class ProxyStats:
    """What passed the proxy since the last reset.

    Attributes:
        connections: connections accepted.
        bytes_up: bytes from clients to the server.
        bytes_down: bytes from the server to clients.
    """

    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as plain JSON values."""
        return {'connections': self.connections, 'bytes_up': self.bytes_up, 'bytes_down': self.bytes_down}


class _Link:
    """The shared link: when the next byte may leave, at ``bandwidth`` bytes per second (None: unlimited)."""

    def __init__(self, bandwidth: float | None) -> None:
        self.bandwidth = bandwidth
        self._free_at = 0.0

    def departure(self, ready: float, size: int) -> float:
        if not self.bandwidth:
            return ready
        start = max(ready, self._free_at)
        self._free_at = start + size / self.bandwidth
        return self._free_at


class _Direction:
    """One direction of a proxied connection: a delay line from a source transport to a sink transport."""

    def __init__(self, proxy: DelayProxy, loop: asyncio.AbstractEventLoop, upstream: bool) -> None:
        self.proxy = proxy
        self.loop = loop
        self.upstream = upstream
        self.source: asyncio.Transport | None = None
        self.sink: asyncio.Transport | None = None
        self.line: deque[tuple[float, bytes]] = deque()  # bytes on their way: (when they arrive, bytes)
        self.waiting: deque[bytes] = deque()  # bytes the window holds back until acknowledgements free it
        self.waiting_bytes = 0
        self.in_flight = 0  # bytes sent and not yet acknowledged
        self.timer: asyncio.TimerHandle | None = None
        self.source_paused = False
        self.sink_paused = False
        self.eof_due: float | None = None  # when the sender's end of stream reaches the receiver
        self.not_before = 0.0  # the client's bytes wait for the handshake's round trip (loop time)

    def _limit(self) -> int:
        return self.proxy.window or _MAX_PENDING

    def arrived(self, data: bytes) -> None:
        proxy = self.proxy
        size = len(data)
        if self.upstream:
            proxy._stats.bytes_up += size
        else:
            proxy._stats.bytes_down += size
        self.waiting.append(data)
        self.waiting_bytes += size
        self._admit()
        if self.in_flight + self.waiting_bytes >= 2 * self._limit() and self.source is not None \
                and not self.source_paused:
            self.source.pause_reading()  # the sender's kernel buffers fill up, and it slows down
            self.source_paused = True
        self._schedule()

    def _admit(self) -> None:
        """Send the waiting bytes the window lets through (all of them without a window)."""
        window = self.proxy.window
        start = max(self.loop.time(), self.not_before)
        while self.waiting and (not window or self.in_flight < window):
            data = self.waiting.popleft()
            if window and self.in_flight + len(data) > window:
                room = window - self.in_flight
                data, rest = data[:room], data[room:]
                self.waiting.appendleft(rest)
            self.waiting_bytes -= len(data)
            self.in_flight += len(data)
            self.line.append((self.proxy._link.departure(start + self.proxy.delay, len(data)), data))

    def ended(self) -> None:
        """The sender closed its side: close the receiver's one delay later, after the bytes sent before."""
        self.eof_due = self.loop.time() + self.proxy.delay
        self._schedule()

    def _schedule(self) -> None:
        if self.timer is not None or self.sink_paused or self.sink is None:
            return  # a release is due already, the receiver is full, or the server's socket is not open yet
        if self.line:
            self.timer = self.loop.call_at(self.line[0][0], self._release)
        elif self.eof_due is not None and not self.waiting:
            self.timer = self.loop.call_at(self.eof_due, self._close_sink)

    def _close_sink(self) -> None:
        self.timer = None
        if self.sink is not None and not self.sink.is_closing():
            if not self.sink.can_write_eof():
                self.sink.close()
                return
            try:
                self.sink.write_eof()
            except OSError:  # the receiver went away meanwhile (ENOTCONN): nothing is left to close politely
                self.sink.close()

    def _release(self) -> None:
        self.timer = None
        if self.sink is None or self.sink.is_closing():
            self.line.clear()
            return
        now = self.loop.time()
        chunks = []
        while self.line and self.line[0][0] <= now:
            _, data = self.line.popleft()
            chunks.append(data)
        if chunks:
            released = sum(len(chunk) for chunk in chunks)
            self.sink.write(b''.join(chunks) if len(chunks) > 1 else chunks[0])
            if self.proxy.window and self.proxy.delay:
                # A window is freed by the receiver's acknowledgement, which takes one more delay to come back:
                # the bytes stay "in flight" for a whole round trip, as in TCP.
                self.loop.call_later(self.proxy.delay, self._acknowledged, released)
            else:
                self._acknowledged(released)
        self._schedule()

    def _acknowledged(self, size: int) -> None:
        self.in_flight -= size
        if self.waiting:
            self._admit()
            self._schedule()
        if self.source_paused and self.in_flight + self.waiting_bytes < self._limit() and self.source is not None:
            self.source.resume_reading()
            self.source_paused = False

    def sink_pause(self) -> None:
        self.sink_paused = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def sink_resume(self) -> None:
        self.sink_paused = False
        self._schedule()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.line.clear()
        self.waiting.clear()


class _Side(asyncio.Protocol):
    """The protocol of one socket of a proxied connection (the client's, or the server's)."""

    def __init__(self, inbound: _Direction, outbound: _Direction, peer: list[_Side]) -> None:
        self.inbound = inbound    # what this socket receives, on its way to the other socket
        self.outbound = outbound  # what goes out on this socket
        self.peer = peer
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.inbound.proxy._open.add(transport)
        self.inbound.source = transport
        self.outbound.sink = transport
        transport.set_write_buffer_limits(high=4 << 20)

    def data_received(self, data: bytes) -> None:
        self.inbound.arrived(data)

    def eof_received(self) -> bool:
        self.inbound.ended()
        return True  # keep our side open for writing until the peer's bytes are delivered

    def pause_writing(self) -> None:
        self.outbound.sink_pause()

    def resume_writing(self) -> None:
        self.outbound.sink_resume()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.inbound.proxy._open.discard(self.transport)
        self.inbound.close()
        self.outbound.close()
        for side in self.peer:
            if side is not self and side.transport is not None and not side.transport.is_closing():
                # The other socket goes down one delay later, as the news travels.
                loop = self.inbound.loop
                loop.call_later(self.inbound.proxy.delay, side.transport.close)


class DelayProxy:
    """The proxy in a thread of this process; a context manager (see the module docstring).

    Args:
        upstream: ``(host, port)`` of the server.
        delay: seconds of one-way latency added to every byte in each direction.
        bandwidth: bytes per second shared by every connection and direction; None for no limit.
        window: bytes one connection may have in flight in one direction; None for no limit.
        port: the port to listen on (0: a free one).
    """

    def __init__(self, upstream: tuple[str, int], delay: float = 0.0, bandwidth: float | None = None,
                 window: int | None = None, port: int = 0) -> None:
        if delay < 0:
            raise ValueError(f'{delay=} should not be negative')
        self.upstream = upstream
        self.delay = delay
        self.window = window
        self._link = _Link(bandwidth)
        self._stats = ProxyStats()
        self._requested_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.Transport] = set()  # the sockets of proxied connections, closed by stop()
        self.port = 0

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``, the URL to give a client instead of the server's."""
        return f'http://127.0.0.1:{self.port}'

    @property
    def bandwidth(self) -> float | None:
        """The link's bytes per second (None: unlimited)."""
        return self._link.bandwidth

    def stats(self) -> ProxyStats:
        """A copy of the counters."""
        return ProxyStats(self._stats.connections, self._stats.bytes_up, self._stats.bytes_down)

    def reset_stats(self) -> ProxyStats:
        """Zero the counters; returns what they held."""
        old, self._stats = self._stats, ProxyStats()
        return old

    async def listen(self) -> asyncio.AbstractServer:
        """Start listening on the running loop (what :meth:`start` and the command line do)."""
        loop = asyncio.get_running_loop()

        def client_protocol() -> _Side:
            self._stats.connections += 1
            up, down = _Direction(self, loop, upstream=True), _Direction(self, loop, upstream=False)
            up.not_before = loop.time() + 2 * self.delay
            sides: list[_Side] = []
            client = _Side(up, down, sides)
            sides.append(client)
            # The server's socket is opened when the client's connection arrives; the client's first bytes wait
            # in the delay line meanwhile (the connection to the server is local, the delay is the proxy's).

            async def connect() -> None:
                try:
                    _, server = await loop.create_connection(lambda: _Side(down, up, sides), *self.upstream)
                except OSError:
                    if client.transport is not None:
                        client.transport.close()
                    return
                sides.append(server)
                up._schedule()

            loop.create_task(connect())
            return client

        self._server = await loop.create_server(client_protocol, '127.0.0.1', self._requested_port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self._server

    def start(self) -> DelayProxy:
        """Start the proxy in a thread; returns once it listens."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)  # this thread's loop (gather() and the tasks look it up)
            self._loop = loop
            try:
                server = loop.run_until_complete(self.listen())
            except BaseException as err:  # reported to start()
                failure.append(err)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                # Clients keep connections open between requests: cut them, or wait_closed() waits for them.
                for transport in list(self._open):
                    transport.abort()
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(server.wait_closed())
                loop.close()

        self._thread = threading.Thread(target=run, name='delay-proxy', daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop the proxy and join its thread; idempotent."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _control(proxy: DelayProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """``GET /stats`` and ``POST /stats`` (read and reset) for a proxy run as a process."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        request = await reader.readuntil(b'\r\n\r\n')
        method = request.split(b' ', 1)[0]
        snapshot = proxy.reset_stats() if method == b'POST' else proxy.stats()
        body = json.dumps(snapshot.as_dict()).encode()
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n'
                     b'Content-Length: ' + str(len(body)).encode() + b'\r\n\r\n' + body)
        await writer.drain()
    writer.close()


def main(argv: list[str] | None = None) -> None:
    """Run the proxy until interrupted (see the module docstring)."""
    parser = argparse.ArgumentParser(description='A TCP proxy that adds latency and caps bandwidth.')
    parser.add_argument('--upstream', required=True, help='HOST:PORT of the server')
    parser.add_argument('--port', type=int, default=0, help='the port to listen on (default: a free one)')
    parser.add_argument('--delay-ms', type=float, default=0.0, help='one-way latency in milliseconds')
    parser.add_argument('--bandwidth-mbps', type=float, default=None, help='link bandwidth in megabytes/s')
    parser.add_argument('--window-kb', type=int, default=None, help='bytes in flight per connection direction')
    parser.add_argument('--control-port', type=int, default=None, help='port of the /stats endpoint')
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(':')
    proxy = DelayProxy((host or '127.0.0.1', int(port)), args.delay_ms / 1000,
                       args.bandwidth_mbps * 1e6 if args.bandwidth_mbps else None,
                       args.window_kb * 1024 if args.window_kb else None, args.port)

    async def serve() -> None:
        server = await proxy.listen()
        line = f'listening on {proxy.endpoint}'
        if args.control_port is not None:
            control = await asyncio.start_server(lambda r, w: _control(proxy, r, w), '127.0.0.1', args.control_port)
            line += f' control on http://127.0.0.1:{control.sockets[0].getsockname()[1]}'
        print(line, flush=True)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == '__main__':
    main()
