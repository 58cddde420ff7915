"""Decoded values and columns made into what TensorFlow turns into tensors without guessing.

TensorFlow has no tensor for ``Decimal``, ``datetime64``, ``datetime.date`` or ``None``, and its kernels barely
support 16/32-bit unsigned integers. The rules, shared by whole columns and single values, follow the original
Petastorm so that graphs built for it see the same dtypes: ``Decimal`` becomes its normalized string, times
become int64 nanoseconds since the epoch, uint16 widens to int32 and uint32 to int64, and ``None`` is refused
with an error that names the field. Columns are converted with whole-array numpy operations; only object
columns (decimals, dates, Python strings, rows of different shapes) are walked value by value.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any

import numpy as np

from petastorm.columns import ListColumn, MaskedColumn
from petastorm.errors import PetastormError

# Petastorm widened these before making tensors; TensorFlow kernels rarely accept the unsigned originals.
_WIDENED: dict[np.dtype, np.dtype] = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64)}
_EPOCH = np.datetime64(0, 'ns')


class RaggedColumnError(PetastormError, ValueError):
    """A column's rows are arrays of different shapes, so they do not stack into one tensor."""


def none_error(name: str) -> RuntimeError:
    """The error for a ``None`` in field ``name`` (the first words are the original's, which users match on)."""
    return RuntimeError(f'Encountered "{name}"=None. Tensorflow does not support None values as a tensor. '
                        f'Drop such rows with a predicate (petastorm.predicates) or fill them in a TransformSpec.')


def date_to_nsec_from_epoch(value: datetime.date) -> int:
    """Nanoseconds from 1970-01-01 UTC to ``value`` (a date is taken at midnight, a naive datetime as UTC)."""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return int((np.datetime64(value, 'ns') - _EPOCH).astype(np.int64))


def _nanoseconds(times: np.ndarray) -> np.ndarray:
    return (times.astype('datetime64[ns]') - _EPOCH).astype(np.int64)


def column_for_tf(name: str, column: np.ndarray) -> np.ndarray:
    """``column`` (one decoded field, rows first) as an array of a dtype TensorFlow takes as it is.

    Raises:
        RuntimeError: the column holds a ``None``.
        RaggedColumnError: its rows are arrays of different shapes.
    """
    if isinstance(column, np.ma.MaskedArray):
        if np.ma.getmaskarray(column).any():
            raise none_error(name)
        column = column.data
    elif isinstance(column, MaskedColumn):
        raise none_error(name)
    elif isinstance(column, ListColumn):
        raise ragged_list_error(name, column)
    kind = column.dtype.kind
    if kind == 'M':
        return _nanoseconds(column)
    if kind == 'm':
        return column.view(np.int64)  # durations and times of day: counts of their unit
    if kind == 'O':
        return _object_column_for_tf(name, column)
    widened = _WIDENED.get(column.dtype)
    return column if widened is None else column.astype(widened)


def _object_column_for_tf(name: str, column: np.ndarray) -> np.ndarray:
    values = column.ravel().tolist()
    if not values:
        return column
    if any(v is None for v in values):
        raise none_error(name)
    first = values[0]
    if isinstance(first, np.ndarray):
        if any(not isinstance(v, np.ndarray) or v.shape != first.shape for v in values):
            shapes = sorted({str(np.shape(v)) for v in values})
            raise RaggedColumnError(
                f'field {name!r} holds rows of different shapes ({", ".join(shapes[:4])}); a TensorFlow batch '
                f'needs one shape per column. Read it with make_reader, or give the rows one shape with a '
                f'TransformSpec')

        return column_for_tf(name, np.stack(values).reshape(column.shape + first.shape))
    if isinstance(first, decimal.Decimal):
        return np.array([str(v.normalize()) for v in values], dtype=object).reshape(column.shape)
    if isinstance(first, (datetime.date, np.datetime64)):
        return _nanoseconds(np.array(values, dtype='datetime64[ns]')).reshape(column.shape)
    return column  # Python str / bytes: TensorFlow encodes them to tf.string itself


def ragged_list_error(name: str, column: Any) -> RaggedColumnError:
    """The error for a batch of a list field whose rows have different lengths, with the way to get them."""
    lengths = sorted(set(np.diff(column.offsets).tolist()))
    return RaggedColumnError(f'field {name!r} holds lists of different lengths ({", ".join(map(str, lengths[:4]))}); '
                             f'a dense TensorFlow batch needs one length per row. Pass ragged=True to '
                             f'make_petastorm_dataset for tf.RaggedTensor batches, read it with make_reader, or give '
                             f'the rows one length with a TransformSpec')


def value_for_tf(name: str, value: Any) -> Any:
    """One row's value of field ``name`` made ready for TensorFlow (see :func:`column_for_tf`)."""
    if value is None:
        raise none_error(name)
    if isinstance(value, np.ndarray):
        return column_for_tf(name, value)
    if isinstance(value, decimal.Decimal):
        return str(value.normalize())
    if isinstance(value, datetime.date):
        return date_to_nsec_from_epoch(value)
    if isinstance(value, np.datetime64):
        return _nanoseconds(np.asarray(value))[()]
    if isinstance(value, np.generic):
        widened = _WIDENED.get(value.dtype)
        return value if widened is None else value.astype(widened)
    return value


def values_for_tf(names: Sequence[str], values: Sequence[Any]) -> list[Any]:
    """Each of one row's ``values`` (in the order of ``names``) made ready for TensorFlow."""
    return [value_for_tf(name, value) for name, value in zip(names, values, strict=True)]


def columns_for_tf(names: Sequence[str], columns: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each of one batch's ``columns`` (in the order of ``names``) made ready for TensorFlow."""
    return [column_for_tf(name, column) for name, column in zip(names, columns, strict=True)]


def _sanitize_field_tf_types(sample: Any) -> Any:
    """A row namedtuple with every value made ready for TensorFlow (a new tuple of the same class)."""
    return type(sample)(*values_for_tf(sample._fields, sample))
