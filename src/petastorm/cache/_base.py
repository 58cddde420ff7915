"""What every cache is: a key-value map whose values are computed on a miss."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


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
