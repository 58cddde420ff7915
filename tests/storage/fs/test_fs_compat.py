"""Petastorm's filesystem API (``petastorm.fs_utils``): ``FilesystemResolver`` for local, object-store and HDFS
URLs, ``get_filesystem_and_path_or_paths`` and ``get_dataset_path``.

Everything here runs without a server: ``memory://`` and fsspec filesystems made in the test (see
:mod:`support.fake_storage`) stand in for remote storage. HDFS goes to local filesystems through a stand-in connector.
"""

from __future__ import annotations

import pickle
from urllib.parse import urlparse

import cloudpickle
import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from petastorm.fs import path_to_url
from petastorm.fs.compat import FilesystemResolver
from petastorm.fs_utils import get_dataset_path, get_filesystem_and_path_or_paths
from support.fake_storage import SECRET


def test_filesystem_resolver_for_local_urls(tmp_path):
    resolver = FilesystemResolver(path_to_url(str(tmp_path)))
    assert resolver.get_dataset_path() == str(tmp_path)
    assert resolver.parsed_dataset_url().scheme == 'file'
    fs = resolver.filesystem()
    assert fs.exists(str(tmp_path))
    assert fs.isdir(str(tmp_path))
    factory = resolver.filesystem_factory()
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(factory))().exists(str(tmp_path))
    with pytest.raises(RuntimeError, match='Pickling FilesystemResolver is not supported'):
        pickle.dumps(resolver)
    assert FilesystemResolver(urlparse('file:///tmp')).get_dataset_path() == '/tmp'


def test_filesystem_resolver_rejects_bad_urls():
    with pytest.raises(ValueError, match='scheme-less'):
        FilesystemResolver('tmp/data')
    assert FilesystemResolver('/tmp/data').get_dataset_path() == '/tmp/data', 'an absolute path is local'
    with pytest.raises(ValueError, match='URLs must be of the form <scheme>://bucket/path'):
        FilesystemResolver('s3:///path')


def test_filesystem_resolver_for_object_stores_returns_the_fsspec_filesystem():
    s3fs = pytest.importorskip('s3fs')
    resolver = FilesystemResolver('s3://bucket/data', storage_options={'key': 'k', 'secret': SECRET,
                                                                        'endpoint_url': 'http://127.0.0.1:9'})
    assert isinstance(resolver.filesystem(), s3fs.S3FileSystem)
    assert resolver.get_dataset_path() == 'bucket/data'
    assert resolver.filesystem().storage_options['endpoint_url'] == 'http://127.0.0.1:9'
    assert isinstance(pickle.loads(cloudpickle.dumps(resolver.filesystem_factory()))(), s3fs.S3FileSystem)


def test_filesystem_resolver_for_hdfs_uses_the_connector(hadoop_home, stub_connector):
    ha = FilesystemResolver('hdfs://ns1/data', connector=stub_connector)
    assert stub_connector.connected == ['nn1.example.com:8020']
    assert ha.get_dataset_path() == '/data'
    assert ha.filesystem().exists('/')
    direct = FilesystemResolver('hdfs://host:9000/data', connector=stub_connector)
    assert stub_connector.connected[-1] == 'host:9000'
    default = FilesystemResolver('hdfs:///data', connector=stub_connector, user='alice')
    assert default.filesystem_factory().namenodes == ('nn1.example.com:8020', 'nn2.example.com:8020')
    assert pickle.loads(pickle.dumps(direct.filesystem_factory()))().exists('/')


def test_get_filesystem_and_path_or_paths(tmp_path, memory_dataset):
    fs, path = get_filesystem_and_path_or_paths(path_to_url(str(tmp_path)) + '/')
    assert path == str(tmp_path)
    assert fs.exists(path)
    urls = ['memory:///x/a.parquet', 'memory:///x/b.parquet']
    fs, paths = get_filesystem_and_path_or_paths(urls)
    assert paths == ['/x/a.parquet', '/x/b.parquet']
    assert isinstance(fs, MemoryFileSystem)
    mine = fsspec.filesystem('memory')
    assert get_filesystem_and_path_or_paths(memory_dataset, filesystem=mine)[0] is mine
    with pytest.raises(ValueError, match='same scheme and netloc'):
        get_filesystem_and_path_or_paths(['s3://a/x', 'gs://a/x'])


def test_get_dataset_path():
    assert get_dataset_path(urlparse('file:///a/b')) == '/a/b'
    assert get_dataset_path(urlparse('hdfs://nn:8020/a/b')) == '/a/b'
    assert get_dataset_path(urlparse('s3://bucket/a/b')) == 'bucket/a/b'
    assert get_dataset_path(urlparse('gs://bucket/a')) == 'bucket/a'
