"""Nested, ragged, null and time columns made into torch batches: the forms each loader delivers.

Two steps, so that every chunk of a field has one layout in the loaders' buffers:

1. :meth:`TorchForms.prepare` (once per row group, before any buffer): nulls are handled as the ``nulls`` option
   says (refused with Petastorm's error, filled, or kept as masks on every level the stored type allows nulls at),
   times become int64 counts of their unit since the epoch, small unsigned and bool values are promoted as
   Petastorm did, and arrays of different lengths (a variable first dimension) become list columns;
2. :meth:`TorchForms.finish` (once per batch): the batch's columns become tensors: a list column as a
   :class:`JaggedTensor`, a ``torch.nested`` jagged tensor, a padded tensor with a mask, or a list of per-row
   tensors (``variable_length``); a struct as a dict; a mask as a ``'<name>_valid'`` bool tensor beside the values.

The ``nulls`` option is checked in :mod:`petastorm.pytorch._nulls`; the forms of list columns (``JaggedTensor``,
padding) live in :mod:`petastorm.pytorch._ragged`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs import ScalarCodec
from petastorm.columns import ListColumn, MapColumn, MaskedColumn, StructColumn, is_nested, num_rows, row_values
from petastorm.errors import MissingDependencyError
from petastorm.pytorch._nulls import VALID_SUFFIX, NullOption, Policy, null_error
from petastorm.pytorch._ragged import MASK_SUFFIX, JaggedTensor, VariableLength, dense_lists, pad_list
from petastorm.pytorch._tensors import TorchTypeError, promote_dtype, to_tensor, torch
from petastorm.unischema import Unischema, UnischemaField, arrow_type_of_field


@dataclass(frozen=True)
class TorchForms:
    """How one loader makes tensors of its reader's fields.

    Attributes:
        schema: the reader's schema (field nullability and stored types decide the layouts).
        variable_length: the form of list columns (see the loaders' ``variable_length``).
        padding_value: what ``'pad'`` fills in.
        nulls: the checked ``nulls`` option.
        bool_to_uint8: bool values become uint8, as in Petastorm (the loaders' ``bool_dtype=torch.uint8``).
    """

    schema: Unischema
    variable_length: VariableLength
    padding_value: Any
    nulls: NullOption
    bool_to_uint8: bool = True

    # -- 1. per row group ----------------------------------------------------------------------------------------

    def prepare(self, name: str, column: Any) -> Any:
        """One decoded column in the layout the buffers hold for this field (see the module doc).

        Raises:
            TorchTypeError: a null where the ``nulls`` option refuses them (Petastorm's message, plus the option).
        """
        stored = self.schema.fields.get(name)
        arrow_type = _arrow_type(stored)
        nullable = bool(stored.nullable) if stored is not None else True
        if isinstance(column, np.ndarray) and column.dtype == object:
            column = _masked_scalars(column)  # rows of a row reader: None among scalars
        if isinstance(column, np.ndarray) and column.dtype == object and self.variable_length != 'list':
            column = _list_of_arrays(column)
        if not is_nested(column) and not (nullable and self.nulls.policy(name) == 'mask'):
            return _leaf_array(column, self.bool_to_uint8)
        prepared = self._prepare(name, column, arrow_type, nullable)
        if self.variable_length == 'auto' and stored is not None and tuple(stored.shape) == (None,) and \
                isinstance(prepared, ListColumn) and not isinstance(prepared, MapColumn):
            return dense_lists(name, prepared)
        return prepared

    def _prepare(self, path: str, column: Any, arrow_type: pa.DataType | None, nullable: bool) -> Any:
        policy = self.nulls.policy(path)
        keep_mask = nullable and policy == 'mask'
        if isinstance(column, StructColumn):
            valid = self._row_validity(path, column.valid, policy, keep_mask, num_rows(column))
            types = _struct_children(arrow_type)
            fields = {}
            for name, child in column.items():
                child_type, child_nullable = types.get(name, (None, True))
                # Leaves of list elements are named below the elements: 'objects[].score'.
                fields[name] = self._prepare(f'{path}.{name}', child, child_type, child_nullable)
            return StructColumn(fields, column.num_rows, valid)
        if isinstance(column, ListColumn):
            valid = self._row_validity(path, column.valid, policy, keep_mask, len(column))
            normalized = column.normalized()
            element_type, element_nullable = _element_of(arrow_type)
            values = self._prepare(f'{path}[]', normalized.values, element_type, element_nullable)
            return type(column)(values, normalized.offsets, valid)
        if isinstance(column, MaskedColumn):
            if policy is None:
                raise null_error(path)
            if policy == 'mask':
                return MaskedColumn(_leaf_array(column.values, self.bool_to_uint8), column.valid)
            return _filled(path, column, policy[1], self.bool_to_uint8)
        array = _leaf_array(column, self.bool_to_uint8)
        if keep_mask:
            return MaskedColumn(array, np.ones(len(array), dtype=bool))
        return array

    def _row_validity(self, path: str, valid: np.ndarray | None, policy: Policy, keep_mask: bool,
                      rows: int) -> np.ndarray | None:
        if keep_mask:
            return np.ones(rows, dtype=bool) if valid is None else valid
        if valid is not None and not valid.all() and policy is None:
            raise null_error(path)
        return None  # a null list is empty; a null struct's fields are null themselves

    # -- 2. per batch --------------------------------------------------------------------------------------------

    def finish(self, name: str, column: Any, out: dict[str, Any], tensors: bool = True) -> None:
        """Put the batch form of column ``name`` into ``out`` (its mask, if any, under ``'<name>_valid'``).

        Args:
            name: the key of the column in ``out``.
            column: the batch's rows of a prepared column.
            out: the batch dict to fill.
            tensors: leave values torch has no tensor for (strings, Decimals) as lists (``DataLoader``).
        """
        if isinstance(column, MaskedColumn):
            out[name] = self._value(name, column.values, tensors)
            out[name + VALID_SUFFIX] = torch.from_numpy(np.ascontiguousarray(column.valid))
            return
        if isinstance(column, StructColumn):
            fields: dict[str, Any] = {}
            for child_name, child in column.items():
                self.finish(child_name, child, fields, tensors)
            out[name] = fields
            if column.valid is not None:
                out[name + VALID_SUFFIX] = torch.from_numpy(np.ascontiguousarray(column.valid))
            return
        if isinstance(column, ListColumn):
            if column.valid is not None:
                out[name + VALID_SUFFIX] = torch.from_numpy(np.ascontiguousarray(column.valid))
            self._list(name, column, out, tensors)
            return
        out[name] = self._value(name, column, tensors)

    def _value(self, name: str, array: np.ndarray, tensors: bool) -> Any:
        if array.dtype.kind in 'biufc':
            return to_tensor(array)
        if tensors:
            raise TorchTypeError(f'field {name!r} holds {array.dtype} values, which torch has no tensor for; leave '
                                 f'it out or use petastorm.pytorch.DataLoader, which collates them as lists')
        return list(array)

    def _list(self, name: str, column: ListColumn, out: dict[str, Any], tensors: bool) -> None:
        mode = self.variable_length
        if mode in ('jagged', 'auto'):
            out[name] = self._jagged(name, column, tensors)
        elif mode == 'nested':
            jagged = self._jagged(name, column, tensors)
            if not isinstance(jagged.values, torch.Tensor):
                raise TorchTypeError(f"field {name!r}: variable_length='nested' makes torch.nested tensors of one "
                                     f"level of numeric lists; this field holds lists of lists or structs. Use "
                                     f"variable_length='jagged'")
            out[name] = torch.nested.nested_tensor_from_jagged(jagged.values, jagged.offsets)
            if jagged.values_valid is not None:
                out[name + '_values' + VALID_SUFFIX] = jagged.values_valid
        elif mode == 'pad':
            padded, mask = pad_list(name, column, self.padding_value)
            out[name] = padded
            out[name + MASK_SUFFIX] = mask
        else:
            out[name] = self._rows(name, column, tensors)

    def _jagged(self, name: str, column: ListColumn, tensors: bool) -> JaggedTensor:
        normalized = column.normalized()
        offsets = torch.from_numpy(np.ascontiguousarray(normalized.offsets))
        values = normalized.values
        element_valid = None
        if isinstance(values, MaskedColumn):
            element_valid = torch.from_numpy(np.ascontiguousarray(values.valid))
            values = values.values
        elif isinstance(values, (ListColumn, StructColumn)) and values.valid is not None:
            element_valid = torch.from_numpy(np.ascontiguousarray(values.valid))
        if isinstance(values, ListColumn):
            inner: Any = self._jagged(name, values, tensors)
        elif isinstance(values, StructColumn):
            fields: dict[str, Any] = {}
            for child_name, child in values.items():
                self.finish(child_name, child, fields, tensors)
            inner = fields
        else:
            inner = self._value(name, values, tensors)
        return JaggedTensor(inner, offsets, element_valid)

    def _rows(self, name: str, column: ListColumn, tensors: bool) -> Any:
        """``variable_length='list'``: one tensor per row, or one stacked tensor when every row has one shape."""
        values = column.normalized().values
        if isinstance(values, np.ndarray) and not isinstance(column, MapColumn) and values.dtype.kind in 'biufc':
            lengths = column.lengths
            normalized = column.normalized()
            if len(lengths) and (lengths == lengths[0]).all():
                dense = values.reshape((len(lengths), int(lengths[0]), *values.shape[1:]))
                return to_tensor(dense)
            return [None if row is None else to_tensor(row) for row in row_values(normalized)]
        return [_row_tensor(value) for value in row_values(column)]


def _row_tensor(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind in 'biufc':
        return to_tensor(value)
    if isinstance(value, list):
        return [_row_tensor(v) for v in value]
    return value



def _arrow_type(stored: UnischemaField | None) -> pa.DataType | None:
    """The stored type of a natively stored field (no codec, or ``ScalarCodec``); None for codec fields."""
    if stored is None or (stored.codec is not None and not isinstance(stored.codec, ScalarCodec)):
        return None
    try:
        return arrow_type_of_field(stored)
    except (ValueError, TypeError):
        return None


def _struct_children(arrow_type: pa.DataType | None) -> dict[str, tuple[pa.DataType, bool]]:
    if arrow_type is None or not pa.types.is_struct(arrow_type):
        return {}
    return {arrow_type.field(i).name: (arrow_type.field(i).type, arrow_type.field(i).nullable)
            for i in range(arrow_type.num_fields)}


def _element_of(arrow_type: pa.DataType | None) -> tuple[pa.DataType | None, bool]:
    if arrow_type is None:
        return None, True
    if pa.types.is_map(arrow_type):
        return pa.struct([arrow_type.key_field, arrow_type.item_field]), False
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return arrow_type.value_type, arrow_type.value_field.nullable
    return None, True


def _leaf_array(column: Any, bool_to_uint8: bool = True) -> Any:
    """Numbers as the loaders deliver them: promoted as Petastorm did, times as int64 counts of their unit."""
    if isinstance(column, np.ndarray):
        if column.dtype.kind in 'Mm':
            return column.view(np.int64)
        if column.dtype.kind in 'biu':
            return promote_dtype(column, bool_to_uint8)
    return column


def _filled(path: str, column: MaskedColumn, value: Any, bool_to_uint8: bool = True) -> np.ndarray:
    values = _leaf_array(column.values, bool_to_uint8)
    if values.dtype.kind not in 'biufc':
        raise TorchTypeError(f'field {path!r}: nulls fill value {value!r} cannot stand in for {values.dtype} values')
    filled = np.array(values, copy=True)
    filled[~column.valid] = value
    return filled



def _masked_scalars(column: np.ndarray) -> Any:
    """An object column of numbers and Nones (rows of a row reader) as a masked column; else unchanged."""
    missing = np.fromiter((v is None for v in column), dtype=bool, count=len(column))
    if not missing.any() or missing.all():
        return column
    present = column[~missing]
    if not all(isinstance(v, (int, float, bool, np.number, np.bool_)) for v in present):
        return column
    values = np.zeros(len(column), dtype=np.asarray(list(present)).dtype)
    values[~missing] = list(present)
    return MaskedColumn(values, ~missing)


def _list_of_arrays(column: np.ndarray) -> Any:
    """An object column of arrays that differ only in their first dimension, as a list column; else unchanged."""
    arrays = [v for v in column if v is not None]
    if not arrays or not all(isinstance(v, np.ndarray) and v.ndim >= 1 for v in arrays):
        return column
    first = arrays[0]
    if any(v.dtype != first.dtype or v.shape[1:] != first.shape[1:] for v in arrays):
        return column
    lengths = np.array([0 if v is None else len(v) for v in column], dtype=np.int64)
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    valid = np.array([v is not None for v in column])
    return ListColumn(np.concatenate(arrays), offsets, None if valid.all() else valid)


def check_forms(loader: str, forms: TorchForms, tensors: bool) -> None:
    """Refuse, before reading, fields the chosen forms cannot deliver (named with the option to change).

    Raises:
        ValueError: ``variable_length='nested'`` for a field of lists of lists (or of structs).
        TorchTypeError: a struct leaf or list element of strings or Decimals in a loader that makes tensors only.
        MissingDependencyError: ``variable_length='nested'`` with a torch that has no jagged nested tensors.
    """
    for name, field_ in forms.schema.fields.items():
        arrow_type = _arrow_type(field_)
        shape = tuple(field_.shape or ())
        lists_of_lists = None in shape[1:] or (bool(shape) and field_.numpy_dtype is dict)
        if forms.variable_length == 'nested' and None in shape and lists_of_lists:
            raise ValueError(f"{loader}: field {name!r} holds lists of lists or structs (shape {shape}), too deep for "
                             f"variable_length='nested' (torch.nested jagged tensors have one ragged dimension); use "
                             f"variable_length='jagged'")
        if tensors and arrow_type is not None:
            for path, leaf in _leaves(name, arrow_type):
                if _is_text(leaf) and path != name:
                    raise TorchTypeError(f'{loader} makes tensors of every field, and {path!r} holds {leaf} values; '
                                         f'leave it out (schema_fields=...) or use petastorm.pytorch.DataLoader, '
                                         f'which collates them as lists')
    if forms.variable_length == 'nested' and not hasattr(torch.nested, 'nested_tensor_from_jagged'):
        raise MissingDependencyError(f"{loader}: variable_length='nested' makes jagged torch.nested tensors "
                                     f"(torch.nested.nested_tensor_from_jagged, torch 2.4 and later); torch "
                                     f"{torch.__version__} has none: upgrade torch, or use variable_length='jagged' "
                                     f"or 'pad'")


def _leaves(path: str, arrow_type: pa.DataType) -> list[tuple[str, pa.DataType]]:
    if pa.types.is_struct(arrow_type):
        return [leaf for i in range(arrow_type.num_fields)
                for leaf in _leaves(f'{path}.{arrow_type.field(i).name}', arrow_type.field(i).type)]
    if pa.types.is_map(arrow_type):
        return _leaves(f'{path}.key', arrow_type.key_type) + _leaves(f'{path}.value', arrow_type.item_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        inner = _leaves(path, arrow_type.value_type)
        return [(p if p != path else f'{path}[]', t) for p, t in inner]
    return [(path, arrow_type)]


def _is_text(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_binary(arrow_type)
            or pa.types.is_large_binary(arrow_type) or pa.types.is_decimal(arrow_type)
            or pa.types.is_fixed_size_binary(arrow_type))


