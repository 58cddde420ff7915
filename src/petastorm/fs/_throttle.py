"""How many requests a process sends to one bucket at once: fewer when the storage throttles, more again after.

An object store that is asked too much at once answers ``503 SlowDown`` (S3) or ``429 Too Many Requests``
(GCS, Azure) for a while. Retrying each request after a pause is not enough when 64 threads of each of 64 ranks
retry together: the storm goes on. :class:`AdaptiveLimit` is the other half of the answer: every request to a
bucket takes a slot, and the number of slots halves when a request is throttled (at most once per
:data:`SHRINK_INTERVAL`, so that one burst of refusals counts once) and grows by one after a limit's worth of
requests succeed (additive increase, multiplicative decrease, as TCP does for a congested link), up to its
ceiling. The retries themselves are :mod:`petastorm.fs._retry`'s: it takes a slot for each attempt and tells the
limit what the attempt met.

One limit is kept per storage and bucket (:func:`limit_for`), for the whole process, so the footers read for
planning and the row groups read by the workers' threads share it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ['DEFAULT_CEILING', 'SHRINK_INTERVAL', 'AdaptiveLimit', 'limit_for']

#: requests to one bucket at once before any throttling was seen (the footer threads of one planning).
DEFAULT_CEILING = 64
#: throttled answers closer together than this shrink the limit once (they answer the same burst).
SHRINK_INTERVAL = 0.2


class AdaptiveLimit:
    """Slots for the requests on their way to one bucket; see the module docstring.

    Taking a slot in a thread that holds one already does not wait (a request made while making another, such as
    a file's size asked while opening it, is part of it).

    Args:
        ceiling: the most requests at once, and the limit to start with.
        floor: the fewest the limit shrinks to.
    """

    def __init__(self, ceiling: int = DEFAULT_CEILING, floor: int = 1) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f'expected 1 <= floor <= ceiling, got {floor=} and {ceiling=}')
        self.ceiling = ceiling
        self.floor = floor
        self._limit = float(ceiling)
        self._active = 0
        self._succeeded = 0
        self._shrunk_at = float('-inf')
        self._changed = threading.Condition()
        self._held = threading.local()
        #: throttled answers seen, and the lowest the limit went: what a test or a benchmark reports.
        self.throttled_count = 0
        self.lowest = ceiling

    @property
    def limit(self) -> int:
        """The requests allowed at once now."""
        return int(self._limit)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot while the body runs (waits while every slot is taken)."""
        depth = getattr(self._held, 'depth', 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        with self._changed:
            self._changed.wait_for(lambda: self._active < int(self._limit))
            self._active += 1
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self._changed:
                self._active -= 1
                self._changed.notify()

    def throttled(self) -> None:
        """A request was throttled: halve the limit (once per burst, not below the floor)."""
        with self._changed:
            self.throttled_count += 1
            now = time.monotonic()
            if now - self._shrunk_at < SHRINK_INTERVAL:
                return
            self._shrunk_at = now
            self._limit = max(float(self.floor), self._limit / 2)
            self._succeeded = 0
            self.lowest = min(self.lowest, int(self._limit))

    def succeeded(self) -> None:
        """A request succeeded: after a limit's worth of them, allow one more at once (up to the ceiling)."""
        with self._changed:
            if self._limit >= self.ceiling:
                return
            self._succeeded += 1
            if self._succeeded >= self._limit:
                self._succeeded = 0
                self._limit = min(float(self.ceiling), self._limit + 1)
                self._changed.notify()


_LIMITS: dict[tuple[str, str], AdaptiveLimit] = {}
_LIMITS_LOCK = threading.Lock()


def limit_for(storage: str, path: str) -> AdaptiveLimit:
    """The process's limit of the bucket of ``path`` (its first component) on ``storage`` (a scheme or type)."""
    key = (storage, path.lstrip('/').split('/', 1)[0])
    with _LIMITS_LOCK:
        found = _LIMITS.get(key)
        if found is None:
            found = _LIMITS[key] = AdaptiveLimit()
        return found
