"""List, map and struct fields in TensorFlow: ``tf.RaggedTensor`` s and dicts, with their specs.

A field is *nested* for TensorFlow when it is stored natively (no codec, or ``ScalarCodec``) as a struct, a map,
or a list with a varying dimension (a shape with ``None``). The exception is a one-level list of scalars (shape
``(None,)``): a dense tensor as in Petastorm, unless the dataset is asked for ragged tensors
(``make_petastorm_dataset(reader, ragged=True)``).

* a list column becomes ``tf.RaggedTensor.from_nested_row_splits(values, splits)``: its offsets are the row
  splits of each list level down to the last varying one, the elements below (fixed-size lists, e.g. boxes of 4)
  the inner dense dimensions;
* a struct becomes a dict of its fields; a list of structs a dict of ragged fields sharing their row splits; a
  map ``{'key': ..., 'value': ...}``;
* leaf values convert as flat columns do (:func:`~petastorm.tf_utils._convert.column_for_tf`); a null anywhere
  stops the dataset with the error naming the field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.columns import ListColumn, MapColumn, MaskedColumn, StructColumn, leaf_validity
from petastorm.tf_utils._convert import column_for_tf, none_error
from petastorm.tf_utils._dtypes import tf_dtype_name
from petastorm.typemaps.scalars import numpy_type_of_arrow
from petastorm.unischema import UnischemaField, arrow_type_of_field


def _stored_type(field: UnischemaField) -> pa.DataType | None:
    from petastorm.codecs import ScalarCodec

    if field.codec is not None and not isinstance(field.codec, ScalarCodec):
        return None
    try:
        return arrow_type_of_field(field)
    except (ValueError, TypeError):
        return None


def _is_list(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)


def nested_type(field: UnischemaField, ragged: bool) -> pa.DataType | None:
    """The stored type of a field TensorFlow gets as ragged tensors or dicts, or None for a plain tensor field."""
    arrow_type = _stored_type(field)
    if arrow_type is None:
        return None
    if pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type):
        return arrow_type
    shape = tuple(field.shape)
    if not _is_list(arrow_type) or None not in shape:
        return None
    if shape == (None,) and field.numpy_dtype is not dict and not ragged:
        return None  # a one-level list of scalars: a dense tensor, as in Petastorm
    return arrow_type


def _levels(arrow_type: pa.DataType) -> tuple[list[int | None], pa.DataType]:
    """The list levels of a type (None: varying, else the fixed size) and the element type below them."""
    levels: list[int | None] = []
    while _is_list(arrow_type):
        levels.append(arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None)
        arrow_type = arrow_type.value_type
    return levels, arrow_type


def spec_of(arrow_type: pa.DataType, name: str) -> Any:
    """The ``tf.TypeSpec`` structure of one batch of values of ``arrow_type`` (imports TensorFlow).

    Raises:
        ValueError: a leaf type has no TensorFlow counterpart (the message names the field).
    """
    import tensorflow as tf

    return _spec(tf, arrow_type, (None,), 0, name)


def _spec(tf: Any, arrow_type: pa.DataType, outer: tuple[int | None, ...], splits: int, name: str) -> Any:
    """``outer``: the dimensions above (the batch's, and one per enclosing list); ``splits``: the row-split levels
    among them."""
    if pa.types.is_struct(arrow_type):
        return {arrow_type.field(i).name: _spec(tf, arrow_type.field(i).type, outer, splits,
                                                f'{name}.{arrow_type.field(i).name}')
                for i in range(arrow_type.num_fields)}
    if pa.types.is_map(arrow_type):
        return {'key': _spec(tf, arrow_type.key_type, outer + (None,), splits + 1, f'{name}.key'),
                'value': _spec(tf, arrow_type.item_type, outer + (None,), splits + 1, f'{name}.value')}
    levels, element = _levels(arrow_type)
    if pa.types.is_struct(element) or pa.types.is_map(element):
        return _spec(tf, element, outer + (None,) * len(levels), splits + len(levels), name)
    # Levels down to the last varying one are row splits; fixed-size lists below it are dense dimensions.
    varying = max((i + 1 for i, size in enumerate(levels) if size is None), default=0)
    dims = outer + tuple(None if i < varying else size for i, size in enumerate(levels))
    numpy_type = numpy_type_of_arrow(element)
    if numpy_type is None:
        raise ValueError(f'field {name!r} holds {element} values, which have no TensorFlow counterpart')
    dtype = getattr(tf, tf_dtype_name(np.int64 if numpy_type is np.timedelta64 else numpy_type))
    rank = splits + varying
    if not rank:
        return tf.TensorSpec(dims, dtype)
    return tf.RaggedTensorSpec(dims, dtype, ragged_rank=rank, row_splits_dtype=tf.int64)


def value_of(name: str, column: Any) -> Any:
    """The TensorFlow value of one batch's column of a nested field (ragged tensors and dicts).

    Raises:
        RuntimeError: the column holds a null (Petastorm's words, naming the field).
    """
    import tensorflow as tf

    return _value(tf, name, column, [])


def _value(tf: Any, name: str, column: Any, splits: list[np.ndarray]) -> Any:
    valid = leaf_validity(column)
    if valid is not None and not valid.all():
        raise none_error(name)
    if isinstance(column, StructColumn):
        return {child: _value(tf, f'{name}.{child}', values, splits) for child, values in column.items()}
    if isinstance(column, MapColumn):
        normalized = column.normalized()
        entries = normalized.values
        assert isinstance(entries, StructColumn)
        inner = [*splits, normalized.offsets]
        return {'key': _value(tf, f'{name}.key', entries['key'], inner),
                'value': _value(tf, f'{name}.value', entries['value'], inner)}
    if isinstance(column, ListColumn):
        normalized = column.normalized()
        return _value(tf, name, normalized.values, [*splits, normalized.offsets])
    if isinstance(column, MaskedColumn):
        column = column.values
    flat = column_for_tf(name, column.view(np.int64) if column.dtype.kind == 'm' else column)
    if not splits:
        return flat
    return tf.RaggedTensor.from_nested_row_splits(flat, [tf.constant(s, tf.int64) for s in splits],
                                                  validate=False)
