"""What ``make_batch_reader`` hands the user for a column, and what a field's schema makes of a decoded column.

Inside the reader a column with nulls is a :class:`MaskedColumn`; at the edge, in the batches of
``make_batch_reader``, it is a ``numpy.ma.MaskedArray`` (the values and a mask, in the one type numpy code knows
for that), and list columns whose rows all have the same length are one dense array, as Petastorm gave them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from petastorm.columns._kinds import Column, ListColumn, MapColumn, MaskedColumn, StructColumn, densified


def batch_column(column: Column) -> Any:
    """The form ``make_batch_reader`` delivers a column in.

    * :class:`MaskedColumn` -> ``numpy.ma.MaskedArray`` (``mask`` True at the nulls; the data holds fill values);
    * a list column whose rows all have one length (and no null row) -> one ``(rows, length, ...)`` array;
    * any other list column -> the :class:`ListColumn` (``values`` + ``offsets``; ``column[i]`` is row ``i``);
    * a struct -> a :class:`StructColumn` (a dict of its fields' columns) of these forms.
    """
    if isinstance(column, MaskedColumn):
        missing = ~column.valid
        if column.values.ndim > 1:  # a row's whole array is masked
            missing = np.repeat(missing, int(np.prod(column.values.shape[1:]))).reshape(column.values.shape)
        return np.ma.MaskedArray(column.values, mask=missing)
    if isinstance(column, StructColumn):
        return StructColumn({name: batch_column(child) for name, child in column.items()}, column.num_rows,
                            column.valid)
    if isinstance(column, ListColumn):
        dense = densified(column)
        if isinstance(dense, np.ndarray):
            return dense
        inner = column.values
        converted = batch_column(inner) if not isinstance(inner, np.ndarray) else inner
        if converted is inner:
            return column
        return type(column)(converted, column.offsets, column.valid)
    return column


def from_batch_column(value: Any) -> Column:
    """The column a value of :func:`batch_column`'s forms stands for (the inverse, for readers' batches).

    A masked array becomes a :class:`MaskedColumn` again (its mask the nulls), list and struct columns have their
    parts made columns too; anything else becomes a numpy array.
    """
    if isinstance(value, np.ma.MaskedArray):
        missing = np.ma.getmaskarray(value)
        if missing.ndim > 1:
            missing = np.asarray(missing.reshape(len(missing), -1).all(axis=1))
        return MaskedColumn(np.asarray(value.data), ~missing)
    if isinstance(value, StructColumn):
        return StructColumn({name: from_batch_column(child) for name, child in value.items()}, value.num_rows,
                            value.valid)
    if isinstance(value, ListColumn):
        return type(value)(from_batch_column(value.values), value.offsets, value.valid)
    if isinstance(value, MaskedColumn):
        return value
    return np.asarray(value)


def cast_leaves(column: Column, dtype: Any) -> Column:
    """``column`` with its numeric leaf values cast to the numpy type ``dtype`` (a field stored wider or signed).

    Spark stores ``uint8`` values as shorts and ``uint16`` as ints: the field's type says what they are.
    """
    if not (isinstance(dtype, type) and issubclass(dtype, np.generic)) or dtype in (np.datetime64, np.timedelta64):
        return column
    target = np.dtype(dtype)
    if isinstance(column, np.ndarray):
        if column.dtype.kind in 'biuf' and target.kind in 'biuf' and column.dtype != target:
            return column.astype(target)
        return column
    if isinstance(column, MaskedColumn):
        return MaskedColumn(cast_leaves(column.values, dtype), column.valid)  # type: ignore[arg-type]
    if isinstance(column, MapColumn):
        return column
    if isinstance(column, ListColumn):
        return type(column)(cast_leaves(column.values, dtype), column.offsets, column.valid)
    return column
