"""Keeps Petastorm's ``petastorm.reader_impl.pytorch_shuffling_buffer``: batch buffers of torch tensors.

Items are added as columns (a list of tensors, or of anything ``torch.as_tensor`` takes, with the rows first)
and retrieved as batches: a list with the same columns, ``batch_size`` rows each (fewer at the very end). Imports
torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from petastorm._optional import import_optional

torch = import_optional('torch', 'petastorm.reader_impl.pytorch_shuffling_buffer')

__all__ = ['BatchedNoopShufflingBuffer', 'BatchedRandomShufflingBuffer', 'BatchedShufflingBufferBase']


class BatchedShufflingBufferBase(ABC):
    """Columns of rows in, batches of rows out (not thread-safe).

    Args:
        batch_size: rows per retrieved batch.
    """

    def __init__(self, batch_size: int = 1) -> None:
        self.batch_size = batch_size

    def add_many(self, items: list[Any]) -> None:
        """Add rows: ``items`` holds one column per field, all with the same number of rows."""
        columns = [torch.as_tensor(column) for column in items]
        if len({len(column) for column in columns}) > 1:
            raise ValueError(f'add_many needs columns of one length, got {[len(c) for c in columns]} rows')
        self._add_many(columns)

    @abstractmethod
    def _add_many(self, items: list[Any]) -> None:
        """Add the rows of the columns (tensors)."""

    @abstractmethod
    def retrieve(self) -> list[Any]:
        """Remove a batch of rows and return its columns."""

    @abstractmethod
    def can_add(self) -> bool:
        """Whether :meth:`add_many` may be called now."""

    @abstractmethod
    def can_retrieve(self) -> bool:
        """Whether :meth:`retrieve` may be called now."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Rows held."""

    @abstractmethod
    def finish(self) -> None:
        """No more rows will be added: the rest may be retrieved (the last batch may be smaller)."""


class BatchedNoopShufflingBuffer(BatchedShufflingBufferBase):
    """Rows come out in the order they were added, ``batch_size`` at a time."""

    def __init__(self, batch_size: int = 1) -> None:
        super().__init__(batch_size)
        self._chunks: list[list[Any]] = []
        self._offset = 0  # rows of the first chunk already retrieved
        self._size = 0
        self._done_adding = False

    def _add_many(self, items: list[Any]) -> None:
        rows = len(items[0]) if items else 0
        if rows:
            self._chunks.append(items)
            self._size += rows

    def retrieve(self) -> list[Any]:
        """The next ``batch_size`` rows (all that are left, when fewer)."""
        wanted = min(self.batch_size, self._size)
        parts: list[list[Any]] = []
        while wanted:
            chunk = self._chunks[0]
            taken = min(len(chunk[0]) - self._offset, wanted)
            parts.append([column[self._offset:self._offset + taken] for column in chunk])
            wanted -= taken
            self._size -= taken
            self._offset += taken
            if self._offset == len(chunk[0]):
                self._chunks.pop(0)
                self._offset = 0
        if len(parts) == 1:
            return parts[0]
        return [torch.cat(columns) for columns in zip(*parts, strict=True)]

    def can_retrieve(self) -> bool:
        """A whole batch is held, or any row after :meth:`finish`."""
        return self._size >= self.batch_size if not self._done_adding else self._size > 0

    def can_add(self) -> bool:
        """Always True."""
        return True

    @property
    def size(self) -> int:
        """Rows held."""
        return self._size

    def finish(self) -> None:
        """No more rows: the last, smaller batch may be retrieved."""
        self._done_adding = True


class BatchedRandomShufflingBuffer(BatchedShufflingBufferBase):
    """Batches of rows drawn uniformly at random, without replacement, from those held.

    Args:
        shuffling_buffer_capacity: rows may be added while fewer than this many are held.
        min_after_retrieve: a batch is drawn only while at least ``min_after_retrieve + batch_size - 1`` rows are
            held (until :meth:`finish`).
        extra_capacity: one :meth:`add_many` may take the buffer this far beyond its capacity.
        batch_size: rows per batch.
        seed: seeds the draws (keyword only; unseeded by default, as in Petastorm).
    """

    def __init__(self, shuffling_buffer_capacity: int, min_after_retrieve: int, extra_capacity: int = 1000,
                 batch_size: int = 1, *, seed: int | None = None) -> None:
        super().__init__(batch_size)
        self._capacity = shuffling_buffer_capacity
        self._min_after_retrieve = min_after_retrieve
        self._extra_capacity = extra_capacity
        self._columns: list[Any] | None = None  # preallocated storage, one tensor per column
        self._size = 0
        self._done_adding = False
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    def _add_many(self, items: list[Any]) -> None:
        if self._done_adding:
            raise RuntimeError('Can not call add_many after done_adding() was called.')
        if not self.can_add():
            raise RuntimeError('Can not enqueue. Check the return value of "can_enqueue()" to check if more items '
                               'can be added.')
        rows = len(items[0]) if items else 0
        limit = self._capacity + self._extra_capacity
        if self._size + rows > limit:
            raise RuntimeError(f'Attempt to enqueue more elements than the capacity allows. Current size: '
                               f'{self._size}, new size {self._size + rows}, maximum allowed: {limit}')
        if self._columns is None:
            self._columns = [torch.empty((limit, *column.shape[1:]), dtype=column.dtype, device=column.device)
                             for column in items]
        for storage, column in zip(self._columns, items, strict=True):
            storage[self._size:self._size + rows] = column
        self._size += rows

    def retrieve(self) -> list[Any]:
        """``batch_size`` random rows (all that are left, when fewer), removed from the buffer.

        Raises:
            RuntimeError: :meth:`can_retrieve` is False.
        """
        if not self.can_retrieve():
            raise RuntimeError('Can not dequeue. Check the return value of "can_dequeue()" to check if any items '
                               'are available.')
        assert self._columns is not None
        count = min(self.batch_size, self._size)
        drawn = torch.randperm(self._size, generator=self._generator)[:count]
        batch = [storage[drawn.to(storage.device)] for storage in self._columns]
        # The rows left at the end of the storage fill the holes the drawn rows leave before it.
        end = self._size - count
        taken = torch.zeros(self._size, dtype=torch.bool)
        taken[drawn] = True
        holes = drawn[drawn < end]
        fillers = torch.arange(end, self._size)[~taken[end:]]
        for storage in self._columns:
            storage[holes.to(storage.device)] = storage[fillers.to(storage.device)]
        self._size = end
        return batch

    def can_add(self) -> bool:
        """True while fewer than the capacity are held and :meth:`finish` was not called."""
        return self._size < self._capacity and not self._done_adding

    def can_retrieve(self) -> bool:
        """Enough rows for a well-shuffled batch, or any after :meth:`finish`."""
        return self._size >= self._min_after_retrieve + self.batch_size - 1 or (
            self._done_adding and self._size > 0)

    @property
    def size(self) -> int:
        """Rows held."""
        return self._size

    def finish(self) -> None:
        """No more rows: the rest may be retrieved."""
        self._done_adding = True
