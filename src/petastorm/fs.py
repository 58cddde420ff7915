"""Dataset URLs to ``pyarrow.fs`` filesystems and paths.

One place turns a URL (or a list of URLs) into a filesystem and path(s). Local paths and ``file://`` use
pyarrow's local filesystem; every other scheme goes through fsspec (wrapped with ``PyFileSystem``), or through
pyarrow's native implementation where pyarrow has one and no ``storage_options`` ask for fsspec.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs


@dataclass(frozen=True)
class ResolvedLocation:
    """A filesystem plus the path(s) on it that a dataset URL names."""

    filesystem: pafs.FileSystem
    path: str | list[str]
    url: str | list[str]

    @property
    def is_file_list(self) -> bool:
        return isinstance(self.path, list)


def normalize_dir_url(dataset_url: Any) -> str:
    """Check a dataset URL and strip one trailing ``/``.

    Raises:
        ValueError: the URL is not a string, or has no scheme.
    """
    if not isinstance(dataset_url, str):
        raise ValueError(f'directory url must be a string, got {dataset_url!r}')
    url = dataset_url[:-1] if dataset_url.endswith('/') and len(dataset_url) > 1 else dataset_url
    if not urlparse(url).scheme:
        raise ValueError(f'A scheme-less dataset url ({dataset_url!r}) is no longer supported. Please prepend '
                         f'"file://" for local filesystem.')
    return url


def _local_path(parsed: Any, url: str) -> str:
    if parsed.netloc and parsed.netloc != 'localhost':
        raise ValueError(f'file URL {url!r} names host {parsed.netloc!r}; use file:///absolute/path')
    return parsed.path or '/'


def _fsspec_filesystem(scheme: str, url: str, storage_options: dict | None) -> pafs.FileSystem:
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as err:
        raise ValueError(f'cannot open {url!r}: no filesystem is known for scheme {scheme!r} ({err})') from err
    options = dict(cls._get_kwargs_from_urls(url))
    options.update(storage_options or {})
    return pafs.PyFileSystem(pafs.FSSpecHandler(cls(**options)))


def _fsspec_path(scheme: str, url: str) -> str:
    import fsspec

    return fsspec.get_filesystem_class(scheme)._strip_protocol(url)


def resolve_url(dataset_url: str, storage_options: dict | None = None,
                filesystem: Any = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path for one URL.

    Args:
        dataset_url: ``file:///...``, ``s3://bucket/...``, ``memory://...`` or any fsspec URL.
        storage_options: keyword arguments for the fsspec filesystem (credentials, endpoint, ...).
        filesystem: a ready ``pyarrow.fs.FileSystem`` or fsspec filesystem; overrides resolution.
    """
    url = normalize_dir_url(dataset_url)
    parsed = urlparse(url)
    scheme = parsed.scheme
    if filesystem is not None:
        fs = filesystem if isinstance(filesystem, pafs.FileSystem) else pafs.PyFileSystem(
            pafs.FSSpecHandler(filesystem))
        path = _local_path(parsed, url) if scheme == 'file' else _fsspec_path(scheme, url)
        return fs, path
    if scheme == 'file':
        return pafs.LocalFileSystem(), _local_path(parsed, url)
    return _fsspec_filesystem(scheme, url, storage_options), _fsspec_path(scheme, url)


def resolve_location(dataset_url_or_urls: str | Sequence[str], storage_options: dict | None = None,
                     filesystem: Any = None) -> ResolvedLocation:
    """Resolve one directory URL, or a non-empty list of file URLs sharing scheme and host."""
    if isinstance(dataset_url_or_urls, (list, tuple)):
        urls = list(dataset_url_or_urls)
        if not urls:
            raise ValueError('dataset url list must be non-empty.')
        urls = [normalize_dir_url(u) for u in urls]
        origins = {(urlparse(u).scheme, urlparse(u).netloc) for u in urls}
        if len(origins) != 1:
            raise ValueError('The dataset url list must contain url with the same scheme and netloc.')
        fs, first = resolve_url(urls[0], storage_options, filesystem)
        paths = [first] + [resolve_url(u, storage_options, fs)[1] for u in urls[1:]]
        return ResolvedLocation(fs, paths, urls)
    fs, path = resolve_url(dataset_url_or_urls, storage_options, filesystem)
    return ResolvedLocation(fs, path, normalize_dir_url(dataset_url_or_urls))


def path_to_url(path: str) -> str:
    """A ``file://`` URL for a local path."""
    return 'file://' + os.path.abspath(path)
