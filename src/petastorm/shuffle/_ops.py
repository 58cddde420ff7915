"""Array operations of the buffers: the :class:`ArrayOps` protocol and its numpy form, :class:`NumpyOps`.

The buffers never index an array themselves: an *ops* object does the few operations that differ between array
types (numpy here; torch tensors in the torch adapter's ``TensorOps``), so that one buffer implementation serves
both. Positions are always int64 numpy arrays, whatever the array type.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from petastorm.columns import concat_columns, is_nested, take_column


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


class NumpyOps(ArrayOps):
    """Buffer operations on numpy columns; columns whose chunks disagree in type or row shape become lists.

    Chunks of one column normally share a dtype and a row shape. When they do not (strings of different widths,
    arrays whose shape varies between row groups, a transform returning different types), the column is turned
    into an object array holding each row's value, which the collation step handles value by value.
    """

    def concat(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        """The rows of ``parts`` in one array (a wider string type, or row objects, when their layouts differ)."""
        if any(is_nested(part) for part in parts):
            return concat_columns(parts)  # type: ignore[return-value]
        first = parts[0]
        if all(_same_layout(first, part) for part in parts):
            return np.concatenate(parts)
        if all(part.dtype.kind in 'US' for part in parts) and all(part.ndim == first.ndim for part in parts):
            return np.concatenate(parts)  # numpy widens the string type
        return np.concatenate([as_row_objects(part) for part in parts])

    def take(self, array: np.ndarray, index: np.ndarray) -> np.ndarray:
        """A new array of the rows at ``index``."""
        if is_nested(array):
            return take_column(array, index)  # type: ignore[return-value]
        return np.take(array, index, axis=0)

    def move(self, array: np.ndarray, source: np.ndarray, target: np.ndarray) -> None:
        """In place: row ``target[i]`` becomes row ``source[i]``."""
        array[target] = np.take(array, source, axis=0)

    def storage(self, name: str, like: np.ndarray, rows: int, old: np.ndarray | None, used: int) -> np.ndarray:
        """Room for ``rows`` rows like ``like`` holding ``old[:used]`` (as row objects when the layouts differ)."""
        if old is not None and not _same_layout(old, like):
            old = as_row_objects(old[:used])
            like = as_row_objects(like[:0])
        new = np.empty((rows, *like.shape[1:]), dtype=like.dtype)
        if old is not None and used:
            new[:used] = old[:used]
        return new

    def write(self, name: str, storage: np.ndarray, start: int, values: np.ndarray) -> np.ndarray:
        """``values`` written at rows ``start...`` of ``storage``, widened to strings or row objects if needed."""
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
