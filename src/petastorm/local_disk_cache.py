"""Petastorm's ``petastorm.local_disk_cache`` module path. Re-exports only; see :mod:`petastorm.cache`."""

from petastorm.cache import EVICTION_POLICIES, CacheLocationError, LocalDiskCache, UncacheableValueError

__all__ = ['EVICTION_POLICIES', 'CacheLocationError', 'LocalDiskCache', 'UncacheableValueError']
