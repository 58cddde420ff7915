"""Google Cloud Storage's ``storage_options``: one table read once into :class:`GcsSettings`, and each client's.

``storage_options`` for ``gs://`` (and ``gcs://``) are gcsfs's keyword arguments. The table (:data:`GCS_SETTINGS`)
lists the settings the clients share under each name a user may give them; the rest are gcsfs's own
(``requester_pays``, ``session_kwargs``, its cache settings...). :func:`read_gcs_settings` reads them once and
refuses, before any request, a key that no client takes; pyarrow's names (``endpoint_override``, ``anonymous``...)
are refused with the gcsfs name to write.

Credentials are found as Google's own tools find them: ``token`` in the options (``'anon'``, ``'google_default'``,
a service account's JSON file, a dict or a ``google.auth`` credentials object), else application default
credentials: ``GOOGLE_APPLICATION_CREDENTIALS``, the file ``gcloud auth application-default login`` writes, or the
metadata server of Google's own machines. :func:`missing_credentials` says which of these were looked for when none
is there. The endpoint is ``endpoint_url``, else ``STORAGE_EMULATOR_HOST`` (as Google's libraries read it).

Whether the clients read anonymously is one rule (:func:`reads_anonymously`). From the settings: gcsfs's keyword
arguments (:func:`gcsfs_options`), delta-rs's storage options (:func:`gcs_delta_options`), pyiceberg's file IO
properties (:func:`gcs_iceberg_properties`), and pyarrow's ``GcsFileSystem`` arguments
(:func:`pyarrow_gcs_arguments`) whenever every option has a meaning there.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from petastorm.fs.settings._table import (
    Cloud,
    Setting,
    canonical_options,
    endpoint_parts,
    fsspec_class_names,
    library_options,
    read_options,
)

__all__ = ['GCS', 'GCS_RETRY_SECONDS', 'GCS_SETTINGS', 'GcsSettings', 'gcs_delta_options', 'gcs_endpoint',
           'gcs_iceberg_properties', 'gcsfs_options', 'missing_credentials', 'pyarrow_gcs_arguments',
           'read_gcs_settings', 'reads_anonymously']

#: The settings every GCS client takes: gcsfs's name first, then the aliases; delta-rs's and pyiceberg's names.
#: ``token`` has no library name: what it means depends on its value (:func:`gcs_delta_options`).
GCS_SETTINGS: tuple[Setting, ...] = (
    Setting('token', ('token',), what='the credentials'),
    Setting('project', ('project', 'project_id'), iceberg='gcs.project-id', what='the project'),
    Setting('endpoint_url', ('endpoint_url',), iceberg='gcs.service.host', what='the endpoint'),
    Setting('default_location', ('default_location',), iceberg='gcs.default-bucket-location',
            what='the location of new buckets'),
    Setting('requester_pays', ('requester_pays',), iceberg='gcs.requester-pays', what='requester pays'),
    Setting('access', ('access',), iceberg='gcs.access', what='the access scope'),
    Setting('consistency', ('consistency',), iceberg='gcs.consistency', what='the consistency check'),
    Setting('version_aware', ('version_aware',), iceberg='gcs.version-aware', what='versioned reads'),
)

#: gcsfs's keyword arguments besides the table's, as far as known without importing it (its signature's and
#: fsspec's instance and listings caches).
_GCSFS_NAMES = frozenset({
    'cache_timeout', 'secure_serialize', 'check_connection', 'requests_timeout', 'block_size', 'session_kwargs',
    'timeout', 'on_google', 'asynchronous', 'loop', 'skip_instance_cache', 'use_listings_cache',
    'listings_expiry_time', 'max_paths', 'fixed_key_metadata', 'fill_cache', 'cache_type'})
#: gcsfs options that only tune its own caches and timeouts: they change nothing about what is read.
_GCSFS_CACHE_OPTIONS = frozenset({'cache_timeout', 'block_size', 'skip_instance_cache', 'use_listings_cache',
                                  'listings_expiry_time', 'max_paths', 'fill_cache', 'cache_type', 'check_connection',
                                  'secure_serialize', 'consistency'})
#: pyarrow's names for settings of the table, refused with what to write instead.
_PYARROW_NAMES = {
    'endpoint_override': "'endpoint_url' (a URL, 'http://host:port')",
    'anonymous': "'token': 'anon'",
    'scheme': "an 'http://' endpoint_url",
    'default_bucket_location': "'default_location'",
    'access_token': "'token' (a google.oauth2.credentials.Credentials made from the access token)",
}
#: how long pyarrow's GCS client retries a transient error before giving up (its own default is 15 minutes).
GCS_RETRY_SECONDS = 60.0
#: what the environment may hold for Google's credentials, in the order Google's libraries look.
_CREDENTIAL_VARIABLE = 'GOOGLE_APPLICATION_CREDENTIALS'
#: variables set on Google's own machines (Cloud Run, Cloud Functions, a metadata server named by hand).
_GOOGLE_MACHINE_VARIABLES = ('GCE_METADATA_HOST', 'GCE_METADATA_IP', 'K_SERVICE', 'CLOUD_RUN_JOB',
                             'FUNCTION_TARGET')
#: the tokens that mean "find the credentials as Google's libraries do".
_DEFAULT_TOKENS = (None, 'google_default')


@functools.cache
def _installed_gcsfs_names() -> frozenset[str]:
    """The keyword names of the installed gcsfs (its classes' signatures and fsspec's listings cache)."""
    try:
        import gcsfs
    except ImportError:
        return frozenset()
    return fsspec_class_names(gcsfs.GCSFileSystem)


GCS = Cloud(client='gcsfs', settings=GCS_SETTINGS, dict_options=('session_kwargs',), client_names=_GCSFS_NAMES,
            more_client_names=_installed_gcsfs_names, dict_names=lambda name: None, foreign=_PYARROW_NAMES)


@dataclass(frozen=True)
class GcsSettings:
    """A user's GCS ``storage_options``, read once: the table's settings (None: not given) and the rest by client.

    Attributes:
        token: the credentials as gcsfs takes them.
        project, endpoint_url, default_location, requester_pays, access, consistency, version_aware: the table's
            settings.
        session_kwargs: aiohttp session arguments, for gcsfs.
        gcsfs_options: gcsfs's own options.
        delta_options: options in delta-rs's own form, for delta-rs only.
        iceberg_properties: options in pyiceberg's own form, for pyiceberg only.
    """

    token: Any = None
    project: str | None = None
    endpoint_url: str | None = None
    default_location: str | None = None
    requester_pays: Any = None
    access: str | None = None
    consistency: str | None = None
    version_aware: Any = None
    session_kwargs: Mapping[str, Any] = field(default_factory=dict)
    gcsfs_options: Mapping[str, Any] = field(default_factory=dict)
    delta_options: Mapping[str, str] = field(default_factory=dict)
    iceberg_properties: Mapping[str, str] = field(default_factory=dict)

    def table_values(self) -> dict[str, Any]:
        """The table's settings that were given, by field."""
        return {s.field: getattr(self, s.field) for s in GCS_SETTINGS if getattr(self, s.field) is not None}


def read_gcs_settings(storage_options: Mapping[str, Any] | None, url: str = 'gs://') -> GcsSettings:
    """The settings ``storage_options`` give a ``gs://`` URL.

    Raises:
        StorageOptionsError: a key no client takes (named, with the closest accepted name), or one setting given
            under two names with different values.
    """
    read = read_options(GCS, storage_options, url)
    return GcsSettings(**read.values, session_kwargs=dict(read.dicts.get('session_kwargs', {})),
                       gcsfs_options=dict(read.client), delta_options=dict(read.delta),
                       iceberg_properties=dict(read.iceberg))


def gcs_endpoint(settings: GcsSettings, environ: Mapping[str, str]) -> str | None:
    """The endpoint the clients are told to use: the options', else ``STORAGE_EMULATOR_HOST``; None for Google's."""
    endpoint = settings.endpoint_url or environ.get('STORAGE_EMULATOR_HOST') or None
    if endpoint and '://' not in endpoint:
        endpoint = f'http://{endpoint}'  # Google's libraries read a bare host:port as plain HTTP
    return endpoint


def missing_credentials(settings: GcsSettings, environ: Mapping[str, str]) -> str | None:
    """What was looked for, in words, when no credentials are to be found for Google's own endpoint; else None.

    An emulator's endpoint needs none, and ``token`` given is gcsfs's to check.
    """
    if settings.token not in _DEFAULT_TOKENS or gcs_endpoint(settings, environ):
        return None
    if environ.get(_CREDENTIAL_VARIABLE) or _has_gcloud_credentials(environ) or _on_google_machine(environ):
        return None
    return (f"storage_options['token'] (not given), ${_CREDENTIAL_VARIABLE} (not set), the application default "
            f"credentials of `gcloud auth application-default login` ({_gcloud_credentials_file(environ)}: none), "
            f"and the metadata server of Google's machines (this is not one)")


def _gcloud_credentials_file(environ: Mapping[str, str]) -> str:
    config = environ.get('CLOUDSDK_CONFIG')
    if not config:
        base = environ.get('APPDATA') if os.name == 'nt' else None
        config = os.path.join(base, 'gcloud') if base else os.path.join(os.path.expanduser('~'), '.config', 'gcloud')
    return os.path.join(config, 'application_default_credentials.json')


def _has_gcloud_credentials(environ: Mapping[str, str]) -> bool:
    return os.path.isfile(_gcloud_credentials_file(environ))


def _on_google_machine(environ: Mapping[str, str]) -> bool:
    """Whether this is one of Google's machines, whose metadata server gives credentials (no request made)."""
    if any(environ.get(name) for name in _GOOGLE_MACHINE_VARIABLES):
        return True
    try:
        with open('/sys/class/dmi/id/product_name') as product:
            return 'Google' in product.read()
    except OSError:
        return False


def gcsfs_options(settings: GcsSettings) -> dict[str, Any]:
    """The keyword arguments of ``gcsfs.GCSFileSystem``: the table's settings under gcsfs's names, and gcsfs's own."""
    dicts = {'session_kwargs': settings.session_kwargs}
    return {**settings.gcsfs_options, **canonical_options(GCS_SETTINGS, settings.table_values(), dicts)}


def _library_values(settings: GcsSettings, environ: Mapping[str, str]) -> dict[str, Any]:
    return {**settings.table_values(), 'endpoint_url': gcs_endpoint(settings, environ)}


def reads_anonymously(settings: GcsSettings, environ: Mapping[str, str]) -> bool:
    """Whether the clients send no credentials: ``token='anon'``, or an emulator's endpoint with none to be found.

    gcsfs falls back to anonymous access in the second case too; an emulator checks no credentials.
    """
    if settings.token == 'anon':
        return True
    return settings.token in _DEFAULT_TOKENS and bool(gcs_endpoint(settings, environ)) and \
        not _has_default_credentials(environ)


def gcs_delta_options(settings: GcsSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """delta-rs's storage options: a service account's file, the endpoint, anonymous access, then delta-rs's own.

    delta-rs's GCS client (Rust's ``object_store``) takes the endpoint as ``google_base_url`` and anonymous access as
    ``google_skip_signature``; it reads tables through both (its writes still ask Google for a token).
    """
    options: dict[str, str] = {}
    token = settings.token
    if isinstance(token, str) and token not in ('anon', 'google_default', 'cache', 'cloud', 'browser'):
        options['google_service_account'] = token  # a service account's JSON file
    endpoint = gcs_endpoint(settings, environ)
    if endpoint:
        options['google_base_url'] = endpoint.rstrip('/')
    if reads_anonymously(settings, environ):
        options['google_skip_signature'] = 'true'
    return {**options, **settings.delta_options}


def gcs_iceberg_properties(settings: GcsSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The file IO properties of pyiceberg: the table's settings by pyiceberg's names, then those in its form."""
    properties = library_options(GCS_SETTINGS, _library_values(settings, environ), 'iceberg')
    if settings.token == 'anon':
        # pyiceberg's gcsfs file IO passes it on as gcsfs's token; its pyarrow file IO has no anonymous access (it
        # would wait for Google's credentials), so the gcsfs one is named
        properties.update({'gcs.token': 'anon', 'py-io-impl': 'pyiceberg.io.fsspec.FsspecFileIO'})
    return {**properties, **settings.iceberg_properties}


def pyarrow_gcs_arguments(settings: GcsSettings, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The keyword arguments of ``pyarrow.fs.GcsFileSystem`` that mean what the settings mean to gcsfs.

    Returns:
        The arguments, or None when some option has no equivalent there (a service account's file given as
        ``token``, requester-pays buckets, versioned reads, aiohttp settings...): then gcsfs reads the URL.
    """
    if settings.session_kwargs or set(settings.gcsfs_options) - _GCSFS_CACHE_OPTIONS:
        return None
    if settings.requester_pays or settings.version_aware or settings.access not in (None, 'read_only',
                                                                                    'read_write', 'full_control'):
        return None
    token = settings.token
    if token not in _DEFAULT_TOKENS and token != 'anon':
        return None  # a file, a dict or a credentials object: gcsfs reads them
    from datetime import timedelta

    arguments: dict[str, Any] = {'retry_time_limit': timedelta(seconds=GCS_RETRY_SECONDS)}
    endpoint = gcs_endpoint(settings, environ)
    if endpoint:
        parts = endpoint_parts(endpoint)
        if parts is None:
            return None
        arguments['scheme'], arguments['endpoint_override'] = parts
    if reads_anonymously(settings, environ):
        arguments['anonymous'] = True
    if settings.project:
        arguments['project_id'] = settings.project
    if settings.default_location:
        arguments['default_bucket_location'] = settings.default_location
    return arguments


def _has_default_credentials(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(_CREDENTIAL_VARIABLE)) or _has_gcloud_credentials(environ)
