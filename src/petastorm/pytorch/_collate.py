"""Collation: rows to a batch (``decimal_friendly_collate``) and, on the fast path, columns to a batch.

:func:`collate_columns` produces, from a table of ``B`` rows, exactly what :func:`decimal_friendly_collate`
produces from those ``B`` rows, but works on whole columns: a numeric column becomes one tensor with no per-row
step, and only columns torch has no tensor for (strings, Decimals, arrays whose shape varies) are looked at
value by value.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from petastorm.columns import MaskedColumn, is_nested, row_values
from petastorm.pytorch._nested import TorchForms
from petastorm.pytorch._nulls import VALID_SUFFIX
from petastorm.pytorch._ragged import MASK_SUFFIX, VariableLength
from petastorm.pytorch._tensors import (
    check_no_none,
    is_list_value,
    pad_values,
    promote_dtype,
    sanitize_value,
    stack_values,
    to_tensor,
    torch,
)

_NUMERIC_KINDS = frozenset('biufc')


def decimal_friendly_collate(batch: Sequence[Any]) -> Any:
    """Collate a list of rows like torch's default collate, keeping what torch cannot hold as lists.

    * ``Decimal``, ``str``, ``bytes`` and numpy strings, objects or datetimes: the values as they were given (a
      list of a mapping's values, a tuple of a position's values);
    * a mapping: a dict collating each key's values; a tuple or list: a list collating each position
      (a namedtuple keeps its type);
    * arrays or tensors whose shapes differ between rows: a list with one tensor per row (torch would fail to
      stack them);
    * anything else: ``torch.utils.data.default_collate``.

    Example:
        >>> decimal_friendly_collate([{'a': Decimal('1.5'), 'b': 1}, {'a': Decimal('2'), 'b': 2}])
        {'a': [Decimal('1.5'), Decimal('2')], 'b': tensor([1, 2])}
    """
    if not len(batch):
        return []
    first = batch[0]
    if is_list_value(first):
        return batch if isinstance(batch, (list, tuple)) else list(batch)
    if isinstance(first, Mapping):
        return {key: decimal_friendly_collate([row[key] for row in batch]) for key in first}
    if isinstance(first, tuple) and hasattr(first, '_fields'):
        return type(first)(*(decimal_friendly_collate(values) for values in zip(*batch, strict=True)))
    if isinstance(first, collections.abc.Sequence):
        return [decimal_friendly_collate(values) for values in zip(*batch, strict=True)]
    if isinstance(first, (np.ndarray, torch.Tensor)):
        stacked = stack_values(list(batch))
        return stacked if stacked is not None else _tensor_list(batch)
    return torch.utils.data.default_collate(list(batch))


def _sanitize_pytorch_types(row_as_dict: dict[str, Any]) -> None:
    """In place, make a row's values ready for torch, as the original loaders did.

    uint16 becomes int32, uint32 becomes int64, bools become uint8; arrays of strings or objects and None values
    raise ``TypeError``.
    """
    for name, value in row_as_dict.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in 'USaO':
            raise TypeError(f'Pytorch does not support arrays of string or object classes. Found in field {name}.')
        row_as_dict[name] = sanitize_value(name, value)


def prepare_columns(columns: dict[str, Any], forms: TorchForms | None = None,
                    bool_to_uint8: bool = True) -> dict[str, Any]:
    """The columns of one chunk made ready for the buffers: nulls, times and nested columns as ``forms`` say
    (see :meth:`~petastorm.pytorch._nested.TorchForms.prepare`), numeric dtypes promoted as the original loaders did
    (whole columns at once)."""
    out = {}
    for name, array in columns.items():
        if forms is not None:
            array = forms.prepare(name, array)
        out[name] = promote_dtype(array, bool_to_uint8) \
            if isinstance(array, np.ndarray) and array.dtype.kind in _NUMERIC_KINDS else array
    return out


def collate_columns(columns: dict[str, Any], as_tuple: bool, variable_length: VariableLength,
                    variable_fields: frozenset[str], padding_value: Any, forms: TorchForms | None = None,
                    bool_to_uint8: bool = True) -> Any:
    """One batch from the columns of its rows: a dict by field name, or a list by position for tuple rows.

    Args:
        columns: the batch's columns (numpy, dtypes already promoted), all with the batch's number of rows.
        as_tuple: the rows are tuples (a transform returned tuples): return a list in column order.
        variable_length: ``'list'`` or ``'pad'`` (see :class:`~petastorm.pytorch.DataLoader`).
        variable_fields: fields whose schema shape has a ``None`` dimension (padded, with a mask, in pad mode).
        padding_value: the value padding fills in.
        bool_to_uint8: bools inside per-row values (variable-shape arrays) become uint8, as numeric columns do.
    """
    out: dict[str, Any] = {}
    for name, column in columns.items():
        if is_nested(column) and forms is not None:
            forms.finish(name, column, out, tensors=False)
            continue
        pad = variable_length == 'pad'
        value = _collate_column(name, column, pad, padding_value, bool_to_uint8)
        if pad and (isinstance(value, tuple) or name in variable_fields) and not as_tuple:
            padded, mask = value if isinstance(value, tuple) else (value, _full_mask(value))
            out[name] = padded
            out[name + MASK_SUFFIX] = mask
        else:
            out[name] = value
    return list(out.values()) if as_tuple else out


def rows_of(columns: dict[str, Any], as_tuple: bool, bool_to_uint8: bool = True) -> list[Any]:
    """The rows of a batch as a row reader gives them to a collate function: dicts, or tuples for tuple rows.

    A masked column (``nulls='mask'``) gives its values and, under ``'<name>_valid'``, whether each is not null.
    """
    expanded: dict[str, Any] = {}
    for name, column in columns.items():
        if isinstance(column, MaskedColumn):
            expanded[name] = column.values
            expanded[name + VALID_SUFFIX] = column.valid
        else:
            expanded[name] = list(row_values(column)) if is_nested(column) else column
    columns = expanded
    names = list(columns)
    values = [[sanitize_value(name, v, bool_to_uint8) for v in columns[name]] for name in names]
    if as_tuple:
        return list(zip(*values, strict=True))
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


def _collate_column(name: str, column: np.ndarray, pad: bool, padding_value: Any, bool_to_uint8: bool) -> Any:
    if column.dtype.kind in _NUMERIC_KINDS:
        return to_tensor(column)
    if column.dtype != object:
        return list(column)  # strings, datetimes: as the row values are
    check_no_none(name, column)
    values = [sanitize_value(name, v, bool_to_uint8) for v in column]
    if values and all(isinstance(v, (np.ndarray, torch.Tensor)) for v in values) and not is_list_value(values[0]):
        stacked = stack_values(values)
        if stacked is not None:
            return stacked
        if pad:
            return pad_values(name, values, padding_value)
        return _tensor_list(values)
    return decimal_friendly_collate(values)


def _tensor_list(values: Sequence[Any]) -> list[Any]:
    return [to_tensor(v) if isinstance(v, np.ndarray) else v for v in values]


def _full_mask(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.ones(value.shape, dtype=torch.bool)
    return None
