"""Fixtures of the storage tests that more than one file uses; the subfolders mirror the source's packages.

``fs/`` tests :mod:`petastorm.fs` (URLs, errors and retries, ranged reads, HDFS, Petastorm's ``fs_utils``, S3 and its
clients), ``store/`` :mod:`petastorm.store` (opening any store, data files, remote planning, schema unification,
damaged stores), ``metadata/`` :mod:`petastorm.metadata` (dataset metadata, row-group indexes), ``tables/``
:mod:`petastorm.tables`, ``cache/`` :mod:`petastorm.cache` (the local disk cache, the decoded cache, footers kept in
a cache), ``write/`` the writers and ``clouds/`` GCS and Azure against their emulators (its own conftest starts
them). Every subfolder inherits these fixtures:

* The filesystem tests (``fs/test_fs_*.py``): an in-memory dataset, a ``$HADOOP_HOME`` and a stand-in HDFS
  connector (:mod:`support.fake_storage`).
* The S3 tests (``fs/test_s3_*.py``, ``tables/test_tables_s3.py``): one moto server for the whole run, the
  fault-injecting proxy in front of it, and a Petastorm dataset on it (:mod:`support.s3_loopback`,
  :mod:`support.s3_datasets`).
* The local disk cache tests (``cache/test_local_disk_cache_*.py``): a dataset of many small row groups
  (:mod:`support.cache_stores`).
"""

from __future__ import annotations

import uuid

import fsspec
import pytest

import petastorm.fs.hadoop as hadoop
from petastorm import write_dataset
from support.cache_stores import row_group_count, write_cache_store
from support.fake_storage import HA_SITE, FsSchema, StubConnector, fs_rows, site_xml
from support.s3_datasets import ROWS, S3Schema, s3_row
from support.s3_loopback import BUCKET, FaultProxy, MotoServer

# -- the filesystem tests --------------------------------------------------------------------------------------


@pytest.fixture
def memory_url():
    """A fresh ``memory://`` dataset URL, removed afterwards."""
    root = f'/petastorm-tests/{uuid.uuid4().hex}'
    yield f'memory://{root}'
    memory = fsspec.filesystem('memory')
    if memory.exists(root):
        memory.rm(root, recursive=True)


@pytest.fixture
def memory_dataset(memory_url):
    """200 rows of :data:`support.fake_storage.FsSchema` at ``memory_url``, in several row groups."""
    write_dataset(memory_url, FsSchema, fs_rows(200), row_group_size_mb=0.002)
    return memory_url


@pytest.fixture
def hadoop_home(tmp_path, monkeypatch):
    """A ``$HADOOP_HOME`` whose configuration has ``fs.defaultFS=hdfs://ns1``, an HA nameservice."""
    conf = tmp_path / 'hadoop' / 'etc' / 'hadoop'
    conf.mkdir(parents=True)
    (conf / 'core-site.xml').write_text(site_xml({'fs.defaultFS': 'hdfs://ns1'}))
    (conf / 'hdfs-site.xml').write_text(site_xml(HA_SITE))
    for variable in hadoop.HADOOP_ENV_VARS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv('HADOOP_HOME', str(tmp_path / 'hadoop'))
    return conf


@pytest.fixture
def stub_connector():
    """:class:`support.fake_storage.StubConnector`, with no namenode down or broken and none connected yet."""
    StubConnector.down, StubConnector.broken, StubConnector.connected = set(), set(), []
    return StubConnector


# -- the S3 tests ----------------------------------------------------------------------------------------------


@pytest.fixture(scope='session')
def moto():
    """moto's S3 server on loopback, with the bucket :data:`support.s3_loopback.BUCKET`."""
    s3fs = pytest.importorskip('s3fs')
    with MotoServer() as server:
        s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True).mkdir(BUCKET)
        yield server


@pytest.fixture(scope='session')
def proxy(moto):
    """The fault-injecting proxy in front of the server, logging every request."""
    with FaultProxy(moto.port) as running:
        yield running


@pytest.fixture
def clean_proxy(proxy):
    """The proxy with an empty log and no faults planned, before and after the test."""
    proxy.reset()
    yield proxy
    proxy.reset()


@pytest.fixture(scope='session')
def s3_dataset(moto):
    """A Petastorm dataset on S3: 300 rows in several files and row groups."""
    url = f's3://{BUCKET}/petastorm-dataset'
    result = write_dataset(url, S3Schema, (s3_row(i) for i in range(ROWS)), row_group_size_mb=0.005,
                           file_size_mb=0.02, storage_options=moto.storage_options())
    assert len(result.files) > 1
    return url


# -- the local disk cache tests --------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def cache_dataset_url(tmp_path_factory):
    """The dataset of :mod:`support.cache_stores`, written once per test module."""
    target = write_cache_store(tmp_path_factory.mktemp('cache') / 'ds')
    assert row_group_count(target) >= 10, 'these tests need many row groups'
    return target
