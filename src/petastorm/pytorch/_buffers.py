"""Columnar row buffers: cut batches from column chunks, and shuffle rows by permuting index arrays.

A *table* here is a dict ``{column name: array}`` whose arrays all have the same first dimension (the rows).
The buffers never look at single rows: a batch is a slice (a view) of one chunk or a concatenation of slices of
a few chunks, and the shuffling buffer moves rows with vectorized gathers driven by random index arrays.

The same code buffers numpy arrays (:class:`NumpyOps`, used by ``DataLoader``) and torch tensors (``TensorOps``
in :mod:`petastorm.pytorch._tensors`, used by ``BatchedDataLoader``); an *ops* object supplies the few array
operations that differ between the two. Numeric numpy columns of a fixed layout can instead live in
:class:`PackedColumns`, which keeps the scalar values of a row together so that random gathers touch one place
in memory per row (``InMemBatchedDataLoader``; optional for the shuffling buffer).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

Table = dict[str, Any]


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


def num_rows(table: Table) -> int:
    """Rows of a table (0 for a table without columns)."""
    for array in table.values():
        return len(array)
    return 0


def slice_rows(table: Table, start: int, stop: int) -> Table:
    """Rows ``[start, stop)`` of every column (views where the array type allows)."""
    return {name: array[start:stop] for name, array in table.items()}


class Batcher:
    """First in, first out: cuts tables into batches of ``batch_size`` rows, whatever the chunk sizes."""

    def __init__(self, batch_size: int, ops: ArrayOps) -> None:
        self._batch_size = batch_size
        self._ops = ops
        self._chunks: deque[Table] = deque()
        self._offset = 0  # rows of the first chunk already handed out
        self._rows = 0  # rows waiting

    def add(self, table: Table) -> Iterator[Table]:
        """Queue the rows of ``table``; yield every full batch that can now be made."""
        rows = num_rows(table)
        if rows:
            self._chunks.append(table)
            self._rows += rows
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


_RECORD_KINDS = frozenset('biufc')


def _aligned_offsets(dtypes: list[np.dtype]) -> tuple[list[int], int]:
    """Offsets placing each dtype at a multiple of its alignment, and the record width (a multiple of the largest)."""
    offsets = []
    position = 0
    for dtype in dtypes:
        position = -(-position // dtype.alignment) * dtype.alignment
        offsets.append(position)
        position += dtype.itemsize
    largest = max((dtype.alignment for dtype in dtypes), default=1)
    return offsets, -(-position // largest) * largest


class PackedColumns:
    """numpy columns of a fixed layout, kept so that the scalar values of one row sit together in memory.

    Columns holding one number per row are packed side by side into one record per row (a structured dtype
    over raw bytes, widest values first so that most are aligned): gathering a row reads one place in memory
    instead of one per column, and random gathers are bound by memory latency. Columns holding an array per row
    keep their own array (each row is contiguous already). Gathers run ``np.take`` on the records as opaque
    fixed-size items, which is much faster than gathering each column or a structured array.
    """

    def __init__(self, like: Table, rows: int) -> None:
        self.names = list(like)
        self.rows = rows
        self._dtypes = {name: array.dtype for name, array in like.items()}
        self._row_shapes = {name: array.shape[1:] for name, array in like.items()}
        packed = sorted((name for name, array in like.items() if array.ndim == 1 and array.dtype.kind in
                         _RECORD_KINDS), key=lambda name: -like[name].dtype.itemsize)
        self._fields = {name: f'f{i}' for i, name in enumerate(packed)}
        offsets, width = _aligned_offsets([like[name].dtype for name in packed])
        # An aligned record: numpy then copies fields in and out with its fast aligned loops.
        self._record = np.dtype({'names': list(self._fields.values()), 'formats': [like[n].dtype for n in packed],
                                 'offsets': offsets, 'itemsize': width}, align=True) if packed else None
        # Opaque items of the record's width: what np.take moves fastest.
        self._records = np.empty(rows, dtype=np.dtype((np.void, width))) if packed else None
        self._others = {name: np.empty((rows, *array.shape[1:]), dtype=array.dtype)
                        for name, array in like.items() if name not in self._fields}

    @staticmethod
    def can_hold(table: Table) -> bool:
        """True when every column is a numpy array of a fixed-size, non-object dtype."""
        return all(isinstance(a, np.ndarray) and a.dtype != object for a in table.values())

    @property
    def row_nbytes(self) -> int:
        """Bytes one row takes."""
        return sum(int(np.prod(shape, dtype=np.int64)) * self._dtypes[name].itemsize
                   for name, shape in self._row_shapes.items())

    def matches(self, table: Table) -> bool:
        return list(table) == self.names and all(
            table[n].dtype == self._dtypes[n] and table[n].shape[1:] == self._row_shapes[n] for n in self.names)

    def fits(self, table: Table, rows: int) -> bool:
        return rows <= self.rows and self.matches(table)

    def grown(self, table: Table, rows: int, used: int) -> PackedColumns:
        if not self.matches(table):
            before = [(n, str(self._dtypes[n]), self._row_shapes[n]) for n in self.names]
            after = [(n, str(a.dtype), a.shape[1:]) for n, a in table.items()]
            raise TypeError(f'columns changed between row groups: {after} after {before}; batched loaders need one '
                            f'fixed dtype and shape per column')
        new = PackedColumns(table, rows)
        if used:
            if self._records is not None:
                new._records[:used] = self._records[:used]  # type: ignore[index]
            for name, array in self._others.items():
                new._others[name][:used] = array[:used]
        return new

    def write(self, start: int, table: Table) -> None:
        stop = start + num_rows(table)
        fields = self._records[start:stop].view(self._record) if self._records is not None else None
        for name, values in table.items():
            field = self._fields.get(name)
            if field is None:
                self._others[name][start:stop] = values
            else:
                fields[field] = values  # type: ignore[index]

    def _columns(self, records: np.ndarray | None, others: Table) -> Table:
        fields = records.view(self._record) if records is not None else None
        out = {}
        for name in self.names:
            field = self._fields.get(name)
            # Each packed column comes out as a contiguous copy of its own (never a view of the storage).
            out[name] = others[name] if field is None else np.array(fields[field], order='C')  # type: ignore[index]
        return out

    def take(self, index: np.ndarray) -> Table:
        records = np.take(self._records, index) if self._records is not None else None
        return self._columns(records, {n: np.take(a, index, axis=0) for n, a in self._others.items()})

    def column(self, name: str, rows: int) -> np.ndarray:
        field = self._fields.get(name)
        if field is None:
            return self._others[name][:rows]
        return self._records[:rows].view(self._record)[field]  # type: ignore[index]

    def slice(self, start: int, stop: int) -> Table:
        records = self._records[start:stop] if self._records is not None else None
        return self._columns(records, {n: a[start:stop].copy() for n, a in self._others.items()})

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        if self._records is not None:
            np.put(self._records, target, np.take(self._records, source))
        for array in self._others.values():
            array[target] = np.take(array, source, axis=0)


class ShufflingBuffer:
    """Holds rows and hands out uniformly random ones, keeping at least ``capacity - 1`` rows while data comes.

    This is the columnar form of a classic random shuffling queue: rows are added a chunk at a time; after each
    chunk every row beyond ``capacity - 1`` is drawn, uniformly at random without replacement, from all rows
    held; at the end :meth:`drain` hands out the rest in random order. Rows are kept in preallocated storage;
    drawing gathers the chosen rows and fills their holes with rows from the end of the storage, so every step
    costs in proportion to the rows drawn, not to the rows held.

    Args:
        capacity: rows to keep (at least ``capacity - 1``) while data comes.
        rng: the source of randomness.
        ops: array operations for the default per-column storage.
        packed: keep fixed-layout numpy columns in :class:`PackedColumns` (faster gathers).
    """

    def __init__(self, capacity: int, rng: np.random.Generator, ops: ArrayOps, packed: bool = False) -> None:
        self._capacity = capacity
        self._rng = rng
        self._ops = ops
        self._packed = packed
        self._store: Store | None = None
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, table: Table) -> Table | None:
        """Add the rows of ``table``; return the rows drawn because the buffer went over capacity (or None)."""
        rows = num_rows(table)
        if not rows:
            return None
        self._append(table, rows)
        surplus = self._size - (self._capacity - 1)
        return self._draw(surplus) if surplus > 0 else None

    def held(self, name: str) -> Any:
        """The column ``name`` of every row held (in storage order), or None when the buffer is empty."""
        return None if self._store is None or not self._size else self._store.column(name, self._size)

    def drain(self) -> Table | None:
        """Return every row still held, in random order (None when empty)."""
        return self._draw(self._size) if self._size else None

    def _append(self, table: Table, rows: int) -> None:
        needed = self._size + rows
        if self._store is None or not self._store.fits(table, needed):
            allocated = max(needed, 2 * (self._store_rows()), self._capacity + rows)
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

    def _draw(self, count: int) -> Table:
        assert self._store is not None
        size = self._size
        # An ordered random sample: the same as drawing one row at a time without putting it back.
        chosen = self._rng.permutation(size) if count >= size else self._rng.choice(size, count, replace=False)
        drawn = self._store.take(chosen)
        keep = size - count
        holes = chosen[chosen < keep]
        if len(holes):
            # Rows of the tail [keep, size) that were not drawn fill the holes the drawn rows left below keep.
            still_held = np.ones(count, dtype=bool)
            still_held[chosen[chosen >= keep] - keep] = False
            movers = keep + np.flatnonzero(still_held)
            self._store.move(movers, holes)
        self._size = keep
        return drawn


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
