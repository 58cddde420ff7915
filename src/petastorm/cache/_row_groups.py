"""The raw row-group cache: keys made from the identity of a file's content, and reads through a cache.

The reader's ``cache_type='local-disk'`` caches the Arrow table of a row group's columns exactly as read from the
file (before any filtering, shuffling or decoding), so predicates, drop partitions, shuffles and transforms work
the same with or without a cache.

:class:`RowGroupCache` builds the keys from the file's identity: dataset, file path, size, modification time,
row group and column set. A file that is rewritten gets a new size or modification time, hence a new key, and
is never served stale.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from petastorm.cache._base import CacheBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStamp:
    """What identifies a file's content without reading it: its size and modification time (None if unknown)."""

    size: int | None
    mtime_ns: int | None


def file_stamps(filesystem: pafs.FileSystem, paths: Sequence[str],
                known: Mapping[str, FileStamp] | None = None) -> dict[str, FileStamp]:
    """The size and modification time of every file: ``known`` ones (the store's listing), the others asked for.

    Asking is one batched metadata call, which on an object store is a request per file.
    """
    if not paths:
        return {}
    known = known or {}
    unknown = [path for path in paths if path not in known]
    infos = filesystem.get_file_info(unknown) if unknown else []
    stamps = {path: FileStamp(info.size, info.mtime_ns) for path, info in zip(unknown, infos, strict=True)}
    stamps.update((path, known[path]) for path in paths if path in known)
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

    def identity(self, path: str, row_group: int, columns: Sequence[str]) -> list[Any]:
        """What names the content of ``columns`` (in any order) of a row group.

        The dataset, the file, its size and modification time, the row group and the sorted columns.
        """
        stamp = self.stamps.get(path)
        size, mtime_ns = (stamp.size, stamp.mtime_ns) if stamp is not None else (None, None)
        return [self.dataset, path, size, mtime_ns, row_group, sorted(columns)]

    def key(self, path: str, row_group: int, columns: Sequence[str]) -> str:
        """The cache key of columns ``columns`` (in any order) of row group ``row_group`` of file ``path``."""
        # JSON keeps the parts unambiguous whatever characters paths and column names contain.
        return json.dumps(self.identity(path, row_group, columns))

    def read(self, path: str, row_group: int, columns: Sequence[str], read_func: Callable[[], pa.Table]) -> pa.Table:
        """The table of ``columns`` of the row group: from the cache, or from ``read_func()`` on a miss.

        Args:
            path: the data file.
            row_group: the row-group number in the file.
            columns: the columns ``read_func`` reads, in the order the result must have.
            read_func: reads those columns from the file.
        """
        return in_order(self.cache.get(self.key(path, row_group, columns), read_func), columns)


def in_order(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``table``'s columns in the order of ``columns`` (cache keys ignore the order, so any order hits).

    ``columns`` may name struct leaves by their Parquet path (``'st.a'``): a table read by such paths holds the
    struct's column, ``'st'``.
    """
    names = list(dict.fromkeys(c if c in table.column_names else c.split('.')[0] for c in columns))
    return table if table.column_names == names else table.select(names)

