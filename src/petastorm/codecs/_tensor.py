"""Numeric n-d arrays stored as Apache Arrow's canonical tensor extension types, readable by any Arrow tool.

Layouts (``docs/tensors.md`` shows which tools read them):

* a fixed shape ``(d0, d1, ...)`` is an ``arrow.fixed_shape_tensor(value_type, shape)`` column: a
  ``fixed_size_list<value_type>[d0*d1*...]`` of the row-major values, no per-row header;
* a shape with ``None`` dimensions is an ``arrow.variable_shape_tensor`` column: a
  ``struct<data: list<value_type>, shape: fixed_size_list<int32>[ndim]>`` whose extension metadata names the
  dimensions that do not vary (``uniform_shape``). Tools without that extension type see the struct of lists.

Both decode a whole column into one ``(rows, *shape)`` array viewing the Arrow buffers (a copy only when the
stored value type differs from the field's). Columns written by Spark (a flat
``ArrayType`` in row-major order, or the struct above without extension metadata) and extension columns written
by other tools decode the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs._base import DataframeColumnCodec, _field_name, check_array
from petastorm.errors import CodecError, SchemaError
from petastorm.typemaps.scalars import numpy_type_of_arrow

FIXED_SHAPE_TENSOR = 'arrow.fixed_shape_tensor'
VARIABLE_SHAPE_TENSOR = 'arrow.variable_shape_tensor'

# Numpy types a tensor may hold: fixed-width numbers Arrow and every reading tool have a type for.
_NUMERIC_KINDS = 'iuf'
# The most values one variable-shape array holds: its list offsets are 32-bit.
_MAX_LIST_VALUES = 2**31 - 1


class VariableShapeTensorType(pa.ExtensionType):
    """``arrow.variable_shape_tensor`` as pyarrow builds it for writing (its reader is pyarrow's own C++ type).

    Args:
        value_type: the Arrow type of the elements.
        uniform_shape: one entry per dimension: its size when every row has it, else None.
    """

    def __init__(self, value_type: pa.DataType, uniform_shape: Sequence[int | None]) -> None:
        self._value_type = value_type
        self._uniform_shape = tuple(uniform_shape)
        storage = pa.struct([pa.field('data', pa.list_(value_type)),
                             pa.field('shape', pa.list_(pa.int32(), len(self._uniform_shape)))])
        super().__init__(storage, VARIABLE_SHAPE_TENSOR)

    @property
    def uniform_shape(self) -> tuple[int | None, ...]:
        """The size of each dimension that every row shares (None where rows differ)."""
        return self._uniform_shape

    def __arrow_ext_serialize__(self) -> bytes:
        if all(d is None for d in self._uniform_shape):
            return b'{}'  # pyarrow's reader wants a JSON object, even an empty one
        return json.dumps({'uniform_shape': list(self._uniform_shape)}).encode()

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> VariableShapeTensorType:
        ndim = storage_type.field('shape').type.list_size
        uniform = json.loads(serialized).get('uniform_shape') if serialized else None
        return cls(storage_type.field('data').type.value_type, uniform or [None] * ndim)


def _numeric_dtype(field: Any) -> np.dtype:
    try:
        dtype = np.dtype(field.numpy_dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _NUMERIC_KINDS:
        raise SchemaError(f'field {_field_name(field)}: ArrowTensorCodec stores integer and floating-point '
                          f'arrays, got numpy_dtype {field.numpy_dtype!r}; use NdarrayCodec() for other types')
    return dtype


def _tensor_shape(field: Any) -> tuple[int | None, ...]:
    shape = tuple(field.shape)
    if not shape:
        raise SchemaError(f'field {_field_name(field)}: ArrowTensorCodec needs a shape with at least one '
                          f'dimension, got (); store scalars without a codec or with ScalarCodec')
    return shape


def _single_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _values_view(values: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The numbers of a null-free numeric Arrow array as numpy (a read-only view when the types agree)."""
    if values.null_count:
        raise CodecError(f'tensor elements must not be null, found {values.null_count} null elements')
    arrow_type = values.type
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        stored = np.dtype(arrow_type.to_pandas_dtype())
        view = np.frombuffer(values.buffers()[1], dtype=stored, count=len(values),
                             offset=values.offset * stored.itemsize)
        view.flags.writeable = False  # the memory belongs to Arrow
    else:
        view = values.to_numpy(zero_copy_only=False)
    return view if view.dtype == dtype else view.astype(dtype)


def _list_values(lists: pa.Array) -> pa.Array:
    """The child values that the (possibly sliced) list array's rows cover, nulls included."""
    if pa.types.is_fixed_size_list(lists.type):
        size = lists.type.list_size
        return lists.values.slice(lists.offset * size, len(lists) * size)
    offsets = lists.offsets
    first, last = offsets[0].as_py(), offsets[len(lists)].as_py()
    return lists.values.slice(first, last - first)


def _list_bounds(lists: pa.Array) -> np.ndarray:
    """Start offsets of each row in :func:`_list_values`, plus the end (``len(lists) + 1`` entries)."""
    if pa.types.is_fixed_size_list(lists.type):
        return np.arange(len(lists) + 1, dtype=np.int64) * lists.type.list_size
    offsets = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    return offsets - offsets[0]


def _with_nulls(dense: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """An object column holding each valid row's array (a view of ``dense``) and None for the null rows."""
    out = np.empty(len(valid), dtype=object)
    for i in np.flatnonzero(valid):
        out[i] = dense[i]
    return out


def _validity(array: pa.Array) -> np.ndarray | None:
    if not array.null_count:
        return None
    return array.is_valid().to_numpy(zero_copy_only=False)


class ArrowTensorCodec(DataframeColumnCodec):
    """Stores numeric arrays as Arrow tensor extension columns that Arrow-based tools read as tensors.

    The field's shape picks the layout: fixed dimensions give ``arrow.fixed_shape_tensor``, any ``None``
    dimension gives ``arrow.variable_shape_tensor``. Nullable fields store null tensors. Petastorm 0.13.1 cannot
    decode these columns: keep :class:`NdarrayCodec` for datasets that it must read.

    Example::

        UnischemaField('image', np.uint8, (28, 28), ArrowTensorCodec(), False)
    """

    codec_name = 'arrow_tensor'

    def encode(self, unischema_field: Any, value: Any) -> Any:
        """The row as Spark stores it: the flat row-major values, plus the shape for variable shapes."""
        array = self.check_value(unischema_field, value)
        if None not in _tensor_shape(unischema_field):
            return array.ravel().tolist()
        return {'data': array.ravel().tolist(), 'shape': list(array.shape)}

    def check_value(self, unischema_field: Any, value: Any) -> np.ndarray:
        """``value`` checked against the field (an ndarray of its dtype and shape), row-major."""
        _numeric_dtype(unischema_field)
        _tensor_shape(unischema_field)
        return np.ascontiguousarray(check_array(unischema_field, value))

    def encode_column(self, unischema_field: Any, values: Sequence[np.ndarray | None]) -> pa.Array | pa.ChunkedArray:
        """One Arrow column of the checked values (see :meth:`check_value`); None values are null tensors.

        A variable-shape column addresses its values with 32-bit offsets, so one array holds at most
        ``2**31 - 1`` values: a run of rows holding more is returned as a ``ChunkedArray`` of several arrays.

        Raises:
            SchemaError: one variable-shape tensor alone holds more values than an array can address.
        """
        arrow_type = self.arrow_type(unischema_field)
        dtype = _numeric_dtype(unischema_field)
        if isinstance(arrow_type, VariableShapeTensorType):
            return _variable_shape_column(unischema_field, arrow_type, dtype, values, _MAX_LIST_VALUES)
        return _fixed_shape_column(arrow_type, dtype, values)

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        """One stored row (a flat list of values, or ``{'data': ..., 'shape': ...}``) as an ndarray."""
        dtype = _numeric_dtype(unischema_field)
        if isinstance(value, dict):
            return np.asarray(value['data'], dtype=dtype).reshape(value['shape'])
        return np.asarray(value, dtype=dtype).reshape(_tensor_shape(unischema_field))

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Decode a whole column: ``(rows, *shape)`` when no row is null and every row has one shape.

        Otherwise a 1-d object array holding each row's array (views of the column's values) or None.
        """
        dtype = _numeric_dtype(unischema_field)
        array = _single_chunk(column)
        extension = array.type if isinstance(array.type, pa.BaseExtensionType) else None
        storage = array.storage if extension is not None else array
        if pa.types.is_struct(storage.type):
            return self._decode_variable(unischema_field, storage, dtype)
        if not (pa.types.is_fixed_size_list(storage.type) or pa.types.is_list(storage.type)
                or pa.types.is_large_list(storage.type)):
            raise CodecError(f'field {_field_name(unischema_field)}: expected a tensor column (an Arrow tensor '
                             f'extension type, a list or a struct of data and shape), got Arrow type {array.type}')
        shape = _stored_shape(unischema_field, extension)
        size = int(np.prod(shape))
        n = len(storage)
        bounds = _list_bounds(storage)
        valid = _validity(storage)
        lengths = np.diff(bounds)
        if valid is not None:
            lengths = lengths[valid]
        if (lengths != size).any():
            raise CodecError(f'field {_field_name(unischema_field)}: stored rows hold {sorted(set(lengths.tolist()))} '
                             f'values; the shape {shape} needs {size}')
        values = _list_values(storage)
        if valid is not None and not pa.types.is_fixed_size_list(storage.type):
            # Null rows of a variable list take no values: place the present rows at their row index.
            dense = np.zeros((n, size), dtype=dtype)
            dense[valid] = _values_view(values, dtype).reshape(-1, size)
        else:
            if valid is not None and values.null_count:
                values = values.fill_null(0)  # the slots behind null rows may hold nulls; they are not read
            dense = _values_view(values, dtype).reshape(n, size)
        tensors = dense.reshape((n, *shape))
        return tensors if valid is None else _with_nulls(tensors, valid)

    def _decode_variable(self, field: Any, storage: pa.StructArray, dtype: np.dtype) -> np.ndarray:
        names = {storage.type.field(i).name for i in range(storage.type.num_fields)}
        if not {'data', 'shape'} <= names:
            raise CodecError(f'field {_field_name(field)}: a variable-shape tensor column is a struct of "data" '
                             f'and "shape", got Arrow type {storage.type}')
        data = storage.field('data')
        shapes = storage.field('shape')
        if isinstance(data, pa.ChunkedArray):
            data = data.combine_chunks()
        n = len(storage)
        valid = _validity(storage)
        ndim = len(_tensor_shape(field))
        shape_values = _values_view(_list_values(shapes.fill_null([0] * ndim) if shapes.null_count else shapes),
                                    np.dtype(np.int64))
        if len(shape_values) != n * ndim:
            raise CodecError(f'field {_field_name(field)}: stored shapes do not all have {ndim} dimensions')
        row_shapes = shape_values.reshape(n, ndim)
        flat = _values_view(_list_values(data), dtype)
        bounds = _list_bounds(data)
        present = np.ones(n, dtype=bool) if valid is None else valid
        sizes = np.prod(row_shapes, axis=1)
        if (sizes[present] != np.diff(bounds)[present]).any():
            raise CodecError(f'field {_field_name(field)}: a stored row holds a number of values that does not '
                             f'match its shape')
        for row_shape in row_shapes[present][:1]:
            if not _matches(tuple(field.shape), tuple(int(d) for d in row_shape)):
                raise CodecError(f'field {_field_name(field)}: a stored tensor has shape {tuple(row_shape)}; the '
                                 f'schema expects {tuple(field.shape)}')
        if valid is None and n and (row_shapes == row_shapes[0]).all():
            return flat.reshape((n, *(int(d) for d in row_shapes[0])))
        out = np.empty(n, dtype=object)
        for i in np.flatnonzero(present):
            row_shape = tuple(int(d) for d in row_shapes[i])
            if not _matches(tuple(field.shape), row_shape):
                raise CodecError(f'field {_field_name(field)}: a stored tensor has shape {row_shape}; the schema '
                                 f'expects {tuple(field.shape)}')
            out[i] = flat[bounds[i]:bounds[i + 1]].reshape(row_shape)
        return out

    def arrow_type(self, unischema_field: Any = None) -> pa.DataType:
        """The extension type storing ``unischema_field`` (the type depends on the field's dtype and shape)."""
        if unischema_field is None:
            raise SchemaError('ArrowTensorCodec.arrow_type() needs the field: its type follows the field\'s dtype '
                              'and shape (use petastorm.unischema.arrow_type_of_field(field))')
        value_type = pa.from_numpy_dtype(_numeric_dtype(unischema_field))
        shape = _tensor_shape(unischema_field)
        if None in shape:
            return VariableShapeTensorType(value_type, shape)
        if 0 in shape:
            raise SchemaError(f'field {_field_name(unischema_field)}: the fixed shape {shape} holds no values, '
                              f'which an Arrow fixed_shape_tensor cannot store; mark the dimensions that can be 0 '
                              f'as None (a variable_shape_tensor column)')
        return pa.fixed_shape_tensor(value_type, list(shape))

    def spark_dtype(self, unischema_field: Any = None) -> Any:
        """A flat ``ArrayType`` of the row-major values; for variable shapes a struct of it and the shape."""
        from petastorm._optional import import_optional
        from petastorm.typemaps.spark import spark_type_from_arrow

        types = import_optional('pyspark.sql.types', 'ArrowTensorCodec.spark_dtype()')
        if unischema_field is None:
            raise SchemaError('ArrowTensorCodec.spark_dtype() needs the field: its type follows the field\'s dtype '
                              'and shape (use Unischema.as_spark_schema())')
        dtype = _numeric_dtype(unischema_field)
        if dtype == np.uint64:
            raise SchemaError(f'field {_field_name(unischema_field)}: Spark has no type holding uint64 values; '
                              f'write this field without Spark or choose int64')
        element = spark_type_from_arrow(pa.float32() if dtype == np.float16 else pa.from_numpy_dtype(dtype), types)
        data = types.ArrayType(element, containsNull=False)
        if None not in _tensor_shape(unischema_field):
            return data
        return types.StructType([types.StructField('data', data, False),
                                 types.StructField('shape', types.ArrayType(types.IntegerType(), False), False)])

    @staticmethod
    def field_type_of_column(arrow_type: pa.DataType, metadata: Mapping[bytes, bytes] | None = None,
                             ) -> tuple[Any, tuple[int | None, ...]] | None:
        """The numpy type and shape of the field this codec decodes a column of ``arrow_type`` into.

        Args:
            arrow_type: the Arrow type of a stored column.
            metadata: the stored field's metadata. pyarrow before 24 has no ``arrow.variable_shape_tensor`` type: it
                reads one as its storage struct and leaves the extension's name and parameters there.

        Returns:
            ``(numpy scalar type, shape)`` for an Arrow tensor extension type (``arrow.fixed_shape_tensor``,
            ``arrow.variable_shape_tensor``) of numbers, with ``None`` for each dimension that varies; None for
            any other type.
        """
        arrow_type = _variable_shape_tensor_in_storage(arrow_type, metadata or {}) or arrow_type
        name = getattr(arrow_type, 'extension_name', None)
        shape: tuple[int | None, ...]
        if name == FIXED_SHAPE_TENSOR:
            value_type, shape = arrow_type.value_type, tuple(int(d) for d in arrow_type.shape)
        elif name == VARIABLE_SHAPE_TENSOR:
            storage = arrow_type.storage_type
            value_type = storage.field('data').type.value_type
            # pyarrow's own type does not expose the uniform_shape metadata: every dimension is taken as free.
            shape = arrow_type.uniform_shape if isinstance(arrow_type, VariableShapeTensorType) else \
                (None,) * storage.field('shape').type.list_size
        else:
            return None
        numpy_type = numpy_type_of_arrow(value_type)
        if numpy_type is None or np.dtype(numpy_type).kind not in _NUMERIC_KINDS:
            return None
        return numpy_type, shape

    def __str__(self) -> str:
        return 'ArrowTensorCodec()'


def _variable_shape_tensor_in_storage(arrow_type: pa.DataType, metadata: Mapping[bytes, bytes],
                                      ) -> VariableShapeTensorType | None:
    """The variable_shape_tensor type that a field's metadata names over its storage struct, else None."""
    if metadata.get(b'ARROW:extension:name') != VARIABLE_SHAPE_TENSOR.encode() or not pa.types.is_struct(arrow_type):
        return None
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    if names != ['data', 'shape'] or not pa.types.is_fixed_size_list(arrow_type.field('shape').type):
        return None
    # Every dimension free, as pyarrow's own type (24 and later) reads it: the schema does not depend on the version.
    ndim = arrow_type.field('shape').type.list_size
    return VariableShapeTensorType(arrow_type.field('data').type.value_type, [None] * ndim)


def _fixed_shape_column(arrow_type: pa.FixedShapeTensorType, dtype: np.dtype,
                        values: Sequence[np.ndarray | None]) -> pa.Array:
    """A ``fixed_shape_tensor`` array of the values (None: a null row); a fixed-size list has no offsets to outgrow."""
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    present = [v.reshape(-1) for v in values if v is not None]
    flat = np.concatenate(present) if present else np.empty(0, dtype)
    size = int(np.prod(arrow_type.shape))
    mask = None
    if not valid.all():  # null rows keep their slots in a fixed-size list: fill them with zeros
        full = np.zeros((len(values), size), dtype=dtype)
        full[valid] = flat.reshape(-1, size)
        flat = full.reshape(-1)
        mask = pa.array(~valid)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=arrow_type.value_type), size, mask=mask)
    return pa.ExtensionArray.from_storage(arrow_type, storage)


def _variable_shape_column(field: Any, arrow_type: VariableShapeTensorType, dtype: np.dtype,
                           values: Sequence[np.ndarray | None], max_values: int) -> pa.Array | pa.ChunkedArray:
    """A ``variable_shape_tensor`` column of the values, in arrays of at most ``max_values`` values each.

    Raises:
        SchemaError: one tensor holds more than ``max_values`` values.
    """
    sizes = np.fromiter((0 if v is None else v.size for v in values), dtype=np.int64, count=len(values))
    oversized = np.flatnonzero(sizes > max_values)
    if oversized.size:
        row = int(oversized[0])
        raise SchemaError(f'field {_field_name(field)}: the tensor of row {row} holds {int(sizes[row])} values; a '
                          f'variable-shape tensor holds at most {max_values} (its Arrow list offsets are 32-bit). '
                          f'Give the field a fixed shape or store it with NdarrayCodec()')
    if not len(values):
        return _variable_shape_array(arrow_type, dtype, values, sizes)
    ends = np.cumsum(sizes)
    chunks = []
    start = 0
    while start < len(values):
        before = int(ends[start - 1]) if start else 0
        # The longest run of rows from ``start`` whose values fit: never empty, as every row fits alone.
        stop = int(np.searchsorted(ends, before + max_values, side='right'))
        chunks.append(_variable_shape_array(arrow_type, dtype, values[start:stop], sizes[start:stop]))
        start = stop
    return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, type=arrow_type)


def _variable_shape_array(arrow_type: VariableShapeTensorType, dtype: np.dtype, values: Sequence[np.ndarray | None],
                          sizes: np.ndarray) -> pa.Array:
    """One ``variable_shape_tensor`` array of values that together hold fewer than ``2**31`` values."""
    ndim = len(arrow_type.uniform_shape)
    present = [v.reshape(-1) for v in values if v is not None]
    flat = np.concatenate(present) if present else np.empty(0, dtype)
    data = pa.array(flat, type=arrow_type.storage_type.field('data').type.value_type)
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32), type=pa.int32())
    shapes = np.array([(0,) * ndim if v is None else v.shape for v in values], dtype=np.int32).reshape(-1)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    mask = None if valid.all() else pa.array(~valid)
    storage = pa.StructArray.from_arrays(
        [pa.ListArray.from_arrays(offsets, data), pa.FixedSizeListArray.from_arrays(pa.array(shapes), ndim)],
        fields=list(arrow_type.storage_type), mask=mask)
    return pa.ExtensionArray.from_storage(arrow_type, storage)


def _matches(expected: tuple, actual: tuple) -> bool:
    return len(expected) == len(actual) and all(e is None or e == a for e, a in zip(expected, actual, strict=True))


def _stored_shape(field: Any, extension: pa.DataType | None) -> tuple[int, ...]:
    """The shape of a fixed-shape column's rows, checked against the field.

    Raises:
        CodecError: the shape differs from the field's, or the column stores its dimensions permuted (pyarrow
            itself does not read those back consistently, so they are refused rather than guessed).
    """
    expected = _tensor_shape(field)
    if isinstance(extension, pa.FixedShapeTensorType):
        shape = tuple(int(d) for d in extension.shape)
        permutation = extension.permutation
        if permutation is not None and list(permutation) != list(range(len(shape))):
            raise CodecError(f'field {_field_name(field)}: the tensors are stored with the dimension permutation '
                             f'{list(permutation)}; only row-major tensors are read (rewrite the column from '
                             f'C-contiguous arrays)')
        if not _matches(expected, shape):
            raise CodecError(f'field {_field_name(field)}: the stored tensors have shape {shape}; the schema '
                             f'expects {expected}')
        return shape
    fixed = tuple(d for d in expected if d is not None)
    if len(fixed) != len(expected):
        raise CodecError(f'field {_field_name(field)}: a column of flat lists holds fixed-shape tensors, but the '
                         f'schema shape {expected} has free dimensions')
    return fixed
