"""S3's ``storage_options``: one table of names and aliases, read once into :class:`S3Settings`, and each client's.

``storage_options`` for ``s3://`` are s3fs's keyword arguments. The table (:data:`S3_SETTINGS`) lists the settings
every client takes, under each name a user may give them; the rest are s3fs's own (``profile``, ``requester_pays``,
its cache settings...), ``client_kwargs`` (botocore's client) and ``config_kwargs`` (botocore's ``Config``).
:func:`read_s3_settings` reads them once and refuses, before any request, a key that no client takes: not s3fs
(its signature, when it is installed, and the names it hands to fsspec and to aiobotocore's session), not the table,
not in delta-rs's or pyiceberg's own form. pyarrow's names (``endpoint_override``, ``access_key``...) are refused
with the s3fs name to write, except ``region``, accepted as before.

From the settings: s3fs's keyword arguments (:func:`s3fs_options`), delta-rs's storage options
(:func:`s3_delta_options`), pyiceberg's file IO properties (:func:`s3_iceberg_properties`), and pyarrow's
``S3FileSystem`` arguments (:mod:`petastorm.fs.settings.s3_pyarrow`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from petastorm.fs.settings._table import (
    Cloud,
    Setting,
    canonical_options,
    fsspec_class_names,
    library_options,
    parameter_names,
    read_options,
)

__all__ = ['ENDPOINT_VARIABLES', 'S3', 'S3_DEFAULT_CONNECTIONS', 'S3_DEFAULT_RETRIES', 'S3_SETTINGS', 'S3Settings',
           'full_endpoint', 'read_s3_settings', 's3_delta_options', 's3_endpoint', 's3_iceberg_properties',
           's3fs_options', 'with_client_defaults']

#: The settings every S3 client takes: s3fs's name first, then the aliases; delta-rs's and pyiceberg's names.
S3_SETTINGS: tuple[Setting, ...] = (
    Setting('key', ('key', 'username', 'aws_access_key_id', 'client_kwargs.aws_access_key_id'),
            'AWS_ACCESS_KEY_ID', 's3.access-key-id', 'the access key id'),
    Setting('secret', ('secret', 'password', 'aws_secret_access_key', 'client_kwargs.aws_secret_access_key'),
            'AWS_SECRET_ACCESS_KEY', 's3.secret-access-key', 'the secret access key'),
    Setting('token', ('token', 'aws_session_token', 'client_kwargs.aws_session_token'),
            'AWS_SESSION_TOKEN', 's3.session-token', 'the session token'),
    Setting('endpoint_url', ('endpoint_url', 'client_kwargs.endpoint_url'), 'AWS_ENDPOINT_URL', 's3.endpoint',
            'the endpoint'),
    Setting('region', ('client_kwargs.region_name', 'region', 'region_name'), 'AWS_REGION', 's3.region',
            'the region'),
    Setting('anon', ('anon',), 'AWS_SKIP_SIGNATURE', 's3.anonymous', 'anonymous access'),
    Setting('use_ssl', ('use_ssl',), what='use_ssl'),
)

#: s3fs's keyword arguments besides the table's, as far as known without importing it: its signature's, fsspec's
#: (instance and listings caches, batching) and those s3fs hands to aiobotocore's session (``profile``...).
_S3FS_NAMES = frozenset({
    'requester_pays', 'default_block_size', 'default_fill_cache', 'default_cache_type', 'version_aware',
    's3_additional_kwargs', 'session', 'cache_regions', 'asynchronous', 'loop', 'max_concurrency',
    'fixed_upload_size', 'local_expiry_check', 'skip_instance_cache', 'use_listings_cache', 'listings_expiry_time',
    'max_paths', 'batch_size', 'profile', 'session_vars', 'event_hooks', 'include_builtin_handlers'})
#: pyarrow's names for settings of the table, refused with what to write instead.
_PYARROW_NAMES = {
    'endpoint': "'endpoint_url' (a URL, 'http://host:port')",
    'endpoint_override': "'endpoint_url' (a URL, 'http://host:port')",
    'access_key': "'key'", 'secret_key': "'secret'", 'session_token': "'token'", 'anonymous': "'anon'",
    'scheme': "'use_ssl': False, or an 'http://' endpoint_url",
}
#: botocore's retry mode with 5 attempts, unless ``config_kwargs`` sets ``retries``.
S3_DEFAULT_RETRIES = {'max_attempts': 5, 'mode': 'standard'}
#: connections an S3 client keeps open (botocore's default is 10): footers and row groups are read this many at once.
S3_DEFAULT_CONNECTIONS = 64
#: the endpoint botocore reads from the environment, most specific first (the AWS SDK for C++ reads neither).
ENDPOINT_VARIABLES = ('AWS_ENDPOINT_URL_S3', 'AWS_ENDPOINT_URL')


@functools.cache
def _installed_s3fs_names() -> frozenset[str]:
    """The keyword names of the installed s3fs (its classes' signatures and aiobotocore's session's)."""
    try:
        import s3fs
        from aiobotocore.session import AioSession
    except ImportError:
        return frozenset()
    return fsspec_class_names(s3fs.S3FileSystem, AioSession.__init__)


@functools.cache
def _botocore_client_names(option: str) -> frozenset[str] | None:
    """The keys of ``client_kwargs`` botocore's ``create_client`` takes (None: not checked)."""
    if option != 'client_kwargs':
        return None  # config_kwargs: botocore's Config names an unknown setting itself
    try:
        from botocore.session import Session
    except ImportError:
        return None
    names, open_ended = parameter_names(Session.create_client)
    return None if open_ended else names - {'service_name', 'config'}  # s3fs passes those two itself


S3 = Cloud(client='s3fs', settings=S3_SETTINGS, dict_options=('client_kwargs', 'config_kwargs'),
           client_names=_S3FS_NAMES, more_client_names=_installed_s3fs_names, dict_names=_botocore_client_names,
           foreign=_PYARROW_NAMES)


@dataclass(frozen=True)
class S3Settings:
    """A user's S3 ``storage_options``, read once: the table's settings (None: not given) and the rest by client.

    Attributes:
        key, secret, token: the credentials.
        endpoint_url: the endpoint as given (see :attr:`endpoint`).
        region: the region.
        anon: anonymous access.
        use_ssl: False for ``http`` to an endpoint without a scheme.
        client_kwargs: botocore client arguments the table does not name (``verify``, ``api_version``...).
        config_kwargs: botocore ``Config`` settings.
        s3fs_options: s3fs's own options (``profile``, ``requester_pays``, its cache settings...).
        delta_options: options in delta-rs's own form, for delta-rs only.
        iceberg_properties: options in pyiceberg's own form, for pyiceberg only.
    """

    key: Any = None
    secret: Any = None
    token: Any = None
    endpoint_url: str | None = None
    region: str | None = None
    anon: Any = None
    use_ssl: Any = None
    client_kwargs: Mapping[str, Any] = field(default_factory=dict)
    config_kwargs: Mapping[str, Any] = field(default_factory=dict)
    s3fs_options: Mapping[str, Any] = field(default_factory=dict)
    delta_options: Mapping[str, str] = field(default_factory=dict)
    iceberg_properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str | None:
        """The endpoint as a URL (``host:port`` given: ``https://``, or ``http://`` with ``use_ssl=False``)."""
        return full_endpoint(self.endpoint_url, self.use_ssl) if self.endpoint_url else None

    def table_values(self) -> dict[str, Any]:
        """The table's settings that were given, by field."""
        return {s.field: getattr(self, s.field) for s in S3_SETTINGS if getattr(self, s.field) is not None}


def full_endpoint(endpoint: str, use_ssl: Any) -> str:
    """``endpoint`` with a scheme: its own, else ``https`` (``http`` when ``use_ssl`` is False)."""
    return endpoint if '://' in endpoint else f'{"http" if use_ssl is False else "https"}://{endpoint}'


def read_s3_settings(storage_options: Mapping[str, Any] | None, url: str = 's3://') -> S3Settings:
    """The settings ``storage_options`` give an ``s3://`` URL.

    Raises:
        StorageOptionsError: a key no client takes (named, with the closest accepted name), or one setting given
            under two names with different values.
    """
    read = read_options(S3, storage_options, url)
    return S3Settings(**read.values, client_kwargs=dict(read.dicts.get('client_kwargs', {})),
                      config_kwargs=dict(read.dicts.get('config_kwargs', {})), s3fs_options=dict(read.client),
                      delta_options=dict(read.delta), iceberg_properties=dict(read.iceberg))


def with_client_defaults(settings: S3Settings) -> S3Settings:
    """The settings with our defaults for the clients we make: botocore's standard retries, 64 connections."""
    config = dict(settings.config_kwargs)
    config.setdefault('retries', dict(S3_DEFAULT_RETRIES))
    config.setdefault('max_pool_connections', S3_DEFAULT_CONNECTIONS)
    return dataclasses.replace(settings, config_kwargs=config)


def s3_endpoint(settings: S3Settings, environ: Mapping[str, str]) -> str | None:
    """The endpoint a client is told to use: the options', else the environment's; None for AWS's own."""
    return settings.endpoint_url or next((environ[name] for name in ENDPOINT_VARIABLES if environ.get(name)), None)


def s3fs_options(settings: S3Settings) -> dict[str, Any]:
    """The keyword arguments of ``s3fs.S3FileSystem``: the table's settings under s3fs's names, and s3fs's own."""
    dicts = {'client_kwargs': settings.client_kwargs, 'config_kwargs': settings.config_kwargs}
    return {**settings.s3fs_options, **canonical_options(S3_SETTINGS, settings.table_values(), dicts)}


def _library_values(settings: S3Settings) -> dict[str, Any]:
    return {**settings.table_values(), 'endpoint_url': settings.endpoint, 'anon': bool(settings.anon)}


def s3_delta_options(settings: S3Settings) -> dict[str, str]:
    """delta-rs's storage options: the table's settings by delta-rs's names, then those given in its own form."""
    options = library_options(S3_SETTINGS, _library_values(settings), 'delta')
    if (settings.endpoint or '').startswith('http://'):
        options['AWS_ALLOW_HTTP'] = 'true'
    return {**options, **settings.delta_options}


def s3_iceberg_properties(settings: S3Settings) -> dict[str, str]:
    """The file IO properties of pyiceberg: the table's settings by pyiceberg's names, then those in its own form."""
    return {**library_options(S3_SETTINGS, _library_values(settings), 'iceberg'), **settings.iceberg_properties}
