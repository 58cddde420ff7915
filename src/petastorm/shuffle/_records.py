"""Packed records: the numeric columns of a table kept as one fixed-width record per row.

A random row is then one place in memory instead of one per column, which is what random gathers (the shuffling
buffer, ``InMemBatchedDataLoader`` epochs over scalar tables) are bound by. Where the compiled kernel is in use
(:mod:`petastorm.shuffle._compiled`), it writes the records and carries out the buffer's draws; otherwise numpy
does the same work, with the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from petastorm.shuffle._compiled import built_kernel, kernel_in_use
from petastorm.shuffle._draw import Draw, draw_by_gathers
from petastorm.shuffle._tables import Table, num_rows

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

    Where the compiled kernel is in use, writing rows and carrying out draws (:meth:`draw`) run there: a block of
    records at a time, one field after the other. Otherwise numpy does the work: records are moved as opaque
    fixed-size items (what ``np.take`` moves fastest); values of one width sit next to each other in every record,
    so the records of a batch are split into columns one width at a time (the group's words copied out transposed,
    one contiguous row per column, instead of one strided copy per column); writes go a block of rows at a time so
    that the records being filled stay in the cache.

    Args:
        like: a table whose columns have the dtypes and row shapes to hold.
        rows: rows of room.
        compiled: None (default): use the compiled kernel when it is in use now (built, and not switched off by
            ``PETASTORM_NO_COMPILED_SHUFFLE=1``); False: numpy only; True: the kernel, which must be built.

    Raises:
        ImportError: ``compiled=True`` and the kernel was not built.
    """

    def __init__(self, like: Table, rows: int, *, compiled: bool | None = None) -> None:
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
        self._kernel = _kernel_for(compiled)
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
        return sum(self._value_nbytes(name) for name in self.names)

    def _value_nbytes(self, name: str) -> int:
        """Bytes one row's value of column ``name`` takes."""
        return int(np.prod(self._row_shapes[name], dtype=np.int64)) * self._dtypes[name].itemsize

    @property
    def compiled(self) -> bool:
        """True when the compiled kernel writes the records and carries out the draws."""
        return self._kernel is not None

    def matches(self, table: Table) -> bool:
        """True when ``table`` has this store's columns, in order, with their dtypes and row shapes."""
        return list(table) == self.names and all(
            table[n].dtype == self._dtypes[n] and table[n].shape[1:] == self._row_shapes[n] for n in self.names)

    def fits(self, table: Table, rows: int) -> bool:
        """True when rows like ``table``'s can be written up to row ``rows``."""
        return rows <= self.rows and self.matches(table)

    def grown(self, table: Table, rows: int, used: int) -> PackedColumns:
        """A store of ``rows`` rows holding this one's first ``used`` rows (the same kernel choice).

        Raises:
            TypeError: ``table``'s columns differ from this store's in names, dtypes or row shapes.
        """
        if not self.matches(table):
            before = [(n, str(self._dtypes[n]), self._row_shapes[n]) for n in self.names]
            after = [(n, str(a.dtype), a.shape[1:]) for n, a in table.items()]
            raise TypeError(f'columns changed between row groups: {after} after {before}; batched loaders need one '
                            f'fixed dtype and shape per column')
        new = PackedColumns(table, rows, compiled=self.compiled)
        if used:
            if self._records is not None and new._records is not None:
                new._records[:used] = self._records[:used]
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
        """Write the rows of ``table`` at rows ``start...``."""
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

    def draw(self, draw: Draw) -> list[Table]:
        """Carry out a draw: the drawn rows as tables (``draw.piece_rows`` each), the kept rows moved to the front.

        The compiled kernel, when in use, does the draw's swap-removes row by row; numpy otherwise replays them
        with the same result (:func:`~petastorm.shuffle._draw.draw_by_gathers`).
        """
        if self._kernel is None:
            return draw_by_gathers(self, draw)
        drawn = []
        for held, first, rows in draw.pieces():
            out, stores = self._kernel_stores(rows)
            self._kernel.draw(held, rows, draw.key, first, stores)
            drawn.append(out)
        return drawn

    def _kernel_stores(self, count: int) -> tuple[Table, list[tuple[Any, ...]]]:
        """New columns for ``count`` drawn rows, and the compiled loop's description of where they come from.

        One store for the records (a field per packed column) and one per array column (a single field covering
        the row).
        """
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
            row_bytes = self._value_nbytes(name)
            if row_bytes:
                stores.append((array, row_bytes, [(out[name], 0, row_bytes)]))
        return {name: out[name] for name in self.names}, stores

    def column(self, name: str, rows: int) -> np.ndarray:
        """The column ``name`` of the first ``rows`` rows (a view into the records)."""
        if name not in self._packed or self._records is None:
            return self._others[name][:rows]
        for size, first, names in self._groups:
            if name in names:
                records = self._records[:rows]
                if size not in _WORDS:
                    return self._field(records, size, first, name)
                return self._words(records, size)[:, first + names.index(name)].view(self._dtypes[name])
        raise KeyError(name)

    def slice(self, start: int, stop: int) -> Table:
        """Copies of rows ``[start, stop)``."""
        records = self._records[start:stop] if self._records is not None else None
        return self._columns(records, {n: a[start:stop].copy() for n, a in self._others.items()})

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        """Row ``target[i]`` becomes row ``source[i]`` (disjoint index sets)."""
        if self._records is not None:
            np.put(self._records, target, np.take(self._records, source))
        for array in self._others.values():
            array[target] = np.take(array, source, axis=0)


# numpy's unsigned word for each width: a group of same-width fields is moved as a 2-d array of these.
_WORDS: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                                    8: np.dtype(np.uint64)}
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


def _kernel_for(compiled: bool | None) -> ModuleType | None:
    """The kernel a new store uses: see the ``compiled`` argument of :class:`PackedColumns`."""
    if compiled is None:
        return kernel_in_use()
    if not compiled:
        return None
    kernel = built_kernel()
    if kernel is None:
        raise ImportError('PackedColumns(compiled=True) needs the compiled kernel petastorm.shuffle._kernel, which '
                          'was not built when the package was installed (no C compiler was available)')
    return kernel


def _take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    return np.take(array, index, axis=0)
