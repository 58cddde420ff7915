"""Storage: dataset URLs to ``pyarrow.fs`` filesystems and paths, for every reader, writer and tool.

Local paths, HDFS, S3, GCS, Azure, ``memory://`` and any fsspec scheme resolve here and nowhere else; see
:mod:`petastorm.fs._resolve` for the schemes and ``storage_options``, :mod:`petastorm.fs.hadoop` for HDFS, and
:mod:`petastorm.fs._handler` for what remote reads do (exact ranged requests, retries, clear errors).
Petastorm's own module paths, ``petastorm.fs_utils`` and ``petastorm.hdfs.namenode``, re-export from here.
"""

from __future__ import annotations

from petastorm._describe import display_url
from petastorm.fs._handler import StorageHandler
from petastorm.fs._resolve import (
    ResolvedLocation,
    as_arrow_filesystem,
    normalize_dir_url,
    path_in,
    path_to_url,
    resolve_location,
    resolve_url,
)
from petastorm.fs._retry import DEFAULT_RETRY, RetryPolicy

__all__ = [
    'DEFAULT_RETRY', 'ResolvedLocation', 'RetryPolicy', 'StorageHandler', 'as_arrow_filesystem', 'display_url',
    'normalize_dir_url', 'path_in', 'path_to_url', 'resolve_location', 'resolve_url',
]
