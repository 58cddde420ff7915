"""The Parquet footers of a remote store, kept in a reader's local disk cache beside its row groups.

A reader of a remote store plans from the files' footers (Petastorm 0.13.1's datasets and plain Parquet without a
``_metadata`` summary): a request, often two, per file. With ``cache_type='local-disk'`` or
``'local-disk-decoded'`` the row groups of a second epoch come from the cache, and without the footers kept too,
a new reader would still ask the store for every footer before its first batch. :class:`FooterCache` keeps them,
keyed like the row groups by the file's identity in the store's listing (dataset, path, size, modification
time): a rewritten file has a new key and its footer is read again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from petastorm.cache._base import CacheBase
from petastorm.cache._row_groups import FileStamp

__all__ = ['FooterCache']


@dataclass(frozen=True)
class FooterCache:
    """Footers through a cache, for the files whose size and modification time the listing gave.

    Picklable (the cache and plain values), so worker processes that open files read their footers from it too.

    Attributes:
        cache: where the footers are kept, as bytes of a Parquet metadata file.
        dataset: the dataset URL (or URLs), part of every key.
        stamps: each file's size and modification time when the store was listed.
    """

    cache: CacheBase
    dataset: str
    stamps: Mapping[str, FileStamp]

    def footer(self, path: str, read: Callable[[], pq.FileMetaData]) -> pq.FileMetaData:
        """The footer of ``path``: from the cache, or ``read()`` and kept (files without a full stamp: ``read()``)."""
        stamp = self.stamps.get(path)
        if stamp is None or stamp.size is None or stamp.mtime_ns is None:
            return read()  # a rewrite would go unnoticed without both
        key = json.dumps([self.dataset, path, stamp.size, stamp.mtime_ns, 'footer'])
        fresh: list[pq.FileMetaData] = []

        def fill() -> bytes:
            fresh.append(read())
            sink = pa.BufferOutputStream()
            fresh[0].write_metadata_file(sink)
            return sink.getvalue().to_pybytes()

        stored = self.cache.get(key, fill)
        if fresh:
            return fresh[0]
        try:
            return pq.read_metadata(pa.BufferReader(stored))
        except (pa.ArrowException, OSError):
            return read()  # an entry damaged on disk: the store still has the footer
