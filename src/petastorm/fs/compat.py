"""Petastorm's filesystem API (``petastorm.fs_utils``): :class:`FilesystemResolver` and its helpers.

Petastorm returned its legacy ``pyarrow.filesystem`` objects (removed from pyarrow) or fsspec filesystems. Here
:meth:`FilesystemResolver.filesystem` and :func:`get_filesystem_and_path_or_paths` return fsspec filesystems:
the fsspec implementation for remote schemes (as Petastorm did), and fsspec's ``ArrowFSWrapper`` around
``pyarrow.fs.LocalFileSystem`` / ``HadoopFileSystem`` for ``file://`` and ``hdfs://``. They have the method
names of the legacy objects (``open``, ``exists``, ``ls``, ``isdir``, ``mkdir``, ``rm``...), and pyarrow and our
readers (``filesystem=``) accept them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import ParseResult, urlparse

import pyarrow.fs as pafs

from petastorm.fs._resolve import fsspec_class, local_url_hint, normalize_dir_url, path_in
from petastorm.fs.hadoop import HdfsConnector, HdfsNamenodeResolver, check_hdfs_driver
from petastorm.fs.settings import fsspec_options

__all__ = ['FilesystemResolver', 'get_dataset_path', 'get_filesystem_and_path_or_paths']

#: schemes whose URLs must name a bucket / container.
_SCHEMES_WITHOUT_HOST = ('memory', 'file', 'local')


def get_dataset_path(parsed_url: ParseResult) -> str:
    """The path a parsed URL names: ``parsed.path`` for ``file`` and ``hdfs``, else ``bucket/path``."""
    if parsed_url.scheme.lower() in ('file', 'hdfs'):
        return parsed_url.path
    return path_in(_unparse(parsed_url))


def _unparse(parsed: ParseResult) -> str:
    # ParseResult.geturl() drops an empty host ('memory:///x' -> 'memory:/x'), which fsspec reads as a local path.
    url = f'{parsed.scheme}://{parsed.netloc}{parsed.path}'
    return f'{url}?{parsed.query}' if parsed.query else url


def _fsspec_view(filesystem: Any) -> Any:
    """An fsspec filesystem for a ``pyarrow.fs`` one (fsspec filesystems are returned as they are)."""
    if isinstance(filesystem, pafs.FileSystem):
        from fsspec.implementations.arrow import ArrowFSWrapper

        return ArrowFSWrapper(filesystem)
    return filesystem


@dataclass(frozen=True)
class _LocalFactory:
    def __call__(self) -> Any:
        return _fsspec_view(pafs.LocalFileSystem())


@dataclass(frozen=True)
class _FsspecFactory:
    scheme: str
    url: str
    options: dict = field(hash=False)

    def __call__(self) -> Any:
        return fsspec_class(self.scheme, self.url)(**self.options)


@dataclass(frozen=True)
class _HdfsFactory:
    connector: Any
    url: str
    namenodes: tuple[str, ...] | None
    driver: str
    user: str | None

    def __call__(self) -> Any:
        if self.namenodes:
            return _fsspec_view(self.connector.connect_to_either_namenode(list(self.namenodes), self.user))
        return _fsspec_view(self.connector.hdfs_connect_namenode(urlparse(self.url), self.driver, user=self.user))


class FilesystemResolver:
    """Resolve a dataset URL to a filesystem, as Petastorm's ``petastorm.fs_utils.FilesystemResolver`` does.

    Args:
        dataset_url: a URL string or a ``urllib.parse.ParseResult``.
        hadoop_configuration: Hadoop properties for ``hdfs://`` (a dict or an object with ``get``); default:
            the XML files under ``$HADOOP_CONF_DIR`` / ``$HADOOP_HOME/etc/hadoop``...
        connector: the class that connects to namenodes (:class:`~petastorm.fs.hadoop.HdfsConnector`).
        hdfs_driver: ``'libhdfs3'`` (resolve HA nameservices from the configuration) or ``'libhdfs'`` (connect to
            the URL's host directly); both connect with pyarrow's ``HadoopFileSystem``.
        user: the HDFS user.
        storage_options: keyword arguments of the fsspec filesystem, for other schemes.

    Raises:
        ValueError: no scheme; or an object-store URL without a bucket (``URLs must be of the form
            <scheme>://bucket/path``); or an unknown scheme.
        RuntimeError: ``hdfs:///...`` and no ``fs.defaultFS`` in the Hadoop configuration.
    """

    def __init__(self, dataset_url: str | ParseResult, hadoop_configuration: Any = None,
                 connector: Any = HdfsConnector, hdfs_driver: str = 'libhdfs3', user: str | None = None,
                 storage_options: dict | None = None) -> None:
        # A string is checked as every URL is: an absolute local path is its file:// URL.
        parsed = dataset_url if isinstance(dataset_url, ParseResult) else urlparse(normalize_dir_url(dataset_url))
        if not parsed.scheme:
            raise ValueError(f'A scheme-less dataset url ({dataset_url!r}) is not supported: use '
                             f'{local_url_hint(parsed.path)!r} for the local filesystem')
        self._dataset_url = parsed
        scheme = parsed.scheme.lower()
        self._dataset_path = get_dataset_path(parsed)
        if scheme == 'file':
            self._filesystem_factory: Any = _LocalFactory()
        elif scheme == 'hdfs':
            check_hdfs_driver(hdfs_driver)
            namenodes = None
            if hdfs_driver == 'libhdfs3' or not parsed.netloc:
                resolver = HdfsNamenodeResolver(hadoop_configuration)
                if parsed.netloc:
                    namenodes = resolver.resolve_hdfs_name_service(parsed.netloc)
                else:
                    _, namenodes = resolver.resolve_default_hdfs_service()
            self._filesystem_factory = _HdfsFactory(connector, _unparse(parsed),
                                                    tuple(namenodes) if namenodes else None, hdfs_driver, user)
        else:
            if not parsed.netloc and scheme not in _SCHEMES_WITHOUT_HOST:
                raise ValueError('URLs must be of the form <scheme>://bucket/path')
            url = _unparse(parsed)
            cls = fsspec_class(scheme, url)
            options = dict(cls._get_kwargs_from_urls(url))
            options.update(fsspec_options(scheme, url, storage_options))
            self._filesystem_factory = _FsspecFactory(scheme, url, options)
        self._filesystem = self._filesystem_factory()

    def parsed_dataset_url(self) -> ParseResult:
        """The parsed dataset URL."""
        return self._dataset_url

    def get_dataset_path(self) -> str:
        """The dataset's path on its filesystem."""
        return self._dataset_path

    def filesystem(self) -> Any:
        """The filesystem (fsspec API; see the module docstring)."""
        return self._filesystem

    def filesystem_factory(self) -> Any:
        """A picklable callable that makes an equivalent filesystem (in another process, for instance)."""
        return self._filesystem_factory

    def __getstate__(self) -> Any:
        raise RuntimeError('Pickling FilesystemResolver is not supported as it may contain some file-system '
                           'instance objects that do not support pickling but do not have anti-pickling '
                           'protection; pickle filesystem_factory() instead.')


def get_filesystem_and_path_or_paths(url_or_urls: str | Sequence[str], hdfs_driver: str = 'libhdfs3',
                                     storage_options: dict | None = None,
                                     filesystem: Any = None) -> tuple[Any, str | list[str]]:
    """The filesystem and the path (or paths, for a list of URLs) that the URL(s) name.

    Raises:
        ValueError: an empty list, or URLs that do not share scheme and host.
    """
    given: list[Any] = list(url_or_urls) if isinstance(url_or_urls, (list, tuple)) else [url_or_urls]
    if not given:
        raise ValueError('dataset url list must be non-empty.')
    urls = [normalize_dir_url(u) for u in given]
    parsed = [urlparse(u) for u in urls]
    if len({(p.scheme, p.netloc) for p in parsed}) != 1:
        raise ValueError('The dataset url list must contain url with the same scheme and netloc.')
    if filesystem is None:
        filesystem = FilesystemResolver(urls[0], hdfs_driver=hdfs_driver, storage_options=storage_options).filesystem()
    paths = [get_dataset_path(p) for p in parsed]
    return filesystem, paths if isinstance(url_or_urls, (list, tuple)) else paths[0]
