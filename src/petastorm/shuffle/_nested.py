"""Nested columns in the buffers: fixed-width row columns in the store, list elements in growing arenas.

A store (:class:`~petastorm.shuffle.ColumnStore`, :class:`~petastorm.shuffle.PackedColumns`) holds columns with
one fixed-width value per row, which it moves and gathers row by row. A list column has no such value: its rows
hold any number of elements. :class:`NestedColumns` splits every column of :mod:`petastorm.columns` into

* row columns: for a list, each row's ``start`` and ``length`` in an arena (two int64 columns, so a packed store
  keeps them in the row's record), its validity; for a struct, its fields' row columns; for a masked column, its
  values and validity;
* one arena per list column: the elements of every row added, appended at the end of a buffer that grows by
  doubling (:class:`GrowingColumn`), so adding a chunk costs its own size.

Rows drawn from the store are put together again with whole-array gathers (:func:`~petastorm.columns.ragged_index`).
When the arenas hold more than twice the elements of the rows still held, the live elements are copied into a new
arena and the held rows' starts rewritten in the store (:meth:`NestedColumns.compact`), so memory stays bounded by
the rows held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from petastorm.columns import (
    SEPARATOR,
    Column,
    ListColumn,
    MapColumn,
    MaskedColumn,
    StructColumn,
    is_nested,
    num_rows,
    ragged_index,
    take_column,
)
from petastorm.shuffle._tables import Table

_MIN_ROOM = 1024


class GrowingColumn:
    """A column that rows are appended to, in buffers that grow by doubling (any kind of column)."""

    def __init__(self, like: Column) -> None:
        self._kind = _kind_of(like)
        self._rows = 0
        self._room = 0
        self._array: np.ndarray | None = None  # numpy arrays; the values of a masked column
        self._valid: np.ndarray | None = None  # masked, list and struct validity
        self._offsets: np.ndarray | None = None  # lists: rows + 1 (normalized)
        self._children: dict[str, GrowingColumn] = {}
        if isinstance(like, StructColumn):
            self._children = {name: GrowingColumn(child) for name, child in like.items()}
        elif isinstance(like, ListColumn):
            self._children = {'': GrowingColumn(like.values)}
        self._has_valid = getattr(like, 'valid', None) is not None
        self._grow(_MIN_ROOM, like)

    @property
    def rows(self) -> int:
        """Rows appended."""
        return self._rows

    def append(self, column: Column) -> None:
        """Append the rows of ``column`` (of this column's kind)."""
        count = num_rows(column)
        if self._rows + count > self._room:
            self._grow(max(_MIN_ROOM, 2 * self._room, self._rows + count), column)
        start, stop = self._rows, self._rows + count
        if isinstance(column, np.ndarray):
            assert self._array is not None
            self._array[start:stop] = column
        elif isinstance(column, MaskedColumn):
            assert self._array is not None
            assert self._valid is not None
            self._array[start:stop] = column.values
            self._valid[start:stop] = column.valid
        elif isinstance(column, ListColumn):
            normalized = column.normalized()
            assert self._offsets is not None
            base = int(self._offsets[start])
            self._offsets[start + 1:stop + 1] = normalized.offsets[1:] + base
            self._children[''].append(normalized.values)
            self._write_valid(start, stop, column.valid)
        else:
            assert isinstance(column, StructColumn)
            for name, child in self._children.items():
                child.append(column[name])
            self._write_valid(start, stop, column.valid)
        self._rows = stop

    def _write_valid(self, start: int, stop: int, valid: np.ndarray | None) -> None:
        if self._valid is not None:
            self._valid[start:stop] = True if valid is None else valid

    def _grow(self, room: int, like: Column) -> None:
        used = self._rows
        if isinstance(like, (np.ndarray, MaskedColumn)):
            values = like if isinstance(like, np.ndarray) else like.values
            new = np.empty((room, *values.shape[1:]), dtype=values.dtype)
            if self._array is not None:
                new[:used] = self._array[:used]
            self._array = new
        if isinstance(like, ListColumn):
            offsets = np.zeros(room + 1, dtype=np.int64)
            if self._offsets is not None:
                offsets[:used + 1] = self._offsets[:used + 1]
            self._offsets = offsets
        if isinstance(like, MaskedColumn) or self._has_valid:
            valid = np.ones(room, dtype=bool)
            if self._valid is not None:
                valid[:used] = self._valid[:used]
            self._valid = valid
        self._room = room

    def column(self) -> Column:
        """The rows appended so far, as a column viewing the buffers."""
        n = self._rows
        if self._kind == 'array':
            assert self._array is not None
            return self._array[:n]
        if self._kind == 'masked':
            assert self._array is not None
            assert self._valid is not None
            return MaskedColumn(self._array[:n], self._valid[:n])
        valid = None if self._valid is None else self._valid[:n]
        if self._kind in ('list', 'map'):
            cls = MapColumn if self._kind == 'map' else ListColumn
            offsets = self._offsets[:n + 1] if self._offsets is not None else np.zeros(1, dtype=np.int64)
            return cls(self._children[''].column(), offsets, valid)
        return StructColumn({name: child.column() for name, child in self._children.items()}, n, valid)


def _kind_of(column: Column) -> str:
    if isinstance(column, MapColumn):
        return 'map'
    if isinstance(column, ListColumn):
        return 'list'
    if isinstance(column, StructColumn):
        return 'struct'
    if isinstance(column, MaskedColumn):
        return 'masked'
    return 'array'


class _Arena:
    """The elements of one list column's rows: rows refer to them by start and length."""

    def __init__(self, like: Column) -> None:
        self.values = GrowingColumn(like)

    def add(self, elements: Column) -> int:
        """Append ``elements``; returns where they start."""
        start = self.values.rows
        self.values.append(elements)
        return start

    def gather(self, starts: np.ndarray, lengths: np.ndarray) -> Column:
        return take_column(self.values.column(), ragged_index(starts, lengths))


class NestedColumns:
    """Splits nested columns into row columns for a store and arenas of list elements (see the module doc)."""

    def __init__(self) -> None:
        self._arenas: dict[str, _Arena] = {}
        self._layouts: dict[str, Any] = {}  # column name -> how to put its row columns together again

    @staticmethod
    def needed(table: Table) -> bool:
        """True when ``table`` holds a column of :mod:`petastorm.columns` (not a plain array)."""
        return any(is_nested(column) for column in table.values())

    def encode(self, table: Table) -> Table:
        """``table`` with each nested column replaced by its row columns (its list elements go to the arenas)."""
        out: Table = {}
        for name, column in table.items():
            if is_nested(column):
                self._layouts[name] = self._encode(name, column, out)
            else:
                out[name] = column
        return out

    def _encode(self, key: str, column: Column, out: Table) -> Any:
        rows = num_rows(column)
        if isinstance(column, MaskedColumn):
            out[f'{key}{SEPARATOR}values'] = column.values
            out[f'{key}{SEPARATOR}valid'] = column.valid
            return ('masked',)
        if isinstance(column, StructColumn):
            layout = {name: self._encode(f'{key}{SEPARATOR}f{name}', child, out) for name, child in column.items()}
            if column.valid is not None:
                out[f'{key}{SEPARATOR}valid'] = column.valid
            return ('struct', layout, column.valid is not None)
        if isinstance(column, ListColumn):
            normalized = column.normalized()
            arena = self._arenas.get(key)
            if arena is None:
                arena = self._arenas[key] = _Arena(normalized.values)
            start = arena.add(normalized.values)
            out[f'{key}{SEPARATOR}start'] = normalized.offsets[:-1] + start
            out[f'{key}{SEPARATOR}length'] = np.diff(normalized.offsets)
            if column.valid is not None:
                out[f'{key}{SEPARATOR}valid'] = column.valid
            return ('map' if isinstance(column, MapColumn) else 'list', column.valid is not None)
        out[key] = column
        del rows
        return ('array',)

    def decode(self, table: Table) -> Table:
        """The columns of rows drawn from a store of :meth:`encode`'d tables, nested columns put together again."""
        out: Table = {}
        done: set[str] = set()
        for key in table:
            name = key.split(SEPARATOR, 1)[0]
            if name in done:
                continue
            done.add(name)
            layout = self._layouts.get(name)
            out[name] = table[name] if layout is None else self._decode(name, layout, table)
        return out

    def _decode(self, key: str, layout: Any, table: Table) -> Column:
        kind = layout[0]
        if kind == 'array':
            return table[key]
        if kind == 'masked':
            return MaskedColumn(table[f'{key}{SEPARATOR}values'], table[f'{key}{SEPARATOR}valid'])
        if kind == 'struct':
            fields = {name: self._decode(f'{key}{SEPARATOR}f{name}', child, table) for name, child in layout[1].items()}
            valid = table[f'{key}{SEPARATOR}valid'] if layout[2] else None
            rows = len(valid) if valid is not None else _rows_of_layout(fields, table, key)
            return StructColumn(fields, rows, valid)
        starts = np.asarray(table[f'{key}{SEPARATOR}start'])
        lengths = np.asarray(table[f'{key}{SEPARATOR}length'])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        cls = MapColumn if kind == 'map' else ListColumn
        valid = table[f'{key}{SEPARATOR}valid'] if layout[1] else None
        return cls(self._arenas[key].gather(starts, lengths), offsets, valid)

    def compact(self, held: Callable[[str], np.ndarray], size: int) -> None:
        """Copy the elements of the ``size`` rows still held into new arenas, when the old ones hold much more.

        ``held(key)`` is the store's column ``key`` of the held rows, a view the new starts are written into.
        """
        if not size:
            return
        for key, arena in list(self._arenas.items()):
            lengths = np.asarray(held(f'{key}{SEPARATOR}length'))
            live = int(lengths.sum())
            if arena.values.rows <= 2 * live + _MIN_ROOM:
                continue
            starts_view = held(f'{key}{SEPARATOR}start')
            starts = np.asarray(starts_view)
            kept = arena.gather(starts, lengths)
            fresh = _Arena(kept)
            fresh.add(kept)
            new_starts = np.zeros(size, dtype=np.int64)
            np.cumsum(lengths[:-1], out=new_starts[1:])
            starts_view[:] = new_starts
            self._arenas[key] = fresh


def _rows_of_layout(fields: dict[str, Column], table: Table, key: str) -> int:
    for column in fields.values():
        return num_rows(column)
    for name, array in table.items():
        if name.startswith(key):
            return len(array)
    return 0
