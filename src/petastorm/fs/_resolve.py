"""Dataset URLs to a ``pyarrow.fs`` filesystem and path(s): the one place that knows URL schemes.

========================================  ==================================================================
scheme                                    filesystem
========================================  ==================================================================
``file://``                               ``pyarrow.fs.LocalFileSystem``
``hdfs://``                               ``pyarrow.fs.HadoopFileSystem``, namenode from the URL or the Hadoop
                                          configuration (see :mod:`petastorm.fs.hadoop`)
``s3://``, ``s3a://``                     ``pyarrow.fs.S3FileSystem`` when every ``storage_option`` means the
                                          same to it (:mod:`petastorm.fs.settings.s3_pyarrow`), else s3fs
                                          (``pip install 'neo-petastorm[s3]'``)
``gs://``, ``gcs://``                     ``pyarrow.fs.GcsFileSystem`` when every ``storage_option`` means the
                                          same to it (:mod:`petastorm.fs.settings.gcs`), else gcsfs
                                          (``pip install 'neo-petastorm[gcs]'``)
``abfs://``, ``abfss://``, ``az://``      ``pyarrow.fs.AzureFileSystem`` when every ``storage_option`` means the
                                          same to it (:mod:`petastorm.fs.settings.azure`), else adlfs
                                          (``pip install 'neo-petastorm[azure]'``)
``memory://``                             fsspec's in-memory filesystem (one per process; for tests)
anything else                             the fsspec implementation registered for the scheme
========================================  ==================================================================

fsspec filesystems are wrapped as ``PyFileSystem(StorageHandler(fs))`` (:mod:`petastorm.fs._handler`): errors
name the URL, transient failures are retried, and reads are exact ranged requests. ``storage_options`` are the
keyword arguments of the fsspec filesystem (credentials, ``endpoint_url``, ``client_kwargs``...), checked and
translated for each client by :mod:`petastorm.fs.settings` (which refuses an unknown key before any request); for
GCS and Azure a store whose credentials are nowhere to be found is refused first, saying where we looked; for
S3 we add botocore's standard retry mode (``config_kwargs={'retries': {'max_attempts': 5, 'mode': 'standard'}}``)
unless the options set retries themselves, and 64 pooled connections (``max_pool_connections``, botocore's default
is 10) unless they set that. A ``filesystem=`` given by the caller (a ``pyarrow.fs.FileSystem`` or an fsspec
filesystem) is used as it is and only the path is taken from the URL.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlparse

import pyarrow.fs as pafs

from petastorm._describe import display_url
from petastorm._optional import import_optional
from petastorm.errors import MissingDependencyError, StorageError
from petastorm.fs._errors import describe, safe_cause, secrets_of
from petastorm.fs._handler import StorageHandler
from petastorm.fs._native_clouds import (
    azure_endpoint,
    check_cloud_credentials,
    gcs_endpoint_of,
    native_azure_filesystem,
    native_gcs_filesystem,
)
from petastorm.fs._native_s3 import native_s3_filesystem
from petastorm.fs.hadoop import check_hdfs_driver, hdfs_filesystem
from petastorm.fs.settings import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    HDFS_SCHEMES,
    S3_SCHEMES,
    check_storage_options,
    fsspec_options,
)
from petastorm.fs.settings.s3 import S3Settings, read_s3_settings, s3_endpoint, with_client_defaults
from petastorm.fs.settings.s3_pyarrow import pyarrow_s3_arguments

#: schemes fsspec does not register under that name, and the one it does.
_SCHEME_ALIASES = {'abfss': 'abfs'}


@dataclass(frozen=True)
class ResolvedLocation:
    """A filesystem plus the path(s) on it that a dataset URL names.

    Attributes:
        fsspec_twin: for pyarrow's own GCS client made from the URL and options, a function making the same store's
            filesystem through gcsfs with the same options (wrapped as every fsspec filesystem is), which reads many
            small files far faster (:func:`petastorm.store.opening.open_store` takes it for those); None otherwise.
    """

    filesystem: pafs.FileSystem
    path: str | list[str]
    url: str | list[str]
    fsspec_twin: Callable[[], Any] | None = field(default=None, compare=False, repr=False)

    @property
    def is_file_list(self) -> bool:
        return isinstance(self.path, list)


def normalize_dir_url(dataset_url: Any, filesystem: Any = None) -> str:
    """Check a dataset URL and strip one trailing ``/``; an absolute local path becomes its ``file://`` URL.

    With a ``filesystem`` given, a path without a scheme is a path on it (``bucket/key`` on an object store) and is
    returned as it is.

    Raises:
        ValueError: the URL is not a string, or is a relative path without a scheme (and no ``filesystem``).
    """
    if not isinstance(dataset_url, str):
        raise ValueError(f'directory url must be a string, got {dataset_url!r}')
    url = dataset_url[:-1] if dataset_url.endswith('/') and len(dataset_url) > 1 else dataset_url
    if urlparse(url).scheme or filesystem is not None:
        return url
    if os.path.isabs(url):
        return 'file://' + url
    raise ValueError(f'A scheme-less dataset url ({dataset_url!r}) is a relative path, which is not supported: pass '
                     f'an absolute path or a URL, for the local filesystem {local_url_hint(dataset_url)!r}')


def local_url_hint(path: str) -> str:
    """The ``file://`` URL a scheme-less local path stands for (relative paths made absolute), for messages."""
    return 'file://' + os.path.abspath(path) if path else 'file:///absolute/path'


def _local_path(parsed: Any, url: str) -> str:
    if parsed.netloc and parsed.netloc != 'localhost':
        raise ValueError(f'file URL {display_url(url)!r} names host {parsed.netloc!r}; use file:///absolute/path')
    return parsed.path or '/'


def fsspec_class(scheme: str, url: str) -> Any:
    """The fsspec filesystem class for ``scheme``.

    Raises:
        ValueError: no filesystem is known for the scheme.
        MissingDependencyError: the package implementing it is not installed (the message names the pip extra).
    """
    import fsspec
    from fsspec.registry import known_implementations

    protocol = _SCHEME_ALIASES.get(scheme, scheme)
    try:
        return fsspec.get_filesystem_class(protocol)
    except ValueError as err:
        raise ValueError(
            f'cannot open {display_url(url)}: unknown URL scheme {scheme!r}. Use file://, hdfs://, s3://, gs://, '
            f'abfs://, memory:// or another scheme with an fsspec implementation ({err})') from err
    except ImportError as err:
        module = known_implementations.get(protocol, {}).get('class', protocol).split('.')[0]
        import_optional(module, f'opening {display_url(url)}')  # raises, naming the pip extra
        raise MissingDependencyError(f'opening {display_url(url)} needs {module!r}: {err}') from err


def fsspec_filesystem(scheme: str, url: str, storage_options: dict | None = None) -> Any:
    """The fsspec filesystem (unwrapped) for a URL: options parsed from the URL, updated with ``storage_options``."""
    cls = _emulator_ready(fsspec_class(scheme, url), scheme, url, storage_options)
    options = dict(cls._get_kwargs_from_urls(url))
    options.update(fsspec_options(scheme, url, storage_options))
    try:
        fs = cls(**options)
    except (TypeError, ValueError, OSError) as err:
        secrets = secrets_of(storage_options)
        raise StorageError(f'cannot create the {scheme}:// filesystem for {display_url(url)} with the given '
                           f'storage_options: {describe(err, secrets)}') from safe_cause(err, secrets)
    _check_endpoint(scheme, url, storage_options)
    return fs


def _emulator_ready(cls: Any, scheme: str, url: str, storage_options: dict | None) -> Any:
    """gcsfs's core class against an endpoint of the user's (an emulator), else ``cls``.

    gcsfs's default class since 2025 (chosen when gcsfs is imported, unless GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false)
    first asks the bucket's type over gRPC, which no emulator serves, and waits out a minute's timeouts for it. The
    core class reads the same objects over the JSON API without asking; choosing it changes no environment.
    """
    if scheme not in GCS_SCHEMES or not gcs_endpoint_of(url, storage_options):
        return cls
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem if issubclass(cls, GCSFileSystem) else cls


def _check_endpoint(scheme: str, url: str, storage_options: dict | None) -> None:
    """Refuse an S3, GCS or Azure endpoint nothing listens at (see :func:`check_endpoint_listens`)."""
    if scheme in S3_SCHEMES:
        _check_s3_endpoint(read_s3_settings(storage_options, url), url)
    elif scheme in GCS_SCHEMES:
        check_endpoint_listens(gcs_endpoint_of(url, storage_options), url, 'GCS', 'endpoint_url')
    elif scheme in AZURE_SCHEMES:
        check_endpoint_listens(azure_endpoint(url, storage_options), url, 'Azure Blob', 'connection_string')


def _check_s3_endpoint(settings: S3Settings, url: str) -> None:
    """Refuse an endpoint nothing listens at (unless reached through a proxy the options name)."""
    if not settings.config_kwargs.get('proxies'):
        check_endpoint_listens(s3_endpoint(settings, os.environ), url)


def _through_proxy(scheme: str, hostname: str) -> bool:
    """The clients reach ``scheme://hostname`` through a proxy (``urllib.request``'s rules).

    On Linux proxies come from the environment only: without a ``<scheme>_proxy`` variable there is none, and
    ``urllib.request`` (10 to 20 ms to import, before a reader's first batch) is not imported to say so.
    """
    if sys.platform.startswith('linux') and not any(name.lower() == f'{scheme}_proxy' for name in os.environ):
        return False
    import urllib.request

    return scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(hostname)


def check_endpoint_listens(endpoint: str | None, url: str, what: str = 'S3', option: str = 'endpoint_url',
                           timeout: float = 2.0) -> None:
    """Refuse at once an endpoint that refuses connections, instead of letting the client retry it for a minute.

    One TCP connection is opened and closed (for an ``https`` endpoint, after a TLS handshake). Only a refused
    connection or a server that does not speak TLS raises: timeouts and name lookups are left to the client, which
    reports them with its own retries.

    Raises:
        StorageError: nothing listens at the endpoint's host and port, or an ``https`` endpoint answers without TLS
            (a plain http server: a configuration error, which clients would retry for a minute).
    """
    if not endpoint:
        return
    parsed = urlparse(endpoint if '://' in endpoint else f'http://{endpoint}')
    if not parsed.hostname:
        return
    if _through_proxy(parsed.scheme, parsed.hostname):
        return  # reached through a proxy: a direct connection says nothing
    try:
        port = parsed.port or (443 if parsed.scheme == 'https' else 80)
    except ValueError:
        return  # a malformed port: the client reports it
    try:
        connection = socket.create_connection((parsed.hostname, port), timeout=timeout)
    except ConnectionRefusedError as err:
        raise StorageError(f'cannot reach {display_url(url)}: the {what} endpoint {display_url(endpoint)} refused '
                           f'the connection (nothing listens at {parsed.hostname}:{port}). Check {option} in '
                           f'storage_options and that the server is running.') from err
    except OSError:
        return
    with connection:
        if parsed.scheme == 'https':
            _check_tls(connection, parsed.hostname, endpoint, url)


def _check_tls(connection: socket.socket, hostname: str, endpoint: str, url: str) -> None:
    """Refuse an ``https`` endpoint whose server does not answer a TLS handshake (certificates are not judged here).

    Raises:
        StorageError: the server answered, but not with TLS.
    """
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the client judges certificates; only the protocol is checked here
    try:
        with context.wrap_socket(connection, server_hostname=hostname):
            pass
    except ssl.SSLError as err:
        plain = endpoint.replace('https://', 'http://', 1)
        raise StorageError(f'cannot read {display_url(url)}: the S3 endpoint {display_url(endpoint)} does not speak '
                           f'TLS ({err.reason or err}); for a plain http server use endpoint_url '
                           f'{display_url(plain)!r} in storage_options') from err
    except OSError:
        return  # a timeout or a dropped connection: left to the client, with its retries


def as_arrow_filesystem(filesystem: Any, scheme: str) -> pafs.FileSystem:
    """A ``pyarrow.fs.FileSystem`` for a filesystem given by the caller (pyarrow or fsspec)."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    from fsspec import AbstractFileSystem
    from fsspec.implementations.arrow import ArrowFSWrapper

    if isinstance(filesystem, ArrowFSWrapper):
        return filesystem.fs
    if isinstance(filesystem, AbstractFileSystem):
        return pafs.PyFileSystem(StorageHandler(filesystem, scheme))
    raise TypeError(f'filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, got '
                    f'{type(filesystem).__name__}')


def path_in(url: str, filesystem: Any = None) -> str:
    """The path a URL names on its filesystem (``bucket/key`` on object stores, ``/a/b`` on local and HDFS)."""
    parsed = urlparse(url)
    scheme = parsed.scheme
    if not scheme:
        return url  # a path on the filesystem the caller gave (see normalize_dir_url)
    if scheme == 'file':
        return _local_path(parsed, url)
    if scheme in HDFS_SCHEMES:
        return parsed.path or '/'
    if scheme in S3_SCHEMES + GCS_SCHEMES + AZURE_SCHEMES and filesystem is None:
        # bucket/key (container/key), without importing the fsspec client: abfs://container@account.../key too
        return (parsed.netloc.partition('@')[0] + parsed.path).rstrip('/')
    from fsspec import AbstractFileSystem
    from fsspec.implementations.arrow import ArrowFSWrapper

    if isinstance(filesystem, AbstractFileSystem) and not isinstance(filesystem, ArrowFSWrapper):
        return filesystem._strip_protocol(url)
    try:
        return fsspec_class(scheme, url)._strip_protocol(url)
    except (ValueError, ImportError):
        return (parsed.netloc + parsed.path) if parsed.netloc else parsed.path


def resolve_url(dataset_url: str, storage_options: dict | None = None, filesystem: Any = None, *,
                hdfs_driver: str = 'libhdfs3', hadoop_configuration: Any = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path for one URL.

    Args:
        dataset_url: ``file:///...``, ``hdfs://...``, ``s3://bucket/...``, ``gs://...``, ``abfs://...``,
            ``memory://...`` or any fsspec URL.
        storage_options: keyword arguments of the fsspec filesystem (credentials, endpoint, ...), or of
            ``pyarrow.fs.HadoopFileSystem`` for ``hdfs://``.
        filesystem: a ready ``pyarrow.fs.FileSystem`` or fsspec filesystem; overrides resolution.
        hdfs_driver: ``'libhdfs3'`` or ``'libhdfs'`` (Petastorm's choice; both use pyarrow's JNI client).
        hadoop_configuration: Hadoop properties for ``hdfs://`` (default: the XML files under ``$HADOOP_HOME``...).

    Raises:
        ValueError: not a string, no scheme, or an unknown scheme.
        StorageOptionsError: a ``storage_options`` key that no client of the URL takes (a ``ValueError``).
        MissingDependencyError: the scheme's package is not installed.
        StorageError: the filesystem could not be created or connected.
    """
    url = normalize_dir_url(dataset_url, filesystem)
    check_hdfs_driver(hdfs_driver)
    scheme = urlparse(url).scheme.lower()
    check_storage_options(url, storage_options, fsspec_class if filesystem is None else None)
    if filesystem is not None:
        return as_arrow_filesystem(filesystem, scheme), path_in(url, filesystem)
    if scheme == 'file':
        return pafs.LocalFileSystem(), path_in(url)
    if scheme in HDFS_SCHEMES:
        return hdfs_filesystem(url, storage_options, hdfs_driver, hadoop_configuration), path_in(url)
    native = _native_filesystem(scheme, url, storage_options)
    if native is not None:
        return native, path_in(url)
    fs = wrapped_fsspec_filesystem(scheme, url, storage_options)
    return fs, fs.handler.fs._strip_protocol(url)


def wrapped_fsspec_filesystem(scheme: str, url: str, storage_options: dict | None) -> pafs.PyFileSystem:
    """The fsspec filesystem of a URL (:func:`fsspec_filesystem`) as a ``pyarrow.fs`` filesystem (module docstring)."""
    return pafs.PyFileSystem(StorageHandler(fsspec_filesystem(scheme, url, storage_options), scheme))


def _native_filesystem(scheme: str, url: str, storage_options: dict | None) -> pafs.FileSystem | None:
    """pyarrow's own client for an S3, GCS or Azure URL when the options mean the same to it (None: fsspec's).

    Raises:
        StorageCredentialsError: a GCS or Azure store whose credentials are nowhere to be found.
        StorageError: nothing listens at the endpoint the options name.
    """
    if scheme in S3_SCHEMES:
        return s3_filesystem(url, storage_options)
    if scheme not in GCS_SCHEMES + AZURE_SCHEMES:
        return None
    gcs = scheme in GCS_SCHEMES
    check_cloud_credentials(scheme, url, storage_options, gcs=gcs)
    native = native_gcs_filesystem(url, storage_options) if gcs else native_azure_filesystem(url, storage_options)
    if native is not None:
        _check_endpoint(scheme, url, storage_options)
    return native


def s3_filesystem(url: str, storage_options: dict | None) -> pafs.FileSystem | None:
    """pyarrow's own S3 client for an ``s3://`` URL when the options mean the same to it (None: use s3fs).

    Raises:
        StorageError: nothing listens at the endpoint the options name.
    """
    settings = with_client_defaults(read_s3_settings(storage_options, url))
    arguments = pyarrow_s3_arguments(settings, os.environ)
    if arguments is None:
        return None
    native = native_s3_filesystem(arguments)
    _check_s3_endpoint(settings, url)
    return native


def resolve_location(dataset_url_or_urls: str | Sequence[str], storage_options: dict | None = None,
                     filesystem: Any = None, *, hdfs_driver: str = 'libhdfs3',
                     hadoop_configuration: Any = None) -> ResolvedLocation:
    """Resolve one directory URL, or a non-empty list of file URLs sharing scheme and host (see :func:`resolve_url`)."""
    if isinstance(dataset_url_or_urls, (list, tuple)):
        urls = list(dataset_url_or_urls)
        if not urls:
            raise ValueError('dataset url list must be non-empty.')
        urls = [normalize_dir_url(u, filesystem) for u in urls]
        origins = {(urlparse(u).scheme, urlparse(u).netloc) for u in urls}
        if len(origins) != 1:
            raise ValueError('The dataset url list must contain url with the same scheme and netloc.')
        fs, first = resolve_url(urls[0], storage_options, filesystem, hdfs_driver=hdfs_driver,
                                hadoop_configuration=hadoop_configuration)
        paths = [first] + [path_in(u, filesystem) for u in urls[1:]]
        return ResolvedLocation(fs, paths, urls)
    url = cast(str, dataset_url_or_urls)
    fs, path = resolve_url(url, storage_options, filesystem, hdfs_driver=hdfs_driver,
                           hadoop_configuration=hadoop_configuration)
    twin = None
    if filesystem is None and isinstance(fs, pafs.GcsFileSystem):
        twin = functools.partial(wrapped_fsspec_filesystem, urlparse(url).scheme.lower(), url, storage_options)
    return ResolvedLocation(fs, path, normalize_dir_url(url, filesystem), twin)


def path_to_url(path: str) -> str:
    """A ``file://`` URL for a local path."""
    return 'file://' + os.path.abspath(path)
