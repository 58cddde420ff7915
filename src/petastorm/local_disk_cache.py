"""Compatibility path of the local disk cache: it lives in :mod:`petastorm.cache`, re-exported here."""

from petastorm.cache import EVICTION_POLICIES, CacheLocationError, LocalDiskCache, UncacheableValueError

__all__ = ['EVICTION_POLICIES', 'CacheLocationError', 'LocalDiskCache', 'UncacheableValueError']
