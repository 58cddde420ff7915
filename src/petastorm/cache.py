"""Caches of what the reader reads from the filesystem, and the keys that identify it.

A cache maps a key to a value computed on a miss by ``fill_cache_func``. The reader caches one thing: the Arrow
table of a row group's columns exactly as read from the file (before any filtering, shuffling or decoding), so
predicates, drop partitions, shuffles and transforms work the same with or without a cache.

:class:`RowGroupCache` builds the keys from the file's identity: dataset, file path, size, modification time,
row group and column set. A file that is rewritten gets a new size or modification time, hence a new key, and
is never served stale.

Example::

    cache = make_cache('local-disk', '/tmp/petastorm-cache', 10 << 30, 1 << 20)
    table = cache.get('some key', lambda: expensive_read())
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

logger = logging.getLogger(__name__)

__all__ = ['CacheBase', 'FileStamp', 'NullCache', 'RowGroupCache', 'file_stamps', 'make_cache']


class CacheBase(ABC):
    """A key-value cache whose values are computed on a miss."""

    @abstractmethod
    def get(self, key: str, fill_cache_func: Callable[[], Any]) -> Any:
        """The value cached under ``key``; on a miss, ``fill_cache_func()`` computes it (and it may be stored).

        Args:
            key: identifies the value; equal keys must mean equal values.
            fill_cache_func: called without arguments to compute the value on a miss.
        """

    def cleanup(self) -> None:
        """Release what the cache holds on disk, if it was asked to (nothing by default)."""
        logger.debug('%s has nothing to clean up', type(self).__name__)


class NullCache(CacheBase):
    """A cache that caches nothing: every ``get`` calls ``fill_cache_func``."""

    def get(self, key: str, fill_cache_func: Callable[[], Any]) -> Any:
        """Return ``fill_cache_func()``."""
        return fill_cache_func()


@dataclass(frozen=True)
class FileStamp:
    """What identifies a file's content without reading it: its size and modification time (None if unknown)."""

    size: int | None
    mtime_ns: int | None


def file_stamps(filesystem: pafs.FileSystem, paths: Sequence[str]) -> dict[str, FileStamp]:
    """The size and modification time of every file, from one batched metadata call."""
    if not paths:
        return {}
    infos = filesystem.get_file_info(list(paths))
    stamps = {path: FileStamp(info.size, info.mtime_ns) for path, info in zip(paths, infos, strict=True)}
    if any(stamp.mtime_ns is None for stamp in stamps.values()):
        # Some fsspec filesystems report no modification time: a rewrite that keeps the size goes unnoticed.
        logger.info('the filesystem %s reports no modification times; cached row groups are keyed by file size',
                    filesystem.type_name)
    return stamps


@dataclass(frozen=True)
class RowGroupCache:
    """Caches the raw column tables of row groups, keyed by the identity of the file content.

    It is part of the worker context, so it is sent to worker processes: it holds only the cache (which must be
    picklable, as :class:`~petastorm.local_disk_cache.LocalDiskCache` is) and plain values.

    Attributes:
        cache: where the tables are kept.
        dataset: the dataset URL (or URLs), part of every key.
        stamps: size and modification time of the dataset's files, taken when the reader was created.
    """

    cache: CacheBase
    dataset: str
    stamps: Mapping[str, FileStamp]

    def key(self, path: str, row_group: int, columns: Sequence[str]) -> str:
        """The cache key of columns ``columns`` (in any order) of row group ``row_group`` of file ``path``."""
        stamp = self.stamps.get(path)
        size, mtime_ns = (stamp.size, stamp.mtime_ns) if stamp is not None else (None, None)
        # JSON keeps the parts unambiguous whatever characters paths and column names contain.
        return json.dumps([self.dataset, path, size, mtime_ns, row_group, sorted(columns)])

    def read(self, path: str, row_group: int, columns: Sequence[str], read_func: Callable[[], pa.Table]) -> pa.Table:
        """The table of ``columns`` of the row group: from the cache, or from ``read_func()`` on a miss.

        Args:
            path: the data file.
            row_group: the row-group number in the file.
            columns: the columns ``read_func`` reads, in the order the result must have.
            read_func: reads those columns from the file.
        """
        table = self.cache.get(self.key(path, row_group, columns), read_func)
        if table.column_names != list(columns):
            # The key ignores column order (so any order hits); give the caller the order it asked for.
            table = table.select(list(columns))
        return table


def make_cache(cache_type: str, location: Any, size_limit: int | None, row_size_estimate: int | None,
               extra_settings: Mapping[str, Any] | None = None) -> CacheBase:
    """The cache a reader's ``cache_*`` arguments ask for.

    Args:
        cache_type: ``'null'`` (or None) for no cache, ``'local-disk'`` for a
            :class:`~petastorm.local_disk_cache.LocalDiskCache`.
        location: the cache directory (local-disk).
        size_limit: the cache's size limit in bytes (local-disk).
        row_size_estimate: expected size of one entry in bytes, used to check ``size_limit`` (local-disk).
        extra_settings: more keyword arguments of ``LocalDiskCache`` (for example ``{'cleanup': False}``).

    Raises:
        ValueError: unknown ``cache_type`` or bad settings.
        CacheLocationError: ``location`` cannot be used as a cache directory.
    """
    if cache_type is None or cache_type == 'null':
        return NullCache()
    if cache_type == 'local-disk':
        # Imported here: only local-disk readers need fcntl and the disk layout code.
        from petastorm.local_disk_cache import LocalDiskCache

        return LocalDiskCache(location, size_limit, row_size_estimate, **dict(extra_settings or {}))
    raise ValueError(f"Unknown cache_type: {cache_type!r}; expected 'null' or 'local-disk'")
