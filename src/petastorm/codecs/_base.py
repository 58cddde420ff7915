"""The codec base class and the column helpers every codec shares (checks, payload access, stacking)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa

from petastorm._compat import array_of_values
from petastorm.errors import CodecError, SchemaError


def _field_name(field: Any) -> str:
    return getattr(field, 'name', None) or (field[0] if isinstance(field, tuple) else '<unnamed>')


def _shape_matches(expected: tuple, actual: tuple) -> bool:
    return len(expected) == len(actual) and all(e is None or e == a for e, a in zip(expected, actual, strict=True))


def _dtype_matches(expected: Any, dtype: np.dtype) -> bool:
    return dtype.type == expected


def _check_decoded_arrays(field: Any, column: np.ndarray) -> np.ndarray:
    """Refuse stored arrays whose dtype or shape is not the schema's: they were not written through it.

    ``column`` is what ``decode_column`` built: one stacked array, or an object array of arrays and Nones.

    Raises:
        CodecError: naming the field, the stored and the expected dtype or shape.
    """
    if column.dtype != object:
        _check_decoded_array(field, column.dtype, column.shape[1:])
        return column
    for value in column:
        if value is not None:
            _check_decoded_array(field, value.dtype, value.shape)
    return column


def _check_decoded_array(field: Any, dtype: np.dtype, shape: tuple) -> None:
    expected_shape = tuple(field.shape)
    # Only a numpy scalar type pins the dtype; anything else in the schema (e.g. None) leaves it open.
    if isinstance(field.numpy_dtype, type) and not _dtype_matches(field.numpy_dtype, dtype):
        raise CodecError(f'field {field.name}: the stored array has dtype {dtype}; the schema expects '
                         f'{np.dtype(field.numpy_dtype)}')
    if not _shape_matches(expected_shape, tuple(shape)):
        raise CodecError(f'field {field.name}: the stored array has shape {tuple(shape)}; the schema expects '
                         f'{expected_shape}')


def check_array(field: Any, value: Any) -> np.ndarray:
    """Check that ``value`` is an ndarray of the field's numpy type and shape (``None`` dims are wildcards).

    Raises:
        SchemaError: naming the field, the expected and the actual type or shape.
    """
    name = _field_name(field)
    if not isinstance(value, np.ndarray):
        raise SchemaError(f'Unexpected type of {name} feature, expected numpy.ndarray of {field.numpy_dtype}, '
                          f'got {type(value).__name__}')
    if not _dtype_matches(field.numpy_dtype, value.dtype):
        raise SchemaError(f'Unexpected type of {name} feature, expected {np.dtype(field.numpy_dtype)}, '
                          f'got {value.dtype}')
    if not _shape_matches(tuple(field.shape), value.shape):
        raise SchemaError(f'Unexpected dimensions of {name} feature, expected {tuple(field.shape)}, '
                          f'got {value.shape}')
    return value


def _binary_payloads(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_large_binary(column.type) or pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
    raise CodecError(f'expected a binary column of encoded values, got Arrow type {column.type}')


class ColumnBuilder:
    """Assembles the decoded values of one column straight into one ``(n, *shape)`` array.

    Values are written into their row of a preallocated array as they are decoded, so a column never exists
    twice (a list of per-row arrays and their stacked copy). When a value's shape or dtype differs from the
    first value's, or a value is None or not an array, the column becomes a 1-d object array holding each value
    instead (rows written so far are copied out and the array, sized for the whole column, is released).

    Args:
        num_rows: the number of values that will be added.
    """

    def __init__(self, num_rows: int) -> None:
        self._num_rows = num_rows
        self._array: np.ndarray | None = None
        self._objects: np.ndarray | None = None
        self._count = 0
        self._reserved: np.ndarray | None = None

    def reserve(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """The next value's row of the array, to decode into, when a value of ``shape`` and ``dtype`` fits there.

        None when it does not (the column holds objects, or other shapes); then decode into a new array. Pass the
        row (or any value) to :meth:`add` next.
        """
        if self._objects is not None:
            return None
        if self._array is None:
            self._array = np.empty((self._num_rows, *shape), dtype=dtype)
        elif self._array.shape[1:] != shape or self._array.dtype != dtype:
            return None
        self._reserved = self._array[self._count, ...]
        return self._reserved

    def add(self, value: Any, convert: Callable[[Any, np.ndarray | None], Any] | None = None) -> None:
        """Add the next value; ``convert(value, out)`` (if given) makes the stored value, writing into ``out``.

        ``out`` is the value's row of the array when the converted value will have ``value``'s shape and dtype,
        else None (then ``convert`` returns a new value). A row from :meth:`reserve` is taken as it is.
        """
        reserved, self._reserved = self._reserved, None
        if value is reserved and value is not None and convert is None:
            self._count += 1
            return
        if self._objects is None and isinstance(value, np.ndarray):
            if self._array is None:
                self._array = np.empty((self._num_rows, *value.shape), dtype=value.dtype)
            if value.shape == self._array.shape[1:] and value.dtype == self._array.dtype:
                row = self._array[self._count, ...]  # a view, also for 0-d values
                if convert is None:
                    row[...] = value
                else:
                    convert(value, row)
                self._count += 1
                return
        if self._objects is None:
            self._objects = np.empty(self._num_rows, dtype=object)
            if self._array is not None:
                # Copies, not views: a view of one row would keep the whole-column array alive.
                for i in range(self._count):
                    self._objects[i] = self._array[i, ...].copy()
                self._array = None
        self._objects[self._count] = value if convert is None or value is None else convert(value, None)
        self._count += 1

    def result(self) -> np.ndarray:
        """The column: the filled array, or the object array (also for a column without values)."""
        if self._count != self._num_rows:
            raise ValueError(f'ColumnBuilder expected {self._num_rows} values, got {self._count}')
        if self._objects is None and self._array is not None:
            return self._array
        if self._objects is None:
            self._objects = np.empty(self._num_rows, dtype=object)
        return self._objects


def stack_or_objects(values: Iterable[Any], count: int | None = None) -> np.ndarray:
    """Stack equal-shaped arrays into one array; otherwise a 1-d object array holding each value (or None).

    Args:
        values: the values; may be a generator (e.g. decoding lazily) when ``count`` is given.
        count: how many values ``values`` yields; default ``len(values)``.
    """
    if count is None:
        sized = values if isinstance(values, Sized) else list(values)
        count = len(sized)
        values = sized
    builder = ColumnBuilder(count)
    for value in values:
        builder.add(value)
    return builder.result()


class DataframeColumnCodec(ABC):
    """Base of all codecs.

    Subclasses define :meth:`encode`, :meth:`decode`, :meth:`spark_dtype`, :meth:`arrow_type` and their JSON
    description. :meth:`decode_column` has a per-value default that codecs override with a columnar one.

    Writing a column takes two steps, so that a bad value is reported with its row and the column can still be
    built at once: :meth:`check_value` for each row's value, then :meth:`encode_column` for the checked values of
    a run of rows. By default the first step encodes each value into its own cell (:meth:`encode`) and the second
    puts those cells into one Arrow array; a codec whose stored form is columnar (``ArrowTensorCodec``) overrides
    both. ``dict_to_spark_row`` encodes single rows and uses :meth:`encode` only.
    """

    #: stable registry key, stored in the dataset metadata.
    codec_name: ClassVar[str]

    @abstractmethod
    def encode(self, unischema_field: Any, value: Any) -> Any:
        """Turn one value into what its Parquet cell stores."""

    @abstractmethod
    def decode(self, unischema_field: Any, value: Any) -> Any:
        """Turn one stored cell back into the field's value."""

    @abstractmethod
    def spark_dtype(self) -> Any:
        """The pyspark type of the stored column (imports pyspark)."""

    @abstractmethod
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the stored column."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable description; ``codec_from_json`` rebuilds an equal codec from it."""
        return {'codec': self.codec_name}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> DataframeColumnCodec:
        """Rebuild a codec from :meth:`to_json` output."""
        return cls()

    def check_available(self, operation: Literal['encode', 'decode']) -> None:
        """Raise ``MissingDependencyError`` now when the libraries ``operation`` needs are not installed.

        Writers and readers call it before their threads or processes start, so that a missing library is one
        error at the caller's line instead of one per worker. The default has nothing to check.
        """
        return None

    def check_value(self, unischema_field: Any, value: Any) -> Any:
        """Check one non-None value of the field and return it in the form :meth:`encode_column` takes.

        The default is the value encoded into its cell by :meth:`encode` (which checks it).

        Args:
            unischema_field: the field the value belongs to.
            value: the value, as ``dict_to_spark_row`` takes it.

        Raises:
            SchemaError: the value's type or shape does not match the field.
        """
        return self.encode(unischema_field, value)

    def encode_column(self, unischema_field: Any, values: Sequence[Any]) -> pa.Array | pa.ChunkedArray:
        """Build the stored column of a run of rows.

        The default puts the cells into one array of :meth:`arrow_type`.

        Args:
            unischema_field: the field the column stores.
            values: what :meth:`check_value` returned for each row, None for a null.

        Returns:
            An Arrow array (or a chunked array, when one array cannot hold the column) of the stored type.

        Raises:
            pyarrow.ArrowException, TypeError, ValueError: a value cannot be stored in the column type.
        """
        return array_of_values(values, self.arrow_type())

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Decode a whole column: a stacked array when every value has one shape, else an object array."""
        values = column.to_pylist()
        return stack_or_objects((None if value is None else self.decode(unischema_field, value)
                                 for value in values), len(values))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.to_json().items())))

    def __repr__(self) -> str:
        return str(self)
