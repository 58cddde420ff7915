"""Columns as flat ``{key: numpy array}`` dicts and back: how nested columns cross a process boundary.

The process pool moves plain numpy arrays through shared memory (:class:`~petastorm.pools.base.ArrayCarrier`).
:func:`flatten_columns` lists every array of every column under a key naming its place (a plain array keeps its
column's name); :func:`unflatten_columns` rebuilds the columns from those keys alone.

An object column whose rows are arrays of one dtype and one number of dimensions (decoded audio clips of different
lengths, images of different sizes; None for a missing row) travels as one flat buffer of every row's values, their
offsets and shapes, not as a pickle of one array per row; it is rebuilt as the same object column of views.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from petastorm.columns._kinds import Column, ListColumn, MapColumn, MaskedColumn, StructColumn

#: Separates the parts of a flat key (a column name never holds it).
SEPARATOR = '\x1f'
# Kind tags and the roles of their parts.
_MASKED, _LIST, _MAP, _STRUCT, _ROWS = 'M', 'L', 'P', 'S', 'R'
_FIELD = 'f'


def flatten_columns(columns: Mapping[str, Column]) -> dict[str, np.ndarray]:
    """Every array of the columns under its flat key, in a stable order."""
    out: dict[str, np.ndarray] = {}
    for name, column in columns.items():
        _flatten(name, column, out)
    return out


def _flatten(key: str, column: Column, out: dict[str, np.ndarray]) -> None:
    if isinstance(column, np.ndarray):
        rows = _array_rows(column)
        if rows is None:
            out[key] = column
        else:
            for role, array in rows.items():
                out[f'{key}{SEPARATOR}{_ROWS}{SEPARATOR}{role}'] = array
        return
    if isinstance(column, MaskedColumn):
        out[f'{key}{SEPARATOR}{_MASKED}{SEPARATOR}valid'] = column.valid
        out[f'{key}{SEPARATOR}{_MASKED}{SEPARATOR}values'] = column.values
        return
    if isinstance(column, ListColumn):
        tag = _MAP if isinstance(column, MapColumn) else _LIST
        out[f'{key}{SEPARATOR}{tag}{SEPARATOR}offsets'] = column.offsets
        if column.valid is not None:
            out[f'{key}{SEPARATOR}{tag}{SEPARATOR}valid'] = column.valid
        _flatten(f'{key}{SEPARATOR}{tag}{SEPARATOR}values', column.values, out)
        return
    if isinstance(column, StructColumn):
        out[f'{key}{SEPARATOR}{_STRUCT}{SEPARATOR}rows'] = np.array([column.num_rows], dtype=np.int64)
        if column.valid is not None:
            out[f'{key}{SEPARATOR}{_STRUCT}{SEPARATOR}valid'] = column.valid
        for name, child in column.items():
            _flatten(f'{key}{SEPARATOR}{_STRUCT}{SEPARATOR}{_FIELD}{name}', child, out)
        return
    raise TypeError(f'column {key.split(SEPARATOR)[0]!r}: cannot carry a {type(column).__name__}')


def _array_rows(column: np.ndarray) -> dict[str, np.ndarray] | None:
    """An object column of arrays of one dtype and ndim (or None) as ``values``, ``offsets``, ``shapes`` and, when a
    row is None, ``valid``; None for any other column."""
    if column.dtype != object or column.ndim != 1 or not len(column):
        return None
    present = [row for row in column if row is not None]
    if not present or not all(type(row) is np.ndarray for row in present):
        return None
    first = present[0]
    if first.dtype.hasobject or any(row.dtype != first.dtype or row.ndim != first.ndim for row in present):
        return None
    shapes = np.zeros((len(column), first.ndim), dtype=np.int64)
    sizes = np.zeros(len(column), dtype=np.int64)
    for index, row in enumerate(column):
        if row is not None:
            shapes[index] = row.shape
            sizes[index] = row.size
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=first.dtype)
    for index, row in enumerate(column):
        if sizes[index]:
            values[offsets[index]:offsets[index + 1]] = row.reshape(-1)
    arrays = {'values': values, 'offsets': offsets, 'shapes': shapes}
    if len(present) < len(column):
        arrays['valid'] = np.array([row is not None for row in column])
    return arrays


def _rows_of_arrays(node: dict[str, Any]) -> np.ndarray:
    """The object column :func:`_array_rows` flattened: each row a view of the flat values (None where not valid)."""
    values, offsets, shapes, valid = node['values'], node['offsets'].tolist(), node['shapes'], node.get('valid')
    column = np.empty(len(shapes), dtype=object)
    for index, shape in enumerate(shapes.tolist()):
        if valid is None or valid[index]:
            column[index] = values[offsets[index]:offsets[index + 1]].reshape(shape)
    return column


def is_flat_key(key: str) -> bool:
    """True for the key of a part of a nested column."""
    return SEPARATOR in key


def unflatten_columns(arrays: Mapping[str, np.ndarray]) -> dict[str, Column]:
    """The columns :func:`flatten_columns` flattened into ``arrays``, in their order."""
    tree: dict[str, Any] = {}
    for key, array in arrays.items():
        name, _, rest = key.partition(SEPARATOR)
        if not rest:
            tree[name] = array
            continue
        node = tree.setdefault(name, {})
        parts = rest.split(SEPARATOR)
        while True:
            node.setdefault('', parts[0])  # the kind of this node
            role = parts[1]
            if len(parts) == 2:
                node[role] = array
                break
            node = node.setdefault(role, {})
            parts = parts[2:]
    return {name: _build(node) for name, node in tree.items()}


def _build(node: Any) -> Column:
    if isinstance(node, np.ndarray):
        return node
    kind = node['']
    if kind == _ROWS:
        return _rows_of_arrays(node)
    if kind == _MASKED:
        return MaskedColumn(node['values'], node['valid'])
    if kind in (_LIST, _MAP):
        cls = MapColumn if kind == _MAP else ListColumn
        return cls(_build(node['values']), node['offsets'], node.get('valid'))
    fields = {role[len(_FIELD):]: _build(child) for role, child in node.items() if role.startswith(_FIELD)}
    return StructColumn(fields, int(node['rows'][0]), node.get('valid'))
