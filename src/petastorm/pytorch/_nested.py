"""Nested, ragged, null and time columns made into torch batches: the forms each loader delivers.

Two steps, so that every chunk of a field has one layout in the loaders' buffers:

1. :meth:`TorchForms.prepare` (once per row group, before any buffer): nulls are handled as the ``nulls`` option
   says (refused with Petastorm's error, filled, or kept as masks on every level the stored type allows nulls at),
   times become int64 counts of their unit since the epoch, small unsigned and bool values are promoted as
   Petastorm did, and arrays of different lengths (a variable first dimension) become list columns;
2. :meth:`TorchForms.finish` (once per batch): the batch's columns become tensors: a list column as a
   :class:`JaggedTensor`, a ``torch.nested`` jagged tensor, a padded tensor with a mask, or a list of per-row
   tensors (``variable_length``); a struct as a dict; a mask as a ``'<name>_valid'`` bool tensor beside the values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa

from petastorm.codecs import ScalarCodec
from petastorm.columns import ListColumn, MapColumn, MaskedColumn, StructColumn, is_nested, num_rows, row_values
from petastorm.errors import MissingDependencyError
from petastorm.pytorch._tensors import TorchTypeError, promote_dtype, to_tensor, torch
from petastorm.unischema import Unischema, UnischemaField, arrow_type_of_field

VariableLength = Literal['list', 'pad', 'jagged', 'nested', 'auto']
VARIABLE_LENGTHS = ('list', 'pad', 'jagged', 'nested', 'auto')
#: Key suffix of the bool tensor saying which values are not null (``nulls='mask'``).
VALID_SUFFIX = '_valid'
#: Key suffix of the bool tensor marking the real (not padding) elements (``variable_length='pad'``).
MASK_SUFFIX = '_mask'
NULLS_HELP = ("pass nulls='mask' to the loader (values plus a '<field>_valid' bool tensor), nulls=<fill value> "
              "(e.g. nulls=0), or nulls={'<field>': 'mask' or a fill value} per field ('*': every other field)")


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


Policy = Any  # None (refuse), 'mask', or ('fill', value)


def _check_policy(name: str, value: Any) -> Policy:
    if value is None:
        return None
    if isinstance(value, str):
        if value != 'mask':
            raise ValueError(f"nulls for {name}: expected 'mask', a fill value or None, got {value!r}")
        return 'mask'
    if isinstance(value, (bool, int, float, np.generic)):
        return ('fill', value)
    raise ValueError(f"nulls for {name}: expected 'mask', a number to fill in, or None, got {value!r}")


@dataclass(frozen=True)
class NullOption:
    """The loaders' ``nulls`` argument, checked: what to do with the nulls of each field.

    Attributes:
        default: the policy of fields not named (None: refuse, 'mask', or ('fill', value)).
        by_field: policies by field name, struct leaf path (``'st.a'``) or list elements (``'ids[]'``).
    """

    default: Policy = None
    by_field: Mapping[str, Policy] = field(default_factory=dict)

    @classmethod
    def of(cls, nulls: Any, schema: Unischema) -> NullOption:
        """Check the ``nulls`` argument of a loader against its reader's schema.

        Raises:
            ValueError: an unknown policy, or a field name the schema does not have.
        """
        if isinstance(nulls, Mapping):
            unknown = [key for key in nulls if key != '*' and str(key).split('.')[0].split('[')[0] not in
                       schema.fields]
            if unknown:
                raise ValueError(f'nulls names {unknown}, which are not fields of the reader (fields: '
                                 f'{", ".join(schema.fields)})')
            return cls(_check_policy('every other field', nulls.get('*')),
                       {str(key): _check_policy(str(key), value) for key, value in nulls.items() if key != '*'})
        return cls(_check_policy('every field', nulls))

    def policy(self, path: str) -> Policy:
        """The policy of a field, struct leaf or list elements (``'ids[]'``).

        A field or leaf takes its own, else its nearest enclosing struct's, else the default. The elements of a
        list are masked only when named (``{'ids[]': 'mask'}``), so that ``nulls='mask'`` does not give every list
        a mask of its elements; a fill value given for every field fills them too.
        """
        if path.endswith('[]'):
            if path in self.by_field:
                return self.by_field[path]
            return self.default if isinstance(self.default, tuple) else None
        parts = path.split('.')
        for cut in range(len(parts), 0, -1):
            key = '.'.join(parts[:cut])
            if key in self.by_field:
                return self.by_field[key]
        return self.default


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
            return _dense_lists(name, prepared)
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
                raise _null_error(path)
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
            raise _null_error(path)
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


def _null_error(path: str) -> TorchTypeError:
    # The first sentence is the original's.
    if path.endswith('[]') or '[].' in path:
        return TorchTypeError(f"Pytorch does not support nullable fields. Found None in {path} (an element of a "
                              f"list); pass nulls={{'{path}': 'mask'}} (values plus a bool tensor of the elements, "
                              f"JaggedTensor.values_valid) or nulls={{'{path}': <fill value>}}")
    return TorchTypeError(f'Pytorch does not support nullable fields. Found None in {path}; {NULLS_HELP}')


def _dense_lists(name: str, column: ListColumn) -> Any:
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


