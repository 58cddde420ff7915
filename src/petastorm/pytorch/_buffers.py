"""Columnar row buffers: cut batches from column chunks, and shuffle rows with whole-column moves.

The buffers work on tables (:mod:`petastorm.pytorch._tables`) and never build a Python object per row: a batch is
a slice (a view) of one chunk or a concatenation of slices of a few chunks, and the shuffling buffer moves rows
with vectorized gathers driven by random index arrays, or with the compiled draw of packed records.

The same code buffers numpy arrays (:class:`NumpyOps`, used by ``DataLoader``) and torch tensors (``TensorOps``
in :mod:`petastorm.pytorch._tensors`, used by ``BatchedDataLoader``); an *ops* object supplies the few array
operations that differ between the two. Numeric numpy columns of a fixed layout can instead live in
:class:`~petastorm.pytorch._records.PackedColumns` (``BatchedDataLoader``'s shuffling buffer on the CPU).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from petastorm.pytorch._records import PackedColumns
from petastorm.pytorch._tables import Table, num_rows, slice_rows


class ArrayOps(Protocol):
    """The array operations a buffer needs; ``index`` arguments are int64 numpy arrays of row positions."""

    def concat(self, name: str, parts: list[Any]) -> Any:
        """Rows of ``parts`` one after the other (a new array)."""
        ...

    def take(self, array: Any, index: np.ndarray) -> Any:
        """A new array of the rows at ``index``, in that order."""
        ...

    def move(self, array: Any, source: np.ndarray, target: np.ndarray) -> None:
        """In place: row ``target[i]`` becomes row ``source[i]`` (the two index sets are disjoint)."""
        ...

    def storage(self, name: str, like: Any, rows: int, old: Any | None, used: int) -> Any:
        """An array of ``rows`` rows able to hold rows like ``like``, starting with ``old[:used]`` copied in."""
        ...

    def write(self, name: str, storage: Any, start: int, values: Any) -> Any:
        """Write ``values`` at rows ``start...``; returns the storage (a new one if it had to change type)."""
        ...


class Batcher:
    """First in, first out: cuts tables into batches of ``batch_size`` rows, whatever the chunk sizes."""

    def __init__(self, batch_size: int, ops: ArrayOps) -> None:
        self._batch_size = batch_size
        self._ops = ops
        self._chunks: deque[Table] = deque()
        self._offset = 0  # rows of the first chunk already handed out
        self._rows = 0  # rows waiting

    def put(self, table: Table) -> None:
        """Queue the rows of ``table``."""
        rows = num_rows(table)
        if rows:
            self._chunks.append(table)
            self._rows += rows

    def batches(self) -> Iterator[Table]:
        """Yield every full batch the queued rows make."""
        while self._rows >= self._batch_size:
            yield self._take(self._batch_size)

    def held(self, name: str) -> list[Any]:
        """The column ``name`` of the rows waiting, in order (one array per queued chunk)."""
        return [chunk[name][self._offset if k == 0 else 0:] for k, chunk in enumerate(self._chunks)]

    def flush(self) -> Iterator[Table]:
        """Yield the rows still waiting as one last, smaller batch (nothing when none wait)."""
        if self._rows:
            yield self._take(self._rows)

    def _take(self, count: int) -> Table:
        first = self._chunks[0]
        if not self._offset and num_rows(first) == count:  # a chunk of exactly one batch goes out whole
            self._chunks.popleft()
            self._rows -= count
            return first
        parts: list[Table] = []
        needed = count
        while needed:
            chunk = self._chunks[0]
            available = num_rows(chunk) - self._offset
            taken = min(available, needed)
            parts.append(slice_rows(chunk, self._offset, self._offset + taken))
            needed -= taken
            if taken == available:
                self._chunks.popleft()
                self._offset = 0
            else:
                self._offset += taken
        self._rows -= count
        if len(parts) == 1:
            return parts[0]
        return {name: self._ops.concat(name, [part[name] for part in parts]) for name in parts[0]}


class Store(Protocol):
    """Preallocated room for the rows of a shuffling buffer."""

    def fits(self, table: Table, rows: int) -> bool:
        """True when rows like ``table``'s can be written at ``rows`` (room and layout)."""
        ...

    def grown(self, table: Table, rows: int, used: int) -> Store:
        """A store with room for ``rows`` rows like ``table``'s, holding this store's first ``used`` rows."""
        ...

    def write(self, start: int, table: Table) -> None:
        """Write the rows of ``table`` at ``start...``."""
        ...

    def take(self, index: np.ndarray) -> Table:
        """New columns of the rows at ``index``, in that order."""
        ...

    def column(self, name: str, rows: int) -> Any:
        """The column ``name`` of the first ``rows`` rows (a view where possible)."""
        ...

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        """Row ``target[i]`` becomes row ``source[i]`` (disjoint index sets)."""
        ...


class ColumnStore:
    """One array per column, through an :class:`ArrayOps` (which decides what a change of layout does)."""

    def __init__(self, ops: ArrayOps, columns: Table | None = None, allocated: int = 0) -> None:
        self._ops = ops
        self._columns: Table = columns or {}
        self._allocated = allocated

    def fits(self, table: Table, rows: int) -> bool:
        return rows <= self._allocated and set(table) == set(self._columns)

    def grown(self, table: Table, rows: int, used: int) -> ColumnStore:
        columns = {name: self._ops.storage(name, values, rows, self._columns.get(name), used)
                   for name, values in table.items()}
        grown = copy.copy(self)  # a subclass stays itself
        grown._columns, grown._allocated = columns, rows
        return grown

    @property
    def row_nbytes(self) -> int:
        """Bytes one row takes (numpy arrays or tensors)."""
        return sum(int(column[:1].nbytes) if isinstance(column, np.ndarray) else
                   int(column[:1].numel() * column.element_size()) for column in self._columns.values())

    def write(self, start: int, table: Table) -> None:
        for name, values in table.items():
            self._columns[name] = self._ops.write(name, self._columns[name], start, values)

    def take(self, index: np.ndarray) -> Table:
        return {name: self._ops.take(array, index) for name, array in self._columns.items()}

    def column(self, name: str, rows: int) -> Any:
        return self._columns[name][:rows]

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        for array in self._columns.values():
            self._ops.move(array, source, target)




class ShufflingBuffer:
    """Holds rows and hands out uniformly random ones, keeping at least ``capacity - 1`` rows while data comes.

    This is the columnar form of a classic random shuffling queue: rows are added a chunk at a time; after each
    chunk, whole batches of rows beyond ``capacity - 1`` are drawn, uniformly at random without replacement, from
    all rows held (so the buffer keeps from ``capacity - 1`` to ``capacity + batch_size - 2`` rows); at the end
    :meth:`drain` hands out the rest in random order. Rows are kept in preallocated storage; drawing gathers the
    chosen rows and fills their holes with rows from the end of the storage, so every step costs in proportion
    to the rows drawn, not to the rows held. Packed records with the compiled loops are drawn one row at a time
    in compiled code (each hole filled at once by the last row held); otherwise a random sample of positions is
    gathered and the holes are filled afterwards, the same draw in distribution.

    Drawn rows come out as tables of whole batches (about ``_PIECE_ROWS`` rows): each is gathered straight into
    memory of its own, small enough to be reused by the allocator, instead of one large array per draw whose
    pages the operating system would have to supply again on every draw.

    Args:
        capacity: rows to keep (at least ``capacity - 1``) while data comes.
        rng: the source of randomness.
        ops: array operations for the default per-column storage.
        batch_size: draws are whole batches of this many rows (but the last of :meth:`drain`).
        packed: keep fixed-layout numpy columns in :class:`PackedColumns`.
    """

    def __init__(self, capacity: int, rng: np.random.Generator, ops: ArrayOps, batch_size: int = 1,
                 packed: bool = False) -> None:
        self._capacity = capacity
        self._rng = rng
        self._ops = ops
        self._batch_size = batch_size
        self._packed = packed
        self._store: Store | None = None
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, table: Table) -> list[Table]:
        """Add the rows of ``table``; return the rows drawn because the buffer went over capacity (as tables)."""
        rows = num_rows(table)
        if not rows:
            return []
        self._append(table, rows)
        surplus = self._size - (self._capacity - 1)
        count = surplus - surplus % self._batch_size if surplus > 0 else 0
        return self._draw(count) if count else []

    def held(self, name: str) -> Any:
        """The column ``name`` of every row held (in storage order), or None when the buffer is empty."""
        return None if self._store is None or not self._size else self._store.column(name, self._size)

    def drain(self) -> list[Table]:
        """Return every row still held, in random order (as tables)."""
        return self._draw(self._size) if self._size else []

    def _append(self, table: Table, rows: int) -> None:
        needed = self._size + rows
        if self._store is None or not self._store.fits(table, needed):
            allocated = max(needed, 2 * (self._store_rows()), self._capacity + self._batch_size + rows)
            if self._store is None:
                self._store = PackedColumns(table, 0) if self._packed and PackedColumns.can_hold(table) else \
                    ColumnStore(self._ops)
            self._store = self._store.grown(table, allocated, self._size)
        self._store.write(self._size, table)
        self._size = needed

    def _store_rows(self) -> int:
        if isinstance(self._store, PackedColumns):
            return self._store.rows
        if isinstance(self._store, ColumnStore):
            return self._store._allocated
        return 0

    def _draw(self, count: int) -> list[Table]:
        assert self._store is not None
        size = self._size
        piece = self._batch_size * max(1, _PIECE_ROWS // self._batch_size)
        if isinstance(self._store, PackedColumns) and self._store.can_draw:
            # Compiled: one random row at a time, its place taken by the last row held (no index arrays).
            drawn = [self._store.draw(size - start, min(piece, count - start), int(self._rng.integers(2 ** 63)))
                     for start in range(0, count, piece)]
            self._size = size - count
            return drawn
        # An ordered random sample: the same as drawing one row at a time without putting it back.
        chosen = self._rng.permutation(size) if count >= size else self._rng.choice(size, count, replace=False)
        drawn = [self._store.take(chosen[start:start + piece]) for start in range(0, count, piece)]
        keep = size - count
        if keep:
            # Rows of the tail [keep, size) that were not drawn fill the holes the drawn rows left below keep
            # (both in storage order: the moves then walk memory forwards).
            drawn_mask = np.zeros(size, dtype=bool)
            drawn_mask[chosen] = True
            holes = np.flatnonzero(drawn_mask[:keep])
            movers = np.flatnonzero(~drawn_mask[keep:])
            movers += keep
            for start in range(0, len(holes), _MOVE_ROWS):  # in blocks: small temporary arrays
                self._store.move(movers[start:start + _MOVE_ROWS], holes[start:start + _MOVE_ROWS])
        self._size = keep
        return drawn


# Rows of each drawn table (whole batches, at least one): a few numpy calls cover many batches, and the arrays
# stay small enough for the allocator to reuse their memory instead of asking the operating system for it.
_PIECE_ROWS = 4096
# Rows moved at a time when filling holes: keeps the temporary copies below the allocator's large-block size.
_MOVE_ROWS = 8192


class NumpyOps:
    """Buffer operations on numpy columns; columns whose chunks disagree in type or row shape become lists.

    Chunks of one column normally share a dtype and a row shape. When they do not (strings of different widths,
    arrays whose shape varies between row groups, a transform returning different types), the column is turned
    into an object array holding each row's value, which the collation step handles value by value.
    """

    def concat(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        first = parts[0]
        if all(_same_layout(first, part) for part in parts):
            return np.concatenate(parts)
        if all(part.dtype.kind in 'US' for part in parts) and all(part.ndim == first.ndim for part in parts):
            return np.concatenate(parts)  # numpy widens the string type
        return np.concatenate([as_row_objects(part) for part in parts])

    def take(self, array: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.take(array, index, axis=0)

    def move(self, array: np.ndarray, source: np.ndarray, target: np.ndarray) -> None:
        array[target] = np.take(array, source, axis=0)

    def storage(self, name: str, like: np.ndarray, rows: int, old: np.ndarray | None, used: int) -> np.ndarray:
        if old is not None and not _same_layout(old, like):
            old = as_row_objects(old[:used])
            like = as_row_objects(like[:0])
        new = np.empty((rows, *like.shape[1:]), dtype=like.dtype)
        if old is not None and used:
            new[:used] = old[:used]
        return new

    def write(self, name: str, storage: np.ndarray, start: int, values: np.ndarray) -> np.ndarray:
        if not _same_layout(storage, values):
            if storage.dtype.kind in 'US' and values.dtype.kind in 'US' and storage.ndim == values.ndim:
                storage = storage.astype(np.result_type(storage.dtype, values.dtype))
            else:
                if storage.dtype != object or storage.ndim != 1:
                    storage = as_row_objects(storage)
                values = as_row_objects(values)
        storage[start:start + len(values)] = values
        return storage


def _same_layout(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape[1:] == b.shape[1:]


def as_row_objects(array: np.ndarray) -> np.ndarray:
    """A 1-d object array holding each row of ``array`` as the value a row reader would give (scalar or array)."""
    if array.dtype == object and array.ndim == 1:
        return array
    out = np.empty(len(array), dtype=object)
    if array.ndim == 1:
        out[:] = list(array)  # numpy scalars stay numpy scalars
    else:
        for i in range(len(array)):
            out[i] = array[i]
    return out
