"""Torch batches of the loaders turned back into rows, to compare with pyarrow's rows."""

from __future__ import annotations

import torch

from petastorm.pytorch import JaggedTensor

#: Whether this torch makes jagged nested tensors (``variable_length='nested'``): torch 2.4 and later.
JAGGED_NESTED = hasattr(torch.nested, 'nested_tensor_from_jagged')


def tensor_rows(value, valid=None):
    """The rows of one batch entry in the loaders' forms."""
    if isinstance(value, JaggedTensor):
        inner = tensor_rows(value.values, value.values_valid)
        keys = {k for k in value.values if not k.endswith('_valid')} if isinstance(value.values, dict) else set()
        if keys == {'key', 'value'}:  # a map: (key, value) pairs
            inner = [(entry['key'], entry['value']) for entry in inner]
        bounds = value.offsets.tolist()
        rows = [inner[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
    elif isinstance(value, dict):
        fields = {name: tensor_rows(child, value.get(name + '_valid')) for name, child in value.items()
                  if not name.endswith('_valid')}
        count = len(next(iter(fields.values())))
        rows = [{name: column[i] for name, column in fields.items()} for i in range(count)]
    elif isinstance(value, torch.Tensor) and value.is_nested:
        rows = [row.tolist() for row in value.unbind()]
    elif isinstance(value, torch.Tensor):
        rows = value.tolist()
    else:
        rows = [_plain_row(v) for v in value]
    if valid is not None:
        rows = [row if ok else None for row, ok in zip(rows, valid.tolist(), strict=True)]
    return rows


def _plain_row(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, list):
        return [_plain_row(v) for v in value]
    return value


def torch_batch_rows(batch):
    columns = {name: tensor_rows(value, batch.get(name + '_valid')) for name, value in batch.items()
               if not name.endswith(('_valid', '_mask'))}
    count = len(next(iter(columns.values())))
    return [{name: column[i] for name, column in columns.items()} for i in range(count)]
