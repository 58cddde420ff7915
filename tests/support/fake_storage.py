"""Storage that fails on demand, for the filesystem tests: no server, no cluster.

:class:`FakeStore` is fsspec's shared in-memory store with injected failures and a log of the byte ranges read;
:class:`ClientError` looks like botocore's; :func:`site_xml` and :data:`HA_SITE` write a Hadoop configuration and
:class:`StubConnector` connects "namenodes" to local filesystems, some of them down or broken. The fixtures built
on them (``memory_url``, ``memory_dataset``, ``hadoop_home``, ``stub_connector``) are in
``tests/storage/conftest.py``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from fsspec.implementations.memory import MemoryFileSystem

from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.hdfs.namenode import HdfsConnector
from petastorm.unischema import Unischema, UnischemaField

#: a secret the storage options carry; no message may show it.
SECRET = 'sup3r-s3cret-value-xyz'

FsSchema = Unischema('FsSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vector', np.float32, (8,), NdarrayCodec(), False),
])


def fs_rows(n: int):
    return ({'id': i, 'vector': np.full(8, i, np.float32)} for i in range(n))


class ClientError(Exception):
    """Looks like botocore's ClientError: a ``response`` dict with the error code and HTTP status."""

    def __init__(self, code: str, status: int, message: str = ''):
        super().__init__(f'An error occurred ({code}): {message}')
        self.response = {'Error': {'Code': code, 'Message': message}, 'ResponseMetadata': {'HTTPStatusCode': status}}


class FakeStore(MemoryFileSystem):
    """The shared in-memory store, with injectable failures and a log of byte ranges read."""

    protocol = 'memory'

    def __init__(self, *args, info_error=None, cat_errors=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.info_error = info_error
        self.cat_errors = list(cat_errors)  # raised by successive cat_file calls (None: succeed)
        self.ranges: list[tuple[str, int | None, int | None]] = []

    def info(self, path, **kwargs):
        if self.info_error is not None:
            raise self.info_error
        return super().info(path, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        if self.cat_errors:
            error = self.cat_errors.pop(0)
            if error is not None:
                raise error
        self.ranges.append((path, start, end))
        return super().cat_file(path, start=start, end=end, **kwargs)


def fake_store(**kwargs) -> FakeStore:
    """A new :class:`FakeStore` (not fsspec's cached instance), so that its failures are this test's only."""
    return FakeStore(skip_instance_cache=True, **kwargs)


def assert_secret_hidden(error: BaseException) -> None:
    """No exception that a traceback of ``error`` would print shows the secret."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        assert SECRET not in f'{error!s} {error!r}', f'secret shown by {type(error).__name__}'
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def site_xml(properties: dict[str, str]) -> str:
    """A Hadoop ``*-site.xml`` file's text holding ``properties``."""
    body = ''.join(f'<property><name>{k}</name><value>{v}</value></property>' for k, v in properties.items())
    return f'<?xml version="1.0"?><configuration>{body}</configuration>'


#: an HA nameservice ``ns1`` of two namenodes, as ``hdfs-site.xml`` declares it.
HA_SITE = {
    'dfs.nameservices': 'ns1',
    'dfs.ha.namenodes.ns1': 'nn1, nn2',
    'dfs.namenode.rpc-address.ns1.nn1': 'nn1.example.com:8020',
    'dfs.namenode.rpc-address.ns1.nn2': 'nn2.example.com:8020',
}


class StubConnector(HdfsConnector):
    """Connects to local filesystems; namenodes listed in ``down`` refuse, those in ``broken`` fail every call."""

    down: set[str] = set()
    broken: set[str] = set()
    connected: list[str] = []

    @classmethod
    def hdfs_connect_namenode(cls, url, driver='libhdfs3', user=None):
        cls.connected.append(url.netloc)
        if url.netloc in cls.down:
            raise OSError(f'{url.netloc} refused the connection')
        if url.netloc in cls.broken:
            return pafs.PyFileSystem(pafs.FSSpecHandler(fake_store(info_error=OSError('StandbyException'))))
        return pafs.LocalFileSystem()
