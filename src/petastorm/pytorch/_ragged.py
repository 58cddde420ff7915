"""The forms of list columns (a variable first dimension) in torch batches: jagged values and offsets, padded.

The loaders' ``variable_length`` option chooses among them (see :meth:`petastorm.pytorch._nested.TorchForms.finish`):
``'jagged'`` gives a :class:`JaggedTensor`, ``'pad'`` a padded tensor and a mask (:func:`pad_list`), ``'auto'`` a
dense ``(rows, length)`` array when every row has one length (:func:`dense_lists`), as Petastorm gave it.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import numpy as np

from petastorm.columns import ListColumn, MapColumn, MaskedColumn
from petastorm.pytorch._tensors import TorchTypeError, torch

VariableLength = Literal['list', 'pad', 'jagged', 'nested', 'auto']
VARIABLE_LENGTHS = ('list', 'pad', 'jagged', 'nested', 'auto')
#: Key suffix of the bool tensor marking the real (not padding) elements (``variable_length='pad'``).
MASK_SUFFIX = '_mask'


class JaggedTensor(NamedTuple):
    """A batch of lists: row ``i`` holds ``values[offsets[i]:offsets[i + 1]]``.

    ``values`` is a tensor of every row's elements one after the other (elements may have a fixed shape, e.g.
    ``(total, 4)`` boxes), a ``JaggedTensor`` for lists of lists, or a dict of them for lists of structs (maps:
    ``{'key': ..., 'value': ...}``); ``offsets`` an int64 tensor of ``rows + 1`` positions starting at 0, as
    TorchRec's ``JaggedTensor``/``KeyedJaggedTensor`` and ``torch.nested.nested_tensor_from_jagged`` take them.
    ``values_valid`` is a bool tensor per element when ``nulls='mask'`` and elements may be null, else None.
    """

    values: Any
    offsets: Any
    values_valid: Any = None

    @property
    def lengths(self) -> Any:
        """The number of elements of each row."""
        return self.offsets[1:] - self.offsets[:-1]

    def to(self, *args: Any, **kwargs: Any) -> JaggedTensor:
        """The same lists with every tensor moved (``tensor.to(*args, **kwargs)``)."""
        return JaggedTensor(_moved(self.values, args, kwargs), self.offsets.to(*args, **kwargs),
                            None if self.values_valid is None else self.values_valid.to(*args, **kwargs))


def _moved(value: Any, args: tuple, kwargs: dict) -> Any:
    if isinstance(value, dict):
        return {k: _moved(v, args, kwargs) for k, v in value.items()}
    return value.to(*args, **kwargs)


def pad_list(name: str, column: ListColumn, padding_value: Any) -> tuple[Any, Any]:
    """``(padded, mask)`` of a list column of any depth: ``(rows, longest, ..., *element shape)`` tensors.

    ``mask`` is True at the real elements that are not null.

    Raises:
        TorchTypeError: the lists hold structs, maps or values torch has no tensor for.
    """
    normalized = column.normalized()
    if _long_rows_of_numbers(normalized):
        return _pad_rows(normalized, padding_value)
    coordinates = [np.repeat(np.arange(len(normalized), dtype=np.int64), normalized.lengths)]
    positions = [np.arange(int(normalized.offsets[-1]), dtype=np.int64) - np.repeat(normalized.offsets[:-1],
                                                                                    normalized.lengths)]
    sizes = [int(normalized.lengths.max(initial=0))]
    leaf: Any = normalized.values
    while isinstance(leaf, ListColumn) and not isinstance(leaf, MapColumn):
        inner = leaf.normalized()
        parent = np.repeat(np.arange(len(inner), dtype=np.int64), inner.lengths)
        coordinates = [c[parent] for c in coordinates]
        positions = [p[parent] for p in positions]
        positions.append(np.arange(int(inner.offsets[-1]), dtype=np.int64) - np.repeat(inner.offsets[:-1],
                                                                                        inner.lengths))
        sizes.append(int(inner.lengths.max(initial=0)))
        leaf = inner.values
    valid = None
    if isinstance(leaf, MaskedColumn):
        valid, leaf = leaf.valid, leaf.values
    if not isinstance(leaf, np.ndarray) or leaf.dtype.kind not in 'biufc':
        raise TorchTypeError(f"field {name!r}: variable_length='pad' pads lists of numbers; this field's lists "
                             f"hold {type(leaf).__name__ if not isinstance(leaf, np.ndarray) else leaf.dtype}. Use "
                             f"variable_length='jagged' or 'list'")
    shape = (len(normalized), *sizes, *leaf.shape[1:])
    padded = np.full(shape, padding_value, dtype=leaf.dtype)
    mask = np.zeros(shape, dtype=bool)
    index = (coordinates[0], *positions)
    padded[index] = leaf
    mask[index] = True if valid is None else valid.reshape((-1,) + (1,) * (leaf.ndim - 1))
    return torch.from_numpy(padded), torch.from_numpy(mask)


def _long_rows_of_numbers(column: ListColumn) -> bool:
    """One level of lists of numbers, long enough on average (64 elements) that copying row by row is cheaper than
    indexing every element (audio clips, frames of videos)."""
    values = column.values
    return isinstance(values, np.ndarray) and values.dtype.kind in 'biufc' and not isinstance(column, MapColumn) \
        and len(values) >= 64 * len(column)


def _pad_rows(column: ListColumn, padding_value: Any) -> tuple[Any, Any]:
    """:func:`pad_list` of one level of lists of numbers, a row's elements copied at once."""
    values, lengths = column.values, column.lengths
    assert isinstance(values, np.ndarray)  # see _long_rows_of_numbers
    shape = (len(lengths), int(lengths.max(initial=0)), *values.shape[1:])
    padded = np.full(shape, padding_value, dtype=values.dtype)
    for row, (start, length) in enumerate(zip(column.offsets[:-1].tolist(), lengths.tolist(), strict=True)):
        padded[row, :length] = values[start:start + length]
    real = np.arange(shape[1]) < lengths[:, np.newaxis]
    mask = np.broadcast_to(real.reshape(real.shape + (1,) * (len(shape) - 2)), shape).copy()
    return torch.from_numpy(padded), torch.from_numpy(mask)


def dense_lists(name: str, column: ListColumn) -> Any:
    """``variable_length='auto'``: a one-level list field as one ``(rows, length)`` array, as Petastorm gave it.

    Raises:
        TorchTypeError: the rows differ in length (the message names the forms that take them).
    """
    normalized = column.normalized()
    lengths = normalized.lengths
    values = normalized.values
    if isinstance(values, np.ndarray) and len(lengths) and (lengths == lengths[0]).all():
        dense = values.reshape((len(lengths), int(lengths[0]), *values.shape[1:]))
        return dense if column.valid is None else MaskedColumn(dense, column.valid)
    if not len(lengths):
        return np.empty((0, 0), dtype=values.dtype) if isinstance(values, np.ndarray) else column
    raise TorchTypeError(f"field {name!r} holds lists of different lengths ({sorted(set(lengths.tolist()))[:4]}); a "
                         f"dense tensor needs one length per row. Pass variable_length='jagged' (values and offsets), "
                         f"'nested' (torch.nested) or 'pad' to the loader")
