"""pyarrow's own ``GcsFileSystem`` and ``AzureFileSystem``, made when every ``storage_option`` has a meaning there.

As for S3 (:mod:`petastorm.fs._native_s3`), pyarrow's clients (Google's and Microsoft's C++ SDKs) read a row group's
column chunks in parallel without holding the GIL and cost a fraction of the CPU per request of gcsfs and adlfs
(aiohttp and the Azure SDK, in Python); the store layer keeps their files open with their footers
(:mod:`petastorm.store.data_files`). Which options translate is :mod:`petastorm.fs.settings.gcs` and
:mod:`petastorm.fs.settings.azure`; this module makes the clients, refusing before any request a store whose
credentials are nowhere to be found.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pyarrow.fs as pafs

from petastorm._describe import display_url
from petastorm.errors import StorageCredentialsError
from petastorm.fs._native_s3 import grow_io_pool
from petastorm.fs.settings._table import parameter_names
from petastorm.fs.settings.azure import (
    find_credentials,
    missing_account,
    pyarrow_azure_arguments,
    read_azure_settings,
)
from petastorm.fs.settings.gcs import gcs_endpoint, missing_credentials, pyarrow_gcs_arguments, read_gcs_settings

__all__ = ['azure_endpoint', 'check_cloud_credentials', 'gcs_endpoint_of', 'has_native_azure',
           'native_azure_filesystem', 'native_gcs_filesystem']


#: what a missing credential is called per cloud (``gcs``: Google's), and what to do about it.
_MISSING = {
    True: ('Google Cloud credentials found',
           "Log in with `gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS to a service "
           "account's key file, or pass storage_options={'token': 'anon'} for a public bucket"),
    False: ('Azure storage account named',
            "Pass account_name (with account_key, sas_token, or nothing for Azure's default credentials) or "
            "connection_string in storage_options, or set AZURE_STORAGE_ACCOUNT_NAME or "
            "AZURE_STORAGE_CONNECTION_STRING"),
}


def check_cloud_credentials(scheme: str, url: str, storage_options: dict | None, *, gcs: bool) -> None:
    """Refuse a GCS (``gcs=True``) or Azure URL whose credentials are nowhere to be found, saying where we looked.

    Raises:
        StorageCredentialsError: none of the places each cloud's own tools look holds credentials.
    """
    if gcs:
        looked = missing_credentials(read_gcs_settings(storage_options, url), os.environ)
    else:
        looked = missing_account(read_azure_settings(storage_options, url), os.environ)
    if looked:
        what, advice = _MISSING[gcs]
        raise StorageCredentialsError(f'no {what} for {display_url(url)}: looked at {looked}. {advice}')


def _native(filesystem: type[pafs.FileSystem], arguments: dict[str, Any] | None) -> pafs.FileSystem | None:
    """pyarrow's client made with ``arguments``, its I/O pool grown first; None without arguments."""
    if arguments is None:
        return None
    grow_io_pool()
    return filesystem(**arguments)


def native_gcs_filesystem(url: str, storage_options: dict | None) -> pafs.FileSystem | None:
    """pyarrow's ``GcsFileSystem`` for a ``gs://`` URL when its options mean the same to it (None: use gcsfs)."""
    return _native(pafs.GcsFileSystem, pyarrow_gcs_arguments(read_gcs_settings(storage_options, url), os.environ))


def gcs_endpoint_of(url: str, storage_options: dict | None) -> str | None:
    """The endpoint a ``gs://`` URL's clients reach (None: Google's own)."""
    return gcs_endpoint(read_gcs_settings(storage_options, url), os.environ)


@functools.cache
def _azure_names() -> frozenset[str]:
    """The keyword names the installed pyarrow's ``AzureFileSystem`` takes."""
    names, _ = parameter_names(pafs.AzureFileSystem.__init__)
    if not names:  # a compiled class shows no signature: read its docstring's
        names = frozenset({'account_name', 'account_key', 'blob_storage_authority', 'dfs_storage_authority',
                           'blob_storage_scheme', 'dfs_storage_scheme'})
        doc = pafs.AzureFileSystem.__doc__ or ''
        names |= {name for name in ('sas_token', 'client_id', 'client_secret', 'tenant_id') if name in doc}
    return names


def has_native_azure() -> bool:
    """Whether the installed pyarrow has an ``AzureFileSystem`` (16 and later; before, Azure URLs go to adlfs)."""
    return hasattr(pafs, 'AzureFileSystem')


def native_azure_filesystem(url: str, storage_options: dict | None) -> pafs.FileSystem | None:
    """pyarrow's ``AzureFileSystem`` for an Azure URL when there is one and its options mean the same to it.

    None: use adlfs.
    """
    if not has_native_azure():
        return None
    return _native(pafs.AzureFileSystem,
                   pyarrow_azure_arguments(read_azure_settings(storage_options, url), os.environ, _azure_names()))


def azure_endpoint(url: str, storage_options: dict | None) -> Any:
    """The Blob endpoint an Azure URL's clients reach (None: Azure's public cloud)."""
    return find_credentials(read_azure_settings(storage_options, url), os.environ).blob_endpoint
