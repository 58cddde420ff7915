"""Azure Blob Storage's ``storage_options``: one table read once into :class:`AzureSettings`, and each client's.

``storage_options`` for ``abfs://``, ``abfss://`` and ``az://`` are adlfs's keyword arguments. The table
(:data:`AZURE_SETTINGS`) lists the settings the clients share; the rest are adlfs's own (``credential``,
``location_mode``, its cache settings...). :func:`read_azure_settings` reads them once and refuses, before any
request, a key that no client takes; pyarrow's names (``blob_storage_authority``...) are refused with the adlfs
name to write.

Credentials are found as Azure's own tools find them (:func:`find_credentials`): the options first, then
``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``,
``AZURE_STORAGE_SAS_TOKEN`` and ``AZURE_STORAGE_CLIENT_ID``/``_SECRET``/``TENANT_ID``; a connection string gives
the account, its key or SAS token and the endpoint (``UseDevelopmentStorage=true``: the local emulator's). An
account name alone leaves the rest to Azure's default credential chain (a service principal in the environment,
workload or managed identity, the Azure CLI's login). With no account name anywhere, :func:`missing_account` says
what was looked for.

From the settings: adlfs's keyword arguments (:func:`adlfs_options`), delta-rs's storage options
(:func:`azure_delta_options`), pyiceberg's file IO properties (:func:`azure_iceberg_properties`), and pyarrow's
``AzureFileSystem`` arguments (:func:`pyarrow_azure_arguments`) whenever every option has a meaning there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from petastorm.fs.settings._table import (
    Cloud,
    Setting,
    canonical_options,
    fsspec_class_names,
    read_options,
)

__all__ = [
    'AZURE',
    'AZURE_SETTINGS',
    'DEVELOPMENT_ACCOUNT',
    'DEVELOPMENT_KEY',
    'AzureCredentials',
    'AzureSettings',
    'adlfs_options',
    'azure_delta_options',
    'azure_iceberg_properties',
    'find_credentials',
    'missing_account',
    'pyarrow_azure_arguments',
    'read_azure_settings',
    'url_account',
]

#: The settings every Azure client takes: adlfs's name first; delta-rs's and pyiceberg's names.
AZURE_SETTINGS: tuple[Setting, ...] = (
    Setting('account_name', ('account_name',), 'azure_storage_account_name', 'adls.account-name', 'the account'),
    Setting('account_key', ('account_key',), 'azure_storage_account_key', 'adls.account-key', 'the account key'),
    Setting('sas_token', ('sas_token',), 'azure_storage_sas_token', 'adls.sas-token', 'the SAS token'),
    Setting('connection_string', ('connection_string',), None, 'adls.connection-string', 'the connection string'),
    Setting('client_id', ('client_id',), 'azure_storage_client_id', 'adls.client-id', 'the client id'),
    Setting('client_secret', ('client_secret',), 'azure_storage_client_secret', 'adls.client-secret',
            'the client secret'),
    Setting('tenant_id', ('tenant_id',), 'azure_storage_tenant_id', 'adls.tenant-id', 'the tenant id'),
    Setting('account_host', ('account_host',), what='the account host'),
    Setting('anon', ('anon',), 'azure_skip_signature', what='anonymous access'),
)

#: adlfs's keyword arguments besides the table's, as far as known without importing it (its signature's and
#: fsspec's instance and listings caches).
_ADLFS_NAMES = frozenset({
    'credential', 'request_session', 'socket_timeout', 'blocksize', 'location_mode', 'loop', 'asynchronous',
    'default_fill_cache', 'default_cache_type', 'version_aware', 'assume_container_exists', 'max_concurrency',
    'timeout', 'connection_timeout', 'read_timeout', 'skip_instance_cache', 'use_listings_cache',
    'listings_expiry_time', 'max_paths'})
#: adlfs options that only tune its own caches and timeouts: they change nothing about what is read.
_ADLFS_CACHE_OPTIONS = frozenset({'blocksize', 'default_fill_cache', 'default_cache_type', 'skip_instance_cache',
                                  'use_listings_cache', 'listings_expiry_time', 'max_paths', 'max_concurrency',
                                  'assume_container_exists', 'socket_timeout', 'timeout', 'connection_timeout',
                                  'read_timeout'})
#: pyarrow's names for settings of the table, refused with what to write instead.
_PYARROW_NAMES = {
    'blob_storage_authority': "'connection_string' with a BlobEndpoint, or 'account_host'",
    'dfs_storage_authority': "'connection_string' with a BlobEndpoint, or 'account_host'",
    'blob_storage_scheme': "'connection_string' with DefaultEndpointsProtocol=http",
    'dfs_storage_scheme': "'connection_string' with DefaultEndpointsProtocol=http",
}
#: Where each credential is looked for in the environment, as adlfs and Azure's tools read it.
_VARIABLES = {'connection_string': 'AZURE_STORAGE_CONNECTION_STRING', 'account_name': 'AZURE_STORAGE_ACCOUNT_NAME',
              'account_key': 'AZURE_STORAGE_ACCOUNT_KEY', 'sas_token': 'AZURE_STORAGE_SAS_TOKEN',
              'client_id': 'AZURE_STORAGE_CLIENT_ID', 'client_secret': 'AZURE_STORAGE_CLIENT_SECRET',
              'tenant_id': 'AZURE_STORAGE_TENANT_ID'}
#: The local emulator's account and key (published by Microsoft for every developer; no secret).
DEVELOPMENT_ACCOUNT = 'devstoreaccount1'
DEVELOPMENT_KEY = 'Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
_DEVELOPMENT_ENDPOINT = f'http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT}'
#: the host suffix of Azure's public cloud.
_DEFAULT_SUFFIX = 'core.windows.net'


@functools.cache
def _installed_adlfs_names() -> frozenset[str]:
    """The keyword names of the installed adlfs (its classes' signatures and fsspec's listings cache)."""
    try:
        import adlfs
    except ImportError:
        return frozenset()
    return fsspec_class_names(adlfs.AzureBlobFileSystem)


AZURE = Cloud(client='adlfs', settings=AZURE_SETTINGS, dict_options=(), client_names=_ADLFS_NAMES,
              more_client_names=_installed_adlfs_names, dict_names=lambda name: None, foreign=_PYARROW_NAMES)


@dataclass(frozen=True)
class AzureSettings:
    """A user's Azure ``storage_options``, read once: the table's settings (None: not given) and the rest by client.

    Attributes:
        account_name, account_key, sas_token, connection_string, client_id, client_secret, tenant_id,
            account_host, anon: the table's settings, as given.
        url_account: the account a URL names (``abfs://container@account.dfs.core.windows.net/...``), or None.
        adlfs_options: adlfs's own options.
        delta_options: options in delta-rs's own form, for delta-rs only.
        iceberg_properties: options in pyiceberg's own form, for pyiceberg only.
    """

    account_name: str | None = None
    account_key: str | None = None
    sas_token: str | None = None
    connection_string: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    tenant_id: str | None = None
    account_host: str | None = None
    anon: Any = None
    url_account: str | None = None
    adlfs_options: Mapping[str, Any] = field(default_factory=dict)
    delta_options: Mapping[str, str] = field(default_factory=dict)
    iceberg_properties: Mapping[str, str] = field(default_factory=dict)

    def table_values(self) -> dict[str, Any]:
        """The table's settings that were given, by field."""
        return {s.field: getattr(self, s.field) for s in AZURE_SETTINGS if getattr(self, s.field) is not None}


@dataclass(frozen=True)
class AzureCredentials:
    """What a client is to use, from the options, else the environment, a connection string read into its parts.

    Attributes:
        account_name, account_key, sas_token, client_id, client_secret, tenant_id: the credentials found.
        blob_endpoint: the Blob service's URL (``https://account.blob.core.windows.net``, or a path-style
            emulator's ``http://127.0.0.1:10000/account``), or None for Azure's public cloud.
        connection_string: the connection string it came from, or None.
    """

    account_name: str | None = None
    account_key: str | None = None
    sas_token: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    tenant_id: str | None = None
    blob_endpoint: str | None = None
    connection_string: str | None = None


def url_account(url: str) -> str | None:
    """The account an ``abfs://container@account.dfs.core.windows.net/...`` URL names, else None."""
    netloc = urlparse(url).netloc
    if '@' not in netloc:
        return None
    host = netloc.rpartition('@')[2]
    return host.split('.')[0] or None


def read_azure_settings(storage_options: Mapping[str, Any] | None, url: str = 'abfs://') -> AzureSettings:
    """The settings ``storage_options`` give an ``abfs://``, ``abfss://`` or ``az://`` URL.

    Raises:
        StorageOptionsError: a key no client takes (named, with the closest accepted name), or one setting given
            under two names with different values.
    """
    read = read_options(AZURE, storage_options, url)
    return AzureSettings(**read.values, url_account=url_account(url), adlfs_options=dict(read.client),
                         delta_options=dict(read.delta), iceberg_properties=dict(read.iceberg))


def _connection_parts(connection_string: str) -> dict[str, str]:
    """A connection string's ``Name=value`` parts (values may hold ``=``, as keys and SAS tokens do)."""
    parts = {}
    for item in connection_string.split(';'):
        name, equals, value = item.partition('=')
        if equals and name.strip():
            parts[name.strip()] = value.strip()
    return parts


def _from_connection_string(connection_string: str) -> dict[str, str | None]:
    parts = _connection_parts(connection_string)
    if parts.get('UseDevelopmentStorage', '').lower() == 'true':
        return {'account_name': DEVELOPMENT_ACCOUNT, 'account_key': DEVELOPMENT_KEY,
                'blob_endpoint': _DEVELOPMENT_ENDPOINT}
    account = parts.get('AccountName')
    endpoint = parts.get('BlobEndpoint')
    if not endpoint and account:
        protocol = parts.get('DefaultEndpointsProtocol', 'https')
        endpoint = f'{protocol}://{account}.blob.{parts.get("EndpointSuffix", _DEFAULT_SUFFIX)}'
    return {'account_name': account, 'account_key': parts.get('AccountKey'),
            'sas_token': parts.get('SharedAccessSignature'), 'blob_endpoint': endpoint}


def find_credentials(settings: AzureSettings, environ: Mapping[str, str]) -> AzureCredentials:
    """The credentials a client is to use: the options', else the environment's; a connection string read.

    A connection string (given, else ``AZURE_STORAGE_CONNECTION_STRING`` when the options give no account) gives
    what it holds; the options' own settings come before it, and the other variables fill what is still missing.
    """
    found: dict[str, str | None] = {name: getattr(settings, name) for name in _VARIABLES}
    if found['account_name'] is None and settings.url_account:
        found['account_name'] = settings.url_account
    connection_string = found['connection_string']
    if connection_string is None and found['account_name'] is None:
        connection_string = environ.get(_VARIABLES['connection_string']) or None
    endpoint = None
    if connection_string:
        parts = _from_connection_string(connection_string)
        endpoint = parts.pop('blob_endpoint', None)
        for name, value in parts.items():
            if found.get(name) is None:
                found[name] = value
    for name, variable in _VARIABLES.items():
        if found.get(name) is None and name != 'connection_string':
            found[name] = environ.get(variable) or None
    if endpoint is None and settings.account_host:
        endpoint = f'https://{settings.account_host}'
    found.pop('connection_string')
    return AzureCredentials(**found, blob_endpoint=endpoint, connection_string=connection_string)


def missing_account(settings: AzureSettings, environ: Mapping[str, str]) -> str | None:
    """What was looked for, in words, when no storage account is named anywhere; else None."""
    if find_credentials(settings, environ).account_name or settings.adlfs_options.get('credential') is not None:
        return None
    return ("storage_options['account_name'] and ['connection_string'] (not given), the URL "
            "(abfs://container@ACCOUNT.dfs.core.windows.net/...: no account), $AZURE_STORAGE_CONNECTION_STRING and "
            "$AZURE_STORAGE_ACCOUNT_NAME (not set)")


def adlfs_options(settings: AzureSettings) -> dict[str, Any]:
    """The keyword arguments of ``adlfs.AzureBlobFileSystem``: the table's settings by adlfs's names, adlfs's own."""
    return {**settings.adlfs_options, **canonical_options(AZURE_SETTINGS, settings.table_values(), {})}


def _endpoint_url(credentials: AzureCredentials) -> str | None:
    """The endpoint delta-rs is told: a path-style (emulator's) endpoint with its account; None for Azure's own."""
    endpoint = credentials.blob_endpoint
    if not endpoint or urlparse(endpoint).hostname == f'{credentials.account_name}.blob.{_DEFAULT_SUFFIX}':
        return None
    return endpoint.rstrip('/')


def azure_delta_options(settings: AzureSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """delta-rs's storage options: the credentials found by its names, then those given in delta-rs's own form."""
    credentials = find_credentials(settings, environ)
    options = {setting.delta: str(getattr(credentials, setting.field)) for setting in AZURE_SETTINGS
               if setting.delta and getattr(credentials, setting.field, None)}
    if settings.anon:
        options['azure_skip_signature'] = 'true'
    endpoint = _endpoint_url(credentials)
    if endpoint:
        options['azure_storage_endpoint'] = endpoint
        if endpoint.startswith('http://'):
            options['allow_http'] = 'true'  # delta-rs's client setting, for every cloud
    return {**options, **settings.delta_options}


def azure_iceberg_properties(settings: AzureSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """Pyiceberg's file IO properties: the credentials found by its names, then those given in its own form."""
    credentials = find_credentials(settings, environ)
    properties = {setting.iceberg: str(getattr(credentials, setting.field)) for setting in AZURE_SETTINGS
                  if setting.iceberg and getattr(credentials, setting.field, None)}
    authority = _authorities(credentials)
    if authority is not None:
        scheme, host = authority
        properties.update({'adls.blob-storage-authority': host, 'adls.dfs-storage-authority': host,
                           'adls.blob-storage-scheme': scheme, 'adls.dfs-storage-scheme': scheme})
    return {**properties, **settings.iceberg_properties}


def _authorities(credentials: AzureCredentials) -> tuple[str, str] | None:
    """The scheme and authority pyarrow's client takes for the Blob endpoint; None for Azure's public cloud.

    pyarrow reaches ``account.<authority>`` when the authority starts with a dot, and ``<authority>/account``
    (path-style, as emulators serve) otherwise.
    """
    endpoint = credentials.blob_endpoint
    if not endpoint:
        return None
    parsed = urlparse(endpoint)
    host, path = parsed.netloc, parsed.path.strip('/')
    account = credentials.account_name or ''
    if path == account and account:
        return parsed.scheme, host
    if not path and host.startswith(f'{account}.') and account:
        return parsed.scheme, host[len(account):]
    raise ValueError(f'cannot use the Blob endpoint {endpoint} with account {account}')


def pyarrow_azure_arguments(settings: AzureSettings, environ: Mapping[str, str],
                            accepted: frozenset[str] | None = None) -> dict[str, Any] | None:
    """The keyword arguments of ``pyarrow.fs.AzureFileSystem`` that mean what the settings mean to adlfs.

    Args:
        settings: the user's options, read.
        environ: the environment (``AZURE_STORAGE_*``).
        accepted: the keyword names the installed pyarrow's ``AzureFileSystem`` takes (None: every name used here).

    Returns:
        The arguments, or None when some option has no equivalent there (anonymous access, a credential object,
        secondary-region reads, versioned reads, an endpoint pyarrow cannot address...): then adlfs reads the URL.
    """
    if set(settings.adlfs_options) - _ADLFS_CACHE_OPTIONS or settings.anon:
        return None
    credentials = find_credentials(settings, environ)
    if not credentials.account_name:
        return None
    try:
        authority = _authorities(credentials)
    except ValueError:
        return None
    arguments: dict[str, Any] = {'account_name': credentials.account_name}
    for name in ('account_key', 'sas_token', 'client_id', 'client_secret', 'tenant_id'):
        value = getattr(credentials, name)
        if value:
            arguments[name] = value.lstrip('?') if name == 'sas_token' else value
    if authority is not None:
        scheme, host = authority
        arguments.update(blob_storage_authority=host, dfs_storage_authority=host.replace('.blob.', '.dfs.'),
                         blob_storage_scheme=scheme, dfs_storage_scheme=scheme)
    if accepted is not None and set(arguments) - accepted:
        return None  # an older pyarrow without SAS tokens or service principals
    return arguments

