"""Columnar row buffers: cut batches from column chunks, and shuffle rows by permuting index arrays.

A *table* here is a dict ``{column name: array}`` whose arrays all have the same first dimension (the rows).
The buffers never look at single rows: a batch is a slice (a view) of one chunk or a concatenation of slices of
a few chunks, and the shuffling buffer moves rows with vectorized gathers driven by random index arrays.

The same code buffers numpy arrays (:class:`NumpyOps`, used by ``DataLoader``) and torch tensors (``TensorOps``
in :mod:`petastorm.pytorch._tensors`, used by ``BatchedDataLoader``); an *ops* object supplies the few array
operations that differ between the two. Numeric numpy columns of a fixed layout can instead live in
:class:`PackedColumns`, which keeps the scalar values of a row together so that random gathers touch one place
in memory per row (``InMemBatchedDataLoader`` for scalar tables, ``BatchedDataLoader``'s shuffling buffer on the
CPU).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterator
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

    Columns holding one number per row are packed side by side into one record per row, widest values first:
    gathering a row then reads one place in memory instead of one per column, and random gathers are bound by
    memory latency. Columns holding an array per row keep their own array (each row is contiguous already).

    Where the package was built with its compiled loops (``petastorm._shuffle``), writing rows and drawing random
    rows (:meth:`draw`) run there: a block of records at a time, one field after the other. Otherwise numpy does
    the work: records are moved as opaque fixed-size items (what ``np.take`` moves fastest); values of one width
    sit next to each other in every record, so the records of a batch are split into columns one width at a time
    (the group's words copied out transposed, one contiguous row per column, instead of one strided copy per
    column); writes go a block of rows at a time so that the records being filled stay in the cache.
    """

    def __init__(self, like: Table, rows: int) -> None:
        self.names = list(like)
        self.rows = rows
        self._dtypes = {name: array.dtype for name, array in like.items()}
        self._row_shapes = {name: array.shape[1:] for name, array in like.items()}
        packed = sorted((name for name, array in like.items() if array.ndim == 1 and array.dtype.kind in
                         _RECORD_KINDS), key=lambda name: -like[name].dtype.itemsize)
        offsets, width = _aligned_offsets([like[name].dtype for name in packed])
        self._width = width
        # Fields of one width, in record order: (word width, first word, names). Sorted widest first, fields of a
        # width are adjacent and start at a multiple of it; widths without a numpy unsigned type (complex) go alone.
        self._groups: list[tuple[int, int, list[str]]] = []
        for name, offset in zip(packed, offsets, strict=True):
            size = like[name].dtype.itemsize
            last = self._groups[-1] if self._groups else None
            if last is not None and last[0] == size and size in _WORDS and \
                    (last[1] + len(last[2])) * size == offset:
                last[2].append(name)
            else:
                self._groups.append((size, offset // size, [name]))
        self._packed = frozenset(packed)
        self._offsets = dict(zip(packed, offsets, strict=True))
        self._kernel = _load_kernel()
        # Opaque items of the record's width: what np.take moves fastest.
        self._records = _cache_aligned_records(rows, width) if packed else None
        self._others = {name: np.empty((rows, *array.shape[1:]), dtype=array.dtype)
                        for name, array in like.items() if name not in self._packed}

    @staticmethod
    def can_hold(table: Table) -> bool:
        """True when every column is a numpy array of a fixed-size, non-object dtype."""
        return all(isinstance(a, np.ndarray) and a.dtype != object for a in table.values())

    @property
    def row_nbytes(self) -> int:
        """Bytes one row takes."""
        return sum(int(np.prod(shape, dtype=np.int64)) * self._dtypes[name].itemsize
                   for name, shape in self._row_shapes.items())

    @property
    def can_draw(self) -> bool:
        """True when :meth:`draw` is available (the compiled loops were built)."""
        return self._kernel is not None

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

    def _words(self, records: np.ndarray, size: int) -> np.ndarray:
        """``records`` as a 2-d array of ``size``-byte words (rows x words of a record)."""
        return records.view(_WORDS[size]).reshape(len(records), self._width // size)

    def _field(self, records: np.ndarray, size: int, first: int, name: str) -> np.ndarray:
        """The (strided) view of one field of a width without a word type: its bytes, viewed as its dtype."""
        raw = records.view(np.uint8).reshape(len(records), self._width)[:, first * size:(first + 1) * size]
        return raw.view(self._dtypes[name])[:, 0]

    def write(self, start: int, table: Table) -> None:
        stop = start + num_rows(table)
        for name, values in table.items():
            if name not in self._packed:
                self._others[name][start:stop] = values
        if self._records is None:
            return
        if self._kernel is not None:
            fields = [(np.ascontiguousarray(table[name]), offset, self._dtypes[name].itemsize)
                      for name, offset in self._offsets.items()]
            self._kernel.pack(self._records, self._width, start, stop - start, fields)
            return
        for block in range(start, stop, _WRITE_ROWS):
            block_stop = min(block + _WRITE_ROWS, stop)
            records = self._records[block:block_stop]
            for size, first, names in self._groups:
                rows = slice(block - start, block_stop - start)
                if size not in _WORDS:
                    self._field(records, size, first, names[0])[:] = table[names[0]][rows]
                    continue
                words = self._words(records, size)
                for j, name in enumerate(names):
                    words[:, first + j] = table[name][rows].view(words.dtype)

    def _columns(self, records: np.ndarray | None, others: Table) -> Table:
        out = dict(others)
        if records is not None:
            for size, first, names in self._groups:
                if size not in _WORDS:
                    out[names[0]] = np.ascontiguousarray(self._field(records, size, first, names[0]))
                    continue
                # One transposed copy per width: row j of ``split`` is the j-th column of the group, contiguous.
                split = np.ascontiguousarray(self._words(records, size)[:, first:first + len(names)].T)
                for j, name in enumerate(names):
                    out[name] = split[j].view(self._dtypes[name])
        return {name: out[name] for name in self.names}

    def take(self, index: np.ndarray, take_rows: Callable[[np.ndarray, np.ndarray], Any] | None = None) -> Table:
        """Copies of the rows at ``index``; ``take_rows(array, index)`` gathers the array columns if given."""
        records = np.take(self._records, index) if self._records is not None else None
        take_rows = take_rows or _take_rows
        return self._columns(records, {n: take_rows(a, index) for n, a in self._others.items()})

    def draw(self, size: int, count: int, seed: int) -> Table:
        """Draw ``count`` rows of the first ``size``, one at a time, uniformly at random and without replacement.

        Returns new columns of the drawn rows in the order drawn. Each drawn row's place is taken by the last row
        held, so the rows kept are the first ``size - count`` afterwards. Needs :attr:`can_draw`; ``seed`` fixes
        the draw.
        """
        out, stores = self._kernel_stores(count)
        self._kernel.draw(size, count, seed, stores)
        return out

    def _kernel_stores(self, count: int) -> tuple[Table, list[tuple[Any, ...]]]:
        """New columns for ``count`` drawn rows, and the compiled loop's description of where they come from.

        One store for the records (a field per packed column) and one per array column (a single field covering
        the row).
        """
        assert self._kernel is not None
        out: Table = {}
        stores: list[tuple[Any, ...]] = []
        if self._records is not None:
            fields = []
            for name, offset in self._offsets.items():
                out[name] = np.empty(count, dtype=self._dtypes[name])
                fields.append((out[name], offset, out[name].itemsize))
            stores.append((self._records, self._width, fields))
        for name, array in self._others.items():
            out[name] = np.empty((count, *array.shape[1:]), dtype=array.dtype)
            row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
            if row_bytes:
                stores.append((array, row_bytes, [(out[name], 0, row_bytes)]))
        return {name: out[name] for name in self.names}, stores

    def column(self, name: str, rows: int) -> np.ndarray:
        if name not in self._packed:
            return self._others[name][:rows]
        for size, first, names in self._groups:
            if name in names:
                records = self._records[:rows]  # type: ignore[index]
                if size not in _WORDS:
                    return self._field(records, size, first, name)
                return self._words(records, size)[:, first + names.index(name)].view(self._dtypes[name])
        raise KeyError(name)

    def slice(self, start: int, stop: int) -> Table:
        records = self._records[start:stop] if self._records is not None else None
        return self._columns(records, {n: a[start:stop].copy() for n, a in self._others.items()})

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        if self._records is not None:
            np.put(self._records, target, np.take(self._records, source))
        for array in self._others.values():
            array[target] = np.take(array, source, axis=0)


# numpy's unsigned word for each width: a group of same-width fields is moved as a 2-d array of these.
_WORDS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
# Rows packed at a time: a block of records stays in the core's cache while each of its fields is written.
_WRITE_ROWS = 4096


_CACHE_LINE = 64


def _cache_aligned_records(rows: int, width: int) -> np.ndarray:
    """An empty array of ``rows`` opaque ``width``-byte items starting at a cache line (64 bytes).

    A random row then spans as few cache lines as its width allows: one, for records of 64 bytes or less that
    divide 64.
    """
    raw = np.empty(rows * width + _CACHE_LINE, dtype=np.uint8)
    start = -raw.ctypes.data % _CACHE_LINE
    return raw[start:start + rows * width].view(np.dtype((np.void, width)))


def _load_kernel() -> Any:
    """The compiled loops of :meth:`PackedColumns.write` and :meth:`PackedColumns.draw` (``petastorm._shuffle``).

    None when the package was installed without them (no C compiler): the numpy code then does the same work.
    """
    try:
        from petastorm import _shuffle
    except ImportError:
        return None
    return _shuffle


def _take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    return np.take(array, index, axis=0)


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
