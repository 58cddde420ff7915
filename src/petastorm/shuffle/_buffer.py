"""``ShufflingBuffer``: hands out held rows uniformly at random, with whole-column moves; and its storages.

The buffer keeps its rows in a :class:`Store`: :class:`ColumnStore` (one array per column, through an
:class:`~petastorm.shuffle.ArrayOps`) or :class:`~petastorm.shuffle.PackedColumns` (numeric numpy columns as one
record per row). Each draw (:class:`~petastorm.shuffle._draw.Draw`) is carried out by the store.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import numpy as np

from petastorm.shuffle._compiled import kernel_in_use
from petastorm.shuffle._draw import Draw, draw_by_gathers, piece_rows_for
from petastorm.shuffle._nested import NestedColumns
from petastorm.shuffle._ops import ArrayOps
from petastorm.shuffle._records import PackedColumns
from petastorm.shuffle._tables import Table, num_rows


class Store(Protocol):
    """Preallocated room for the rows of a shuffling buffer."""

    @property
    def rows(self) -> int:
        """Rows of room."""
        ...

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

    def draw(self, draw: Draw) -> list[Table]:
        """Carry out a draw: the drawn rows as tables, and the holes they leave refilled."""
        ...


class ColumnStore:
    """One array per column, through an :class:`ArrayOps` (which decides what a change of layout does)."""

    def __init__(self, ops: ArrayOps, columns: Table | None = None, allocated: int = 0) -> None:
        self._ops = ops
        self._columns: Table = columns or {}
        self._allocated = allocated

    @property
    def rows(self) -> int:
        """Rows of room."""
        return self._allocated

    def fits(self, table: Table, rows: int) -> bool:
        """True when ``table`` has this store's columns and ``rows`` rows fit."""
        return rows <= self._allocated and set(table) == set(self._columns)

    def grown(self, table: Table, rows: int, used: int) -> ColumnStore:
        """A store of ``rows`` rows like ``table``'s holding this one's first ``used`` rows."""
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
        """Write the rows of ``table`` at rows ``start...``."""
        for name, values in table.items():
            self._columns[name] = self._ops.write(name, self._columns[name], start, values)

    def take(self, index: np.ndarray) -> Table:
        """New columns of the rows at ``index``."""
        return {name: self._ops.take(array, index) for name, array in self._columns.items()}

    def column(self, name: str, rows: int) -> Any:
        """The column ``name`` of the first ``rows`` rows (a view)."""
        return self._columns[name][:rows]

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        """Row ``target[i]`` becomes row ``source[i]`` in every column."""
        for array in self._columns.values():
            self._ops.move(array, source, target)

    def draw(self, draw: Draw) -> list[Table]:
        """Carry out a draw with the ops' gathers and moves."""
        return draw_by_gathers(self, draw)


class ShufflingBuffer:
    """Holds rows and hands out uniformly random ones, keeping at least ``capacity - 1`` rows while data comes.

    This is the columnar form of a classic random shuffling queue: rows are added a chunk at a time; after each
    chunk, whole batches of rows beyond ``capacity - 1`` are drawn, uniformly at random without replacement, from
    all rows held (so the buffer keeps from ``capacity - 1`` to ``capacity + batch_size - 2`` rows); at the end
    :meth:`drain` hands out the rest in random order. Rows are kept in preallocated storage; a draw gathers the
    chosen rows and fills their holes with kept rows from the end of the storage, so every step costs in proportion
    to the rows drawn, not to the rows held.

    Which rows a draw takes, and where the kept rows go, follows from random words of ``rng``
    (:mod:`petastorm.shuffle._draw`): the compiled kernel, where it is in use, carries the draw out, and numpy
    replays the same draw otherwise. The rows handed out, and their order, are therefore the same with and without
    the kernel for the same ``rng`` state. Whether packed records use the kernel is decided when the buffer is made
    (``PETASTORM_NO_COMPILED_SHUFFLE``, see :func:`~petastorm.shuffle.compiled_shuffle_in_use`).

    Drawn rows come out as tables of whole batches (about 4096 rows): each is gathered straight into memory of its
    own, small enough to be reused by the allocator, instead of one large array per draw whose pages the operating
    system would have to supply again on every draw.

    Args:
        capacity: rows to keep (at least ``capacity - 1``) while data comes. Tables may hold the nested columns of
            :mod:`petastorm.columns`: their list elements wait in arenas (:mod:`petastorm.shuffle._nested`), the
            store moves fixed-width row columns only.
        rng: the source of randomness.
        ops: array operations for the default per-column storage.
        batch_size: draws are whole batches of this many rows (but the last of :meth:`drain`).
        packed: keep fixed-layout numpy columns in :class:`~petastorm.shuffle.PackedColumns`.

    Raises:
        ValueError: ``PETASTORM_NO_COMPILED_SHUFFLE`` holds something other than ``1``, ``0`` or nothing.
    """

    def __init__(self, capacity: int, rng: np.random.Generator, ops: ArrayOps, batch_size: int = 1,
                 packed: bool = False) -> None:
        self._capacity = capacity
        self._rng = rng
        self._ops = ops
        self._batch_size = batch_size
        self._packed = packed
        self._compiled = packed and kernel_in_use() is not None
        self._store: Store | None = None
        self._size = 0
        self._nested: NestedColumns | None = None  # list elements and row columns of nested columns

    def __len__(self) -> int:
        return self._size

    def add(self, table: Table) -> list[Table]:
        """Add the rows of ``table``; return the rows drawn because the buffer went over capacity (as tables)."""
        rows = num_rows(table)
        if not rows:
            return []
        if self._nested is not None or NestedColumns.needed(table):
            self._nested = self._nested or NestedColumns()
            table = self._nested.encode(table)
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
            room = self._store.rows if self._store is not None else 0
            allocated = max(needed, 2 * room, self._capacity + self._batch_size + rows)
            if self._store is None:
                self._store = PackedColumns(table, 0, compiled=self._compiled) \
                    if self._packed and PackedColumns.can_hold(table) else ColumnStore(self._ops)
            self._store = self._store.grown(table, allocated, self._size)
        self._store.write(self._size, table)
        self._size = needed

    def _draw(self, count: int) -> list[Table]:
        if self._store is None:
            raise RuntimeError('ShufflingBuffer: a draw before any row was added')
        draw = Draw.of(self._rng, self._size, count, piece_rows_for(self._batch_size))
        drawn = self._store.draw(draw)
        self._size = draw.keep
        if self._nested is None:
            return drawn
        decoded = [self._nested.decode(table) for table in drawn]  # before compacting: they refer to the arenas
        store = self._store
        self._nested.compact(lambda key: store.column(key, draw.keep), draw.keep)
        return decoded
