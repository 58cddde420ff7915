"""A user's ``storage_options`` turned into the settings of every client we hand them to, in one place.

=================  =============================================================================================
module             what it holds
=================  =============================================================================================
``_table``         what every cloud shares: a :class:`~petastorm.fs.settings._table.Setting` per setting (the
                   names a user may give it, delta-rs's and pyiceberg's names), the one reader of options
                   against a table, the refusal of unknown keys (the closest name suggested)
``s3``             S3's table, its settings read once (:class:`S3Settings`), and what s3fs, delta-rs and
                   pyiceberg take from them
``s3_pyarrow``     pyarrow's own ``S3FileSystem`` arguments, when every option means the same to it
``gcs``            Google Cloud Storage's table (:class:`GcsSettings`), the credentials Google's tools find, and
                   what gcsfs, pyarrow's ``GcsFileSystem``, delta-rs and pyiceberg take from them
``azure``          Azure Blob Storage's table (:class:`AzureSettings`), the credentials Azure's tools find
                   (connection strings read), and what adlfs, pyarrow's ``AzureFileSystem``, delta-rs and
                   pyiceberg take from them
=================  =============================================================================================

This module dispatches on the URL's scheme. :func:`check_storage_options` is called once where options enter,
:func:`petastorm.fs.resolve_url`, before any client is made, so an unknown key is refused before any request; the
clients' arguments come from :func:`fsspec_options` (the fsspec filesystem: s3fs, gcsfs...),
:func:`delta_storage_options` and :func:`iceberg_io_properties`, and pyarrow's S3 client from
:func:`~petastorm.fs.settings.s3_pyarrow.pyarrow_s3_arguments`.

Other schemes: ``hdfs://`` options are pyarrow's ``HadoopFileSystem`` keyword arguments and nothing else is taken;
``file://`` takes none (they are ignored, as always); any other scheme's fsspec filesystem is asked for its
signature, and when its ``__init__`` takes any keyword (``**kwargs``, as fsspec's own filesystems do) the
options pass as they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse

from petastorm.fs.settings._table import library_form, parameter_names, refuse_unknown
from petastorm.fs.settings.azure import (
    AzureSettings,
    adlfs_options,
    azure_delta_options,
    azure_iceberg_properties,
    read_azure_settings,
)
from petastorm.fs.settings.gcs import (
    GcsSettings,
    gcs_delta_options,
    gcs_iceberg_properties,
    gcsfs_options,
    read_gcs_settings,
)
from petastorm.fs.settings.s3 import (
    S3Settings,
    read_s3_settings,
    s3_delta_options,
    s3_iceberg_properties,
    s3fs_options,
    with_client_defaults,
)
from petastorm.fs.settings.s3_pyarrow import pyarrow_s3_arguments

__all__ = [
    'AZURE_SCHEMES',
    'GCS_SCHEMES',
    'HDFS_NAMES',
    'HDFS_SCHEMES',
    'S3_SCHEMES',
    'AzureSettings',
    'GcsSettings',
    'S3Settings',
    'check_storage_options',
    'delta_storage_options',
    'fsspec_options',
    'iceberg_io_properties',
    'native_s3_options',
]

S3_SCHEMES = ('s3', 's3a')
GCS_SCHEMES = ('gs', 'gcs')
AZURE_SCHEMES = ('abfs', 'abfss', 'az')
HDFS_SCHEMES = ('hdfs', 'viewfs')
#: the keyword arguments of ``pyarrow.fs.HadoopFileSystem`` that ``storage_options`` may give (host and port come
#: from the URL and the Hadoop configuration).
HDFS_NAMES = frozenset({'user', 'replication', 'buffer_size', 'default_block_size', 'kerb_ticket', 'extra_conf'})
#: fsspec's own option, taken before the filesystem's ``__init__`` sees the others.
_FSSPEC_NAMES = frozenset({'skip_instance_cache'})


def _scheme(url: str) -> str:
    return urlparse(url).scheme.lower()


def check_storage_options(url: str, storage_options: Mapping[str, Any] | None,
                          fsspec_class: Callable[[str, str], Any] | None = None) -> None:
    """Refuse, before any request, ``storage_options`` keys that no client of ``url`` takes.

    Args:
        url: the URL the options are for.
        storage_options: the user's options.
        fsspec_class: how to find the fsspec filesystem of another scheme (``(scheme, url) -> class``); None
            leaves other schemes' options unchecked (a ``filesystem=`` given: its package may not be installed).

    Raises:
        StorageOptionsError: a key no client takes, named with the accepted names and the closest of them.
    """
    scheme = _scheme(url)
    if not storage_options or scheme == 'file':
        return
    if scheme in S3_SCHEMES:
        read_s3_settings(storage_options, url)
    elif scheme in GCS_SCHEMES:
        read_gcs_settings(storage_options, url)
    elif scheme in AZURE_SCHEMES:
        read_azure_settings(storage_options, url)
    elif scheme in HDFS_SCHEMES:
        refuse_unknown(storage_options, HDFS_NAMES, 'storage_options', url, client="pyarrow's HadoopFileSystem")
    elif fsspec_class is not None:
        cls = fsspec_class(scheme, url)
        names, open_ended = parameter_names(cls.__init__)
        if not open_ended:
            refuse_unknown(storage_options, names | _FSSPEC_NAMES, 'storage_options', url, client=cls.__name__)


def fsspec_options(scheme: str, url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments of the fsspec filesystem of ``url`` (s3fs, gcsfs, adlfs: the settings by its names).

    Raises:
        StorageOptionsError: for S3, GCS and Azure, a key no client takes.
    """
    if scheme in S3_SCHEMES:
        return s3fs_options(with_client_defaults(read_s3_settings(storage_options, url)))
    if scheme in GCS_SCHEMES:
        return gcsfs_options(read_gcs_settings(storage_options, url))
    if scheme in AZURE_SCHEMES:
        return adlfs_options(read_azure_settings(storage_options, url))
    return dict(storage_options or {})


def delta_storage_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, str]:
    """delta-rs's ``storage_options`` for a table at ``url``: the settings by its names, and those in its own form."""
    scheme = _scheme(url)
    if scheme in S3_SCHEMES:
        return s3_delta_options(read_s3_settings(storage_options, url))
    if scheme in GCS_SCHEMES:
        return gcs_delta_options(read_gcs_settings(storage_options, url), os.environ)
    if scheme in AZURE_SCHEMES:
        return azure_delta_options(read_azure_settings(storage_options, url), os.environ)
    return library_form(storage_options, 'delta')


def iceberg_io_properties(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, str]:
    """The file IO properties of pyiceberg for a table at ``url``: the settings by its names, and those in its form."""
    scheme = _scheme(url)
    if scheme in S3_SCHEMES:
        return s3_iceberg_properties(read_s3_settings(storage_options, url))
    if scheme in GCS_SCHEMES:
        return gcs_iceberg_properties(read_gcs_settings(storage_options, url), os.environ)
    if scheme in AZURE_SCHEMES:
        return azure_iceberg_properties(read_azure_settings(storage_options, url), os.environ)
    return library_form(storage_options, 'iceberg')


def native_s3_options(storage_options: Mapping[str, Any] | None,
                      environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The keyword arguments of ``pyarrow.fs.S3FileSystem`` for ``storage_options`` (None: they need s3fs).

    The options as given, without our client defaults (see
    :func:`~petastorm.fs.settings.s3_pyarrow.pyarrow_s3_arguments`).
    """
    return pyarrow_s3_arguments(read_s3_settings(storage_options), environ)
