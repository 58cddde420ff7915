"""Keeps Petastorm's ``petastorm.reader_impl.shuffling_buffer``: buffers that hand out added items in another order.

A buffer is used from one thread: ``add_many`` while ``can_add()``, ``retrieve`` while ``can_retrieve()``, and
``finish()`` once nothing more comes, after which the rest can be retrieved.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ['NoopShufflingBuffer', 'RandomShufflingBuffer', 'ShufflingBufferBase']


class ShufflingBufferBase(ABC):
    """Items in, items out in the order the buffer chooses (not thread-safe)."""

    @abstractmethod
    def add_many(self, items: Iterable[Any]) -> None:
        """Add items."""

    @abstractmethod
    def retrieve(self) -> Any:
        """Remove one item and return it."""

    @abstractmethod
    def can_add(self) -> bool:
        """Whether :meth:`add_many` may be called now."""

    @abstractmethod
    def can_retrieve(self) -> bool:
        """Whether :meth:`retrieve` may be called now."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Items in the buffer."""

    @abstractmethod
    def finish(self) -> None:
        """No more items will be added: the rest may be retrieved, whatever the buffer's minimum."""


class NoopShufflingBuffer(ShufflingBufferBase):
    """First in, first out: items come out in the order they were added."""

    def __init__(self) -> None:
        self.store: deque[Any] = deque()

    def add_many(self, items: Iterable[Any]) -> None:
        """Append the items."""
        self.store.extend(items)

    def retrieve(self) -> Any:
        """The oldest item."""
        return self.store.popleft()

    def can_retrieve(self) -> bool:
        """True while an item is held."""
        return len(self.store) > 0

    def can_add(self) -> bool:
        """Always True."""
        return True

    @property
    def size(self) -> int:
        """Items held."""
        return len(self.store)

    def finish(self) -> None:
        """Nothing to do: every item can be retrieved at any time."""


class RandomShufflingBuffer(ShufflingBufferBase):
    """Hands out a uniformly random item of those held.

    Args:
        shuffling_buffer_capacity: items may be added while fewer than this many are held.
        min_after_retrieve: items are retrieved only while at least this many are held (until :meth:`finish`),
            so that each draw chooses among many.
        extra_capacity: one :meth:`add_many` may take the buffer this far beyond its capacity (a bound on the
            items of one call).
        seed: seeds the draws (keyword only; unseeded by default, as in Petastorm).
    """

    def __init__(self, shuffling_buffer_capacity: int, min_after_retrieve: int, extra_capacity: int = 1000, *,
                 seed: int | None = None) -> None:
        self._capacity = shuffling_buffer_capacity
        self._min_after_retrieve = min_after_retrieve
        self._extra_capacity = extra_capacity
        self._items: list[Any] = []
        self._done_adding = False
        self._rng = np.random.default_rng(seed)

    def add_many(self, items: Iterable[Any]) -> None:
        """Add the items.

        Raises:
            RuntimeError: after :meth:`finish`, while :meth:`can_add` is False, or beyond the capacity plus
                ``extra_capacity``.
        """
        if self._done_adding:
            raise RuntimeError('Can not call add_many after done_adding() was called.')
        if not self.can_add():
            raise RuntimeError('Can not enqueue. Check the return value of "can_enqueue()" to check if more items '
                               'can be added.')
        items = list(items)
        limit = self._capacity + self._extra_capacity
        if len(self._items) + len(items) > limit:
            raise RuntimeError(f'Attempt to enqueue more elements than the capacity allows. Current size: '
                               f'{len(self._items)}, new size {len(self._items) + len(items)}, maximum allowed: '
                               f'{limit}')
        self._items.extend(items)

    def retrieve(self) -> Any:
        """A random item, removed from the buffer.

        Raises:
            RuntimeError: :meth:`can_retrieve` is False.
        """
        if not self.can_retrieve():
            raise RuntimeError('Can not dequeue. Check the return value of "can_dequeue()" to check if any items '
                               'are available.')
        index = int(self._rng.integers(len(self._items)))
        self._items[index], self._items[-1] = self._items[-1], self._items[index]
        return self._items.pop()

    def can_add(self) -> bool:
        """True while fewer than the capacity are held and :meth:`finish` was not called."""
        return len(self._items) < self._capacity and not self._done_adding

    def can_retrieve(self) -> bool:
        """True with at least ``min_after_retrieve`` items held, or any after :meth:`finish`."""
        return len(self._items) >= self._min_after_retrieve or (self._done_adding and len(self._items) > 0)

    @property
    def size(self) -> int:
        """Items held."""
        return len(self._items)

    def finish(self) -> None:
        """No more items: the rest may be retrieved."""
        self._done_adding = True
