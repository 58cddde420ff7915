"""A reader's columns made ready for the torch loaders: forms of nested fields, tensor checks, finished batches.

The batched loaders (:class:`~petastorm.pytorch.BatchedDataLoader`, :class:`~petastorm.pytorch.InMemBatchedDataLoader`)
make tensors of every field: :func:`check_tensor_fields` refuses, before reading, the fields that have none,
:func:`batch_columns` turns the columns of a chunk into what their buffers hold, and :func:`finish_batch` makes
the tensors of a batch. :func:`forms` checks what nested fields become, for every loader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from petastorm.columns import is_nested
from petastorm.pytorch._collate import prepare_columns
from petastorm.pytorch._nested import TorchForms, check_forms
from petastorm.pytorch._nulls import VALID_SUFFIX, NullOption
from petastorm.pytorch._ragged import MASK_SUFFIX, VariableLength
from petastorm.pytorch._tensors import (
    TorchTypeError,
    as_numpy_view,
    batch_tensor,
    check_no_none,
    stack_values,
    to_tensor,
    torch,
)
from petastorm.reading.batch_stream import ROW_IDS
from petastorm.reading.source import ColumnSource
from petastorm.shuffle import Table


def column_chunks(source: ColumnSource, with_row_ids: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """``(columns, rows_are_tuples)`` per batch of the source's next pass (plus ``ROW_IDS`` if asked)."""
    for batch in source.column_batches():
        columns = dict(batch.columns)
        if with_row_ids:
            row_ids = batch.row_ids
            columns[ROW_IDS] = row_ids if row_ids is not None else np.full(batch.num_rows, -1, np.int64)
        yield columns, batch.rows_are_tuples


def finish_batch(batch: Table, forms: TorchForms, device: Any) -> dict[str, Any]:
    """The tensors of a batched loader's batch: plain columns as they are, nested ones in their forms."""
    tensors: dict[str, Any] = {}
    for name, values in batch.items():
        if name == ROW_IDS:
            continue
        if is_nested(values):
            forms.finish(name, values, tensors)
            if device.type != 'cpu':
                for key in [name, name + VALID_SUFFIX, name + MASK_SUFFIX]:
                    if key in tensors:
                        tensors[key] = _to_device(tensors[key], device)
        else:
            tensors[name] = batch_tensor(values)
    return tensors


def _to_device(value: Any, device: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value.to(device)


def batched_variable_length(variable_length: Any) -> VariableLength:
    if variable_length not in ('auto', 'jagged', 'nested', 'pad'):
        raise ValueError(f"variable_length must be 'auto', 'jagged', 'nested' or 'pad' in the batched loaders "
                         f"(per-row lists are petastorm.pytorch.DataLoader's 'list'), got {variable_length!r}")
    return variable_length  # type: ignore[no-any-return]


def loader_forms(loader: str, source: ColumnSource, variable_length: Any, padding_value: Any, nulls: Any,
                 tensors: bool, bool_to_uint8: bool = True) -> TorchForms:
    """The checked forms of a loader's columns (see :mod:`petastorm.pytorch._nested`)."""
    forms = TorchForms(source.info.schema, variable_length, padding_value, NullOption.of(nulls, source.info.schema),
                       bool_to_uint8)
    check_forms(loader, forms, tensors)
    return forms


def check_tensor_fields(loader: str, source: ColumnSource) -> None:
    """Refuse, before reading, fields whose schema type has no tensor (strings, Decimals, objects).

    A transform function may change a field's type without declaring it in ``edit_fields`` (a string field turned
    into an int): such fields are judged by the values it returns, in the first batch, not by the stored type.
    """
    import decimal

    fields = dict(source.info.schema.fields)
    spec = source.info.transform_spec
    if spec is not None and spec.func is not None:
        declared = {edit[0] for edit in spec.edit_fields}  # (name, dtype, shape[, nullable]) or a UnischemaField
        fields = {name: field for name, field in fields.items() if name in declared}
    bad = []
    for name, field in fields.items():
        dtype = field.numpy_dtype
        if dtype in (np.str_, np.bytes_, str, bytes, decimal.Decimal, object) or (
                isinstance(dtype, type) and issubclass(dtype, (np.str_, np.bytes_, decimal.Decimal))):
            bad.append((name, getattr(dtype, '__name__', dtype)))
    if bad:
        listed = ', '.join(f'{name} ({kind})' for name, kind in bad)
        raise TorchTypeError(f'{loader} makes tensors of every field and does not support string or Decimal fields: '
                             f'{listed}. Leave them out (schema_fields=... or TransformSpec(removed_fields=...)), read '
                             f'categories as integer codes (make_batch_reader(..., categorical_codes='
                             f'{[name for name, _ in bad]})), or use petastorm.pytorch.DataLoader, which collates '
                             f'them as lists.')


def batch_columns(loader: str, columns: dict[str, Any], transform_fn: Callable | None,
                  device: Any, forms: TorchForms, bool_to_uint8: bool = True) -> Table:
    """The columns of a chunk made ready for a batched loader.

    Dtypes are promoted as the original loaders did, nulls, times and lists as ``forms`` say, and ``transform_fn``
    (if any) makes a tensor of each plain column. On the CPU the result keeps numpy arrays (the reader's, or views
    of the tensors ``transform_fn`` made): the buffers work on them and tensors are made per batch. On another
    device every plain column becomes a tensor there; list, struct and masked columns stay numpy until a batch of
    them is finished.
    """
    out: Table = {}
    for name, column in prepare_columns(columns, forms, bool_to_uint8).items():
        if is_nested(column):
            out[name] = column
            continue
        if column.dtype == object:
            check_no_none(name, column)
            stacked = stack_values(list(column))
            if stacked is None:
                kinds = sorted({type(v).__name__ for v in column})
                raise TorchTypeError(f'{loader} cannot make a tensor of field {name!r}: its values are '
                                     f'{", ".join(kinds)} of different shapes or types (strings, Decimals and '
                                     f'variable-shape arrays need petastorm.pytorch.DataLoader)')
            column = as_numpy_view(stacked)
        elif column.dtype.kind in 'USMmV':
            raise TorchTypeError(f'{loader} cannot make a tensor of field {name!r} ({column.dtype}); '
                                 f'use petastorm.pytorch.DataLoader, which collates such fields as lists')
        value: Any = column
        if transform_fn is not None:
            if isinstance(column, np.ndarray) and not column.flags.writeable:
                column = np.array(column)  # so that a zero-copy transform gets memory torch may write
            value = transform_fn(column)
            if not isinstance(value, torch.Tensor):
                raise TorchTypeError(f'transform_fn must return a tensor, got {type(value).__name__} for field '
                                     f'{name!r}')
        if device.type == 'cpu':
            out[name] = as_numpy_view(value.cpu() if isinstance(value, torch.Tensor) else value)
        else:
            out[name] = (to_tensor(value) if isinstance(value, np.ndarray) else value).to(device)
    return out
