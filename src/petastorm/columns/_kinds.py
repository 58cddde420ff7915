"""The column kinds beyond a plain numpy array: nulls, lists (ragged, nested, maps) and structs.

A *column* holds the values of one field for a run of rows, rows first, and is one of:

* a numpy array (``(rows, *shape)``; strings as fixed-width ``np.str_``, Decimals as an object array);
* :class:`MaskedColumn`: a numpy array of values (a fill value where a row is null) and a bool ``valid`` array;
* :class:`ListColumn`: the elements of every row one after the other (``values``, itself a column) and the
  ``offsets`` where each row's elements start and end, as Arrow lays out a list array; :class:`MapColumn` is a
  list of ``key``/``value`` structs;
* :class:`StructColumn`: a dict of the field columns (all with the same rows) and the struct's own ``valid``.

Every kind slices, gathers and concatenates whole arrays (no per-row Python); the only per-row work is in
:func:`row_values`, which the row readers call at the edge.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Union

import numpy as np

Column = Union[np.ndarray, 'MaskedColumn', 'ListColumn', 'StructColumn']


def _as_offsets(offsets: Any) -> np.ndarray:
    array = np.asarray(offsets)
    if array.dtype != np.int64:
        array = array.astype(np.int64)
    return array


class MaskedColumn:
    """A column that holds nulls: its values and which of them are valid.

    Attributes:
        values: the values, rows first; where a value is null it holds a fill value (zero, an empty string), never
            garbage, so that the column can be handed on as it is.
        valid: bool per row, True where the value is not null.
    """

    __slots__ = ('valid', 'values')

    def __init__(self, values: np.ndarray, valid: np.ndarray) -> None:
        self.values = values
        self.valid = valid

    def __len__(self) -> int:
        return len(self.valid)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            return row_value(self, int(index))
        return MaskedColumn(self.values[index], self.valid[index])

    def __iter__(self) -> Iterator[Any]:
        return row_values(self)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the values."""
        return self.values.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the values."""
        return self.values.shape

    def __repr__(self) -> str:
        return f'MaskedColumn({len(self)} rows of {self.values.dtype}, {int((~self.valid).sum())} null)'


class ListColumn:
    """A column of lists: row ``i`` holds the elements ``values[offsets[i]:offsets[i + 1]]``.

    The offsets are int64 and need not start at 0 (a slice of rows shares its parent's values). A row's elements
    are a numpy array when ``values`` is one (of shape ``(length, *element shape)``), so a list of lists of floats
    is a list column whose values are a list column of floats.

    Attributes:
        values: every element of every row, itself a column.
        offsets: ``rows + 1`` non-decreasing int64 positions into ``values``.
        valid: bool per row, or None when no row is null (a null row holds no elements).
    """

    __slots__ = ('offsets', 'valid', 'values')

    def __init__(self, values: Column, offsets: Any, valid: np.ndarray | None = None) -> None:
        self.values = values
        self.offsets = _as_offsets(offsets)
        self.valid = valid

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            return row_value(self, int(index))
        if isinstance(index, slice):
            return slice_column(self, *_slice_bounds(index, len(self)))
        return take_column(self, np.asarray(index))

    def __iter__(self) -> Iterator[Any]:
        return row_values(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # np.asarray(column): each row's value in an object array, the form of a column of lists before lists had
        # their own kind.
        out = np.empty(len(self), dtype=object)
        for i, value in enumerate(row_values(self)):
            out[i] = value
        return out

    @property
    def lengths(self) -> np.ndarray:
        """The number of elements of each row."""
        return np.diff(self.offsets)

    def normalized(self) -> ListColumn:
        """The same rows with offsets starting at 0 and values holding exactly the rows' elements."""
        start, stop = int(self.offsets[0]), int(self.offsets[-1])
        if start == 0 and stop == num_rows(self.values):
            return self
        return type(self)(slice_column(self.values, start, stop), self.offsets - start, self.valid)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({len(self)} rows, {int(self.offsets[-1] - self.offsets[0])} elements)'


class MapColumn(ListColumn):
    """A column of maps: a list column whose elements are ``key`` / ``value`` structs (Arrow's map layout).

    A row's value is the list of its ``(key, value)`` pairs in stored order, as pyarrow gives it (keys may repeat).
    """

    __slots__ = ()

    @property
    def keys(self) -> Column:
        """Every row's keys, one after the other (cut by ``offsets``)."""
        assert isinstance(self.values, StructColumn)
        return self.values['key']

    @property
    def items(self) -> Column:
        """Every row's values, one after the other (cut by ``offsets``)."""
        assert isinstance(self.values, StructColumn)
        return self.values['value']


class StructColumn(dict):
    """A column of structs: a dict ``{field name: column}`` of its fields, all with the same rows.

    ``batch.st['a']`` is the column of the struct's field ``a``. The dict's ``len`` is its number of fields; the
    number of rows is :attr:`num_rows` (and :func:`num_rows`).

    Attributes:
        num_rows: the rows of the column.
        valid: bool per row, or None when no struct is null. A null struct's fields hold fill values or nulls.
    """

    def __init__(self, fields: Mapping[str, Column], num_rows: int, valid: np.ndarray | None = None) -> None:
        super().__init__(fields)
        self.num_rows = int(num_rows)
        self.valid = valid

    def __reduce__(self) -> tuple[Any, ...]:
        return StructColumn, (dict(self), self.num_rows, self.valid)

    def __repr__(self) -> str:
        return f'StructColumn({self.num_rows} rows, fields {list(self)})'


def _slice_bounds(index: slice, length: int) -> tuple[int, int]:
    start, stop, step = index.indices(length)
    if step != 1:
        raise IndexError('columns slice with step 1 only; gather rows with an index array')
    return start, max(start, stop)


def num_rows(column: Column) -> int:
    """The rows of a column."""
    if isinstance(column, StructColumn):
        return column.num_rows
    return len(column)


def is_nested(column: Any) -> bool:
    """True for the column kinds of this module (not a plain numpy array)."""
    return isinstance(column, (MaskedColumn, ListColumn, StructColumn))


def slice_column(column: Column, start: int, stop: int) -> Column:
    """Rows ``[start, stop)`` of a column, sharing its memory."""
    if isinstance(column, StructColumn):
        return StructColumn({name: slice_column(child, start, stop) for name, child in column.items()},
                            stop - start, None if column.valid is None else column.valid[start:stop])
    if isinstance(column, ListColumn):
        return type(column)(column.values, column.offsets[start:stop + 1],
                            None if column.valid is None else column.valid[start:stop])
    if isinstance(column, MaskedColumn):
        return MaskedColumn(column.values[start:stop], column.valid[start:stop])
    return column[start:stop]


def ragged_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] ... starts[i] + lengths[i] - 1`` of every ``i``, one after the other (int64)."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    # Each position is its run's start plus its place in the run: one repeat of (start - run begin) and a range.
    ends = np.cumsum(lengths)
    shift = np.repeat(starts.astype(np.int64, copy=False) - (ends - lengths), lengths)
    shift += np.arange(total, dtype=np.int64)
    return shift


def take_column(column: Column, index: np.ndarray) -> Column:
    """New column of the rows at ``index`` (int positions), in that order."""
    index = np.asarray(index, dtype=np.int64)
    if isinstance(column, StructColumn):
        return StructColumn({name: take_column(child, index) for name, child in column.items()}, len(index),
                            None if column.valid is None else column.valid[index])
    if isinstance(column, ListColumn):
        starts = column.offsets[:-1][index]
        lengths = column.offsets[1:][index] - starts
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return type(column)(take_column(column.values, ragged_index(starts, lengths)), offsets,
                            None if column.valid is None else column.valid[index])
    if isinstance(column, MaskedColumn):
        return MaskedColumn(np.take(column.values, index, axis=0), np.take(column.valid, index, axis=0))
    return np.take(column, index, axis=0)


def _as_masked(column: Column) -> MaskedColumn:
    if isinstance(column, MaskedColumn):
        return column
    assert isinstance(column, np.ndarray)
    return MaskedColumn(column, np.ones(len(column), dtype=bool))


def _concat_arrays(parts: Sequence[np.ndarray]) -> np.ndarray:
    first = parts[0]
    if all(p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts):
        return np.concatenate(parts)
    if all(p.dtype.kind in 'US' for p in parts) and all(p.ndim == first.ndim for p in parts):
        return np.concatenate(parts)  # numpy widens the string type
    if all(p.dtype.kind in 'biuf' for p in parts) and all(p.shape[1:] == first.shape[1:] for p in parts):
        return np.concatenate(parts).astype(np.result_type(*parts), copy=False)
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    position = 0
    for part in parts:
        for i in range(len(part)):
            out[position] = part[i]
            position += 1
    return out


def _concat_valid(parts: Sequence[Any], count: Sequence[int]) -> np.ndarray | None:
    if all(v is None for v in parts):
        return None
    return np.concatenate([np.ones(n, dtype=bool) if v is None else v for v, n in zip(parts, count, strict=True)])


def concat_columns(parts: Sequence[Column]) -> Column:
    """The rows of ``parts`` one after the other, as one new column.

    Parts of one field may differ in kind where a row group had nulls and another did not (a plain array and a
    :class:`MaskedColumn`): the result is masked then. Arrays of different dtypes or row shapes become an object
    array of the rows' values, as the buffers of the loaders do.

    Raises:
        TypeError: the parts are lists in one row group and not in another, or structs of other fields.
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    if any(isinstance(p, MaskedColumn) for p in parts) and all(isinstance(p, (MaskedColumn, np.ndarray))
                                                              for p in parts):
        masked = [_as_masked(p) for p in parts]
        return MaskedColumn(_concat_arrays([m.values for m in masked]), np.concatenate([m.valid for m in masked]))
    if isinstance(first, StructColumn):
        structs = [p for p in parts if isinstance(p, StructColumn) and list(p) == list(first)]
        if len(structs) != len(parts):
            raise TypeError(f'cannot join structs of fields {list(first)} with {[_describe(p) for p in parts]}')
        counts = [num_rows(p) for p in structs]
        return StructColumn({name: concat_columns([p[name] for p in structs]) for name in first}, sum(counts),
                            _concat_valid([p.valid for p in structs], counts))
    if isinstance(first, ListColumn):
        lists = [p for p in parts if isinstance(p, ListColumn)]
        if len(lists) != len(parts):
            raise TypeError(f'cannot join lists with {[_describe(p) for p in parts]}')
        normalized = [p.normalized() for p in lists]
        ends = np.cumsum([0] + [int(p.offsets[-1]) for p in normalized])
        offsets = np.concatenate([normalized[0].offsets[:1]] + [p.offsets[1:] + ends[k]
                                                                for k, p in enumerate(normalized)])
        counts = [len(p) for p in lists]
        return type(first)(concat_columns([p.values for p in normalized]), offsets,
                           _concat_valid([p.valid for p in lists], counts))
    if any(is_nested(p) for p in parts):
        raise TypeError(f'cannot join {[_describe(p) for p in parts]}')
    return _concat_arrays(list(parts))  # type: ignore[arg-type]


def _describe(column: Any) -> str:
    return type(column).__name__ if is_nested(column) else f'array of {column.dtype}'


def leaf_validity(column: Column) -> np.ndarray | None:
    """The validity of a column's rows: its ``valid`` flags (one per row), or None when no row is null."""
    if isinstance(column, MaskedColumn):
        return column.valid
    if isinstance(column, (ListColumn, StructColumn)):
        return column.valid
    return None


def row_value(column: Column, i: int) -> Any:
    """The value of row ``i`` as a row reader gives it: a numpy scalar or array, a list, a dict or None.

    The scalars inside a struct's dict and a map's ``(key, value)`` pairs are Python's (``1.5``, ``'a'``), as
    pyarrow's ``to_pylist()`` gives them, so that a printed row reads as its values.
    """
    if isinstance(column, StructColumn):
        if column.valid is not None and not column.valid[i]:
            return None
        return {name: _native(row_value(child, i)) for name, child in column.items()}
    if isinstance(column, ListColumn):
        if column.valid is not None and not column.valid[i]:
            return None
        start, stop = int(column.offsets[i]), int(column.offsets[i + 1])
        values = column.values
        if isinstance(column, MapColumn):
            keys, items = values['key'], values['value']  # type: ignore[index]
            return [(_native(row_value(keys, j)), _native(row_value(items, j))) for j in range(start, stop)]
        if isinstance(values, np.ndarray):
            return values[start:stop]
        return [row_value(values, j) for j in range(start, stop)]
    if isinstance(column, MaskedColumn):
        return column.values[i] if column.valid[i] else None
    return column[i]


def _native(value: Any) -> Any:
    """A numpy scalar as Python's (inside dicts and pairs); anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value


def row_values(column: Column) -> Iterator[Any]:
    """The value of every row, in order (see :func:`row_value`); for row readers, at the edge."""
    if isinstance(column, np.ndarray):
        return iter(column)
    if isinstance(column, MaskedColumn):
        return (value if ok else None for value, ok in zip(column.values, column.valid.tolist(), strict=True))
    if isinstance(column, ListColumn) and not isinstance(column, MapColumn) and isinstance(column.values,
                                                                                           np.ndarray):
        bounds = column.offsets.tolist()
        values = column.values
        valid = [True] * len(column) if column.valid is None else column.valid.tolist()
        return (values[bounds[i]:bounds[i + 1]] if valid[i] else None for i in range(len(column)))
    return (row_value(column, i) for i in range(num_rows(column)))


def to_pylist(column: Column) -> list[Any]:
    """Every row's value as plain Python objects (numbers, str, bytes, lists, dicts, None), as pyarrow's."""
    return [_plain(value) for value in row_values(column)]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value] if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def column_nbytes(column: Column) -> int:
    """Bytes held by a column's arrays (object arrays count their pointers only)."""
    if isinstance(column, StructColumn):
        return sum(column_nbytes(c) for c in column.values()) + _nbytes(column.valid)
    if isinstance(column, ListColumn):
        return column_nbytes(column.values) + column.offsets.nbytes + _nbytes(column.valid)
    if isinstance(column, MaskedColumn):
        return column.values.nbytes + column.valid.nbytes
    return int(column.nbytes)


def _nbytes(array: np.ndarray | None) -> int:
    return 0 if array is None else int(array.nbytes)


def list_depth(column: Column) -> int:
    """How many list levels a column has above its elements (0 for anything that is not a list)."""
    depth = 0
    while isinstance(column, ListColumn) and not isinstance(column, MapColumn):
        depth += 1
        column = column.values
    return depth


def densified(column: Column) -> Column:
    """A list column whose rows all hold the same number of elements as one ``(rows, length, ...)`` array.

    Nested lists become dense as far down as their lengths agree; any other column is returned as it is.
    """
    if not isinstance(column, ListColumn) or isinstance(column, MapColumn) or column.valid is not None:
        return column
    lengths = column.lengths
    if not len(lengths) or (lengths != lengths[0]).any():
        return column
    inner = densified(column.normalized().values)
    if not isinstance(inner, np.ndarray) or inner.dtype == object:  # a list, struct or masked column inside
        return column
    return inner.reshape((len(lengths), int(lengths[0]), *inner.shape[1:]))
