"""The converters of one Spark session: which DataFrames were already materialized, and where.

``make_spark_converter`` called again with a DataFrame whose analyzed plan gives the same result
(``DataFrame.sameSemantics``) and the same options reuses the earlier copy instead of writing another. The
bookkeeping lives in one :class:`ConverterCache` per ``SparkSession``, attached to the session object, so it
lives and dies with the session and no module-level state is kept.

The cache also owns the clean-up of the directories this process created: on the first one it registers an
``atexit`` hook that deletes those never passed to ``delete()``; one that another process is still reading is
left to that process, which deletes it when done (:mod:`petastorm.spark.in_use`). A process that merely
received a pickled converter deletes nothing at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from petastorm.fs import display_url
from petastorm.spark import cache_dir, in_use
from petastorm.spark.dataframe_prep import ConversionOptions

__all__ = ['CacheEntry', 'ConverterCache']

logger = logging.getLogger(__name__)

_SESSION_ATTRIBUTE = '_petastorm_converter_cache'


@dataclass
class CacheEntry:
    """One materialized DataFrame."""

    df: Any
    plan_hash: int
    options: ConversionOptions
    dir_url: str
    file_urls: list[str]
    dataset_size: int


class ConverterCache:
    """Materialized DataFrames of one session, the directories this process created, and how to delete them."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._entries: list[CacheEntry] = []
        self._created: list[str] = []
        self._creator_pid = os.getpid()
        self._atexit_registered = False
        self.delete_dir_handler: Callable[[str], None] = cache_dir.delete_dir

    @classmethod
    def of_session(cls, spark: Any) -> ConverterCache:
        """The cache attached to ``spark``, made on first use."""
        cache = getattr(spark, _SESSION_ATTRIBUTE, None)
        if cache is None:
            cache = cls()
            setattr(spark, _SESSION_ATTRIBUTE, cache)
        return cache

    @property
    def entries(self) -> list[CacheEntry]:
        """The materialized DataFrames (a copy)."""
        with self.lock:
            return list(self._entries)

    def find(self, df: Any, plan_hash: int, options: ConversionOptions) -> CacheEntry | None:
        """The entry for a DataFrame with the same result and options whose directory still exists, if any."""
        with self.lock:
            for entry in self._entries:
                if entry.plan_hash != plan_hash or entry.options != options or not df.sameSemantics(entry.df):
                    continue
                if cache_dir.dir_exists(entry.dir_url):
                    return entry
                logger.warning('the cached copy %s of an equal DataFrame was deleted outside petastorm; writing '
                               'it again', display_url(entry.dir_url))
                self._entries.remove(entry)
            return None

    def add(self, entry: CacheEntry) -> None:
        """Remember a converter's copy so that an equal DataFrame converted later reuses it."""
        with self.lock:
            self._entries.append(entry)

    def record_created(self, dir_url: str) -> None:
        """Note a directory this process is about to write, so that exit removes it if nobody deletes it."""
        with self.lock:
            self._created.append(dir_url)
            if not self._atexit_registered:
                atexit.register(self.cleanup_at_exit)
                self._atexit_registered = True

    def forget(self, dir_url: str) -> None:
        """Drop every trace of a directory (after it was deleted)."""
        with self.lock:
            self._entries = [entry for entry in self._entries if entry.dir_url != dir_url]
            self._created = [url for url in self._created if url != dir_url]

    def created_here(self, dir_url: str) -> bool:
        """Whether this process wrote the directory (and so removes it at exit unless it was deleted)."""
        with self.lock:
            return dir_url in self._created

    def delete(self, dir_url: str) -> None:
        """Delete a directory with the registered handler and forget it."""
        self.delete_dir_handler(dir_url)
        self.forget(dir_url)

    def cleanup_at_exit(self) -> None:
        """Delete the directories this process created and nobody deleted, unless another process reads them."""
        if os.getpid() != self._creator_pid:
            return  # a forked child inherited the hook: the directories are not its own
        with self.lock:
            pending = list(self._created)
        for dir_url in pending:
            try:
                readers = in_use.other_live_readers(dir_url)
                if readers and not in_use.hand_over(dir_url):
                    logger.warning('leaving converter cache %s in place at exit: process(es) %s still read it; '
                                   'the last of them deletes it when done', display_url(dir_url),
                                   ', '.join(f'{marker.pid}@{marker.host}' for marker in readers))
                    continue
                self.delete(dir_url)
            except Exception as err:  # noqa: BLE001 - exit must go on for the other directories
                logger.warning('could not delete converter cache %s at exit: %s', display_url(dir_url), err)
