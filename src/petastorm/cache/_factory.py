"""From a reader's ``cache_*`` arguments to its cache: the cache types, their checks, and the caches they make."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlparse

import pyarrow.fs as pafs

from petastorm._checks import check_positive_int, is_integer
from petastorm.cache._base import CacheBase, NullCache
from petastorm.cache._decoded import DecodedRowGroupCache, decodes_in_cache
from petastorm.cache._local_disk import DEFAULT_SHARDS, LocalDiskCache
from petastorm.cache._row_groups import FileStamp, RowGroupCache, file_stamps
from petastorm.unischema import UnischemaField

#: A reader's ``cache_type``.
CacheType = Literal['null', 'local-disk', 'local-disk-decoded']
#: ``cache_type`` of no cache (the default).
NULL_CACHE: Final = 'null'
#: ``cache_type`` of the local disk cache of raw row groups, as in Petastorm.
LOCAL_DISK_CACHE: Final = 'local-disk'
#: ``cache_type`` of the local disk cache of decoded row groups (images and arrays decoded once).
LOCAL_DISK_DECODED_CACHE: Final = 'local-disk-decoded'


@dataclass(frozen=True)
class _CacheKind:
    """What one ``cache_type`` builds."""

    #: a :class:`LocalDiskCache` (which needs a location and a size limit), else a :class:`NullCache`.
    on_disk: bool
    #: row groups kept with their images and arrays decoded (:class:`DecodedRowGroupCache`), else as stored.
    decoded: bool


#: The one map from a ``cache_type`` to what it builds: the checks and the factories below ask it.
#: The size limit of a local-disk cache made without cache_size_limit: in effect none.
NO_SIZE_LIMIT: Final = 1 << 62

_KINDS: dict[CacheType, _CacheKind] = {
    NULL_CACHE: _CacheKind(on_disk=False, decoded=False),
    LOCAL_DISK_CACHE: _CacheKind(on_disk=True, decoded=False),
    LOCAL_DISK_DECODED_CACHE: _CacheKind(on_disk=True, decoded=True),
}
#: Every ``cache_type`` a reader accepts.
CACHE_TYPES: tuple[CacheType, ...] = tuple(_KINDS)


def _known_kind(cache_type: Any) -> tuple[CacheType, _CacheKind] | None:
    """The cache type ``cache_type`` names (None names ``'null'``) and what it builds; None when it names none."""
    wanted = NULL_CACHE if cache_type is None else cache_type
    # Compared, not looked up: a value that cannot be hashed is an unknown cache type, not a TypeError.
    return next(((name, kind) for name, kind in _KINDS.items() if name == wanted), None)


def _kind_of(cache_type: Any) -> tuple[CacheType, _CacheKind]:
    known = _known_kind(cache_type)
    if known is None:
        raise ValueError(f'Unknown cache_type: {cache_type!r}; expected one of {", ".join(map(repr, CACHE_TYPES))}')
    return known


def check_cache_arguments(cache_type: Any, location: Any, size_limit: Any, row_size_estimate: Any,
                          extra_settings: Any) -> CacheType:
    """Check a reader's ``cache_*`` arguments early, before anything is read; returns the cache type.

    Args:
        cache_type: one of :data:`CACHE_TYPES`, or None for ``'null'``.
        location: ``cache_location``, a local directory path (the local-disk types).
        size_limit: ``cache_size_limit`` in bytes (the local-disk types).
        row_size_estimate: ``cache_row_size_estimate`` in bytes, or None.
        extra_settings: ``cache_extra_settings``, a dict or None.

    Raises:
        ValueError: naming the argument, its value and what is expected.
    """
    checked, kind = _kind_of(cache_type)
    if not kind.on_disk:
        return checked
    if not isinstance(location, (str, os.PathLike)) or not os.fspath(location):
        raise ValueError(f'cache_type={cache_type!r} needs cache_location, a local directory path; got {location!r}')
    scheme = urlparse(os.fspath(location)).scheme if isinstance(location, str) else ''
    if scheme and scheme != 'file' and not (len(scheme) == 1 and os.name == 'nt'):
        raise ValueError(f'cache_location={location!r} is a {scheme}:// URL; the local-disk cache needs a directory '
                         f'on a local disk of this machine (for example /tmp/petastorm-cache)')
    if extra_settings is not None and not isinstance(extra_settings, dict):
        raise ValueError(f'cache_extra_settings must be a dict or None, got {type(extra_settings).__name__}')
    if size_limit is None:
        return checked  # no limit: entries are never evicted
    limit = check_positive_int('cache_size_limit', size_limit)
    if row_size_estimate is not None:
        estimate = check_positive_int('cache_row_size_estimate', row_size_estimate)
        settings = extra_settings or {}
        shards = settings.get('shards', DEFAULT_SHARDS)
        if settings.get('eviction_policy') != 'none' and is_integer(shards) and limit / shards < 5 * estimate:
            raise ValueError(f'cache_size_limit / shards must be at least 5 * cache_row_size_estimate, so that every '
                             f'shard of the cache holds a few entries; got cache_size_limit={limit}, shards={shards} '
                             f'(cache_extra_settings), cache_row_size_estimate={estimate}. Raise cache_size_limit, '
                             f'or leave it out (no limit)')
    return checked


def make_cache(cache_type: str | None, location: Any, size_limit: int | None, row_size_estimate: int | None,
               extra_settings: Mapping[str, Any] | None = None) -> CacheBase:
    """The cache a reader's ``cache_*`` arguments ask for.

    Args:
        cache_type: ``'null'`` (or None) for no cache; ``'local-disk'`` or ``'local-disk-decoded'`` for a
            :class:`~petastorm.cache.LocalDiskCache` (the reader decides what it stores in it).
        location: the cache directory (local-disk).
        size_limit: the cache's size limit in bytes (local-disk).
        row_size_estimate: expected size of one entry in bytes, used to check ``size_limit`` (local-disk).
        extra_settings: more keyword arguments of ``LocalDiskCache`` (for example ``{'cleanup': False}``).

    Raises:
        ValueError: unknown ``cache_type`` or bad settings.
        CacheLocationError: ``location`` cannot be used as a cache directory.

    Example::

        cache = make_cache('local-disk', '/tmp/petastorm-cache', 10 << 30, 1 << 20)
        table = cache.get('some key', lambda: expensive_read())
    """
    _, kind = _kind_of(cache_type)
    if not kind.on_disk:
        return NullCache()
    settings = dict(extra_settings or {})
    if kind.decoded:
        # Decoded columns are handed out as views of the entries: writable ones, as decoding would give.
        settings = {'writable_tables': True, **settings}
    if size_limit is None:  # no limit: never evict, and nothing to check the estimate against
        size_limit, row_size_estimate = NO_SIZE_LIMIT, None
    return LocalDiskCache(location, size_limit, row_size_estimate, **settings)


def make_row_group_cache(cache_type: str, cache: CacheBase, dataset: str, filesystem: pafs.FileSystem,
                         files: Sequence[str], fields: Iterable[UnischemaField],
                         stored_columns: Iterable[str] = (),
                         known_stamps: Mapping[str, FileStamp] | None = None) -> RowGroupCache | None:
    """What a reader's workers read row groups through: None without a cache.

    Args:
        cache_type: the reader's ``cache_type``: ``'local-disk-decoded'`` gives a :class:`DecodedRowGroupCache`,
            any other type a :class:`RowGroupCache` of raw columns.
        cache: the cache made by :func:`make_cache`.
        dataset: the dataset URL (or URLs), part of every key.
        filesystem: the dataset's filesystem, asked once for the size and modification time of every file whose
            stamp is not known.
        files: the dataset's data files.
        fields: the stored schema's fields (those whose codec the decoded cache decodes are stored decoded).
        stored_columns: columns to keep as stored in the file even in the decoded cache: those that a filter
            expression reads.
        known_stamps: the files' sizes and times as the store's listing gave them (the others are asked for).
    """
    if isinstance(cache, NullCache):
        return None
    # Size and modification time of every file go into the keys: a rewritten file is never served stale.
    stamps = file_stamps(filesystem, files, known_stamps)
    known = _known_kind(cache_type)
    if known is None or not known[1].decoded:
        return RowGroupCache(cache, dataset, stamps)
    keep = set(stored_columns)
    decoded = {field.name: field for field in fields if decodes_in_cache(field) and field.name not in keep}
    return DecodedRowGroupCache(cache, dataset, stamps, decoded)
