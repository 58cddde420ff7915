"""Applying a ``TransformSpec`` to the decoded columns of one work item, in the worker.

A ``make_batch_reader`` transform function gets the columns as one pandas DataFrame; a ``make_reader`` one is
called once per row (its contract is a row in, a row out), and its results are made into columns again. A spec
without a function only selects and drops fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa

from petastorm.codecs import ScalarCodec, stack_or_objects
from petastorm.columns import Column, MaskedColumn, StructColumn, is_nested, row_value, row_values
from petastorm.transform import (
    TransformResultError,
    TransformSpec,
    check_row_result,
    check_transformed_values,
    describe_function,
)
from petastorm.typemaps.scalars import scalar_column_to_numpy
from petastorm.unischema import Unischema, UnischemaField, arrow_type_of_field

__all__ = ['TransformTarget', 'Transformed', 'apply_transform', 'column_from_values', 'pandas_column']


@dataclass(frozen=True)
class TransformTarget:
    """What a transform must produce.

    Attributes:
        spec: the transform.
        result_fields: names of the fields after the transform, in output order.
        result_schema: the schema after the transform, against which the first result is checked (None: only the
            field names are checked).
        batched: ``make_batch_reader`` semantics: the function receives and returns a pandas DataFrame.
        source_schema: the fields before the transform (their stored types give a DataFrame's time zones), or
            None.
    """

    spec: TransformSpec
    result_fields: tuple[str, ...]
    result_schema: Unischema | None
    batched: bool
    source_schema: Unischema | None = None


@dataclass(frozen=True)
class Transformed:
    """The columns a transform produced.

    ``rows_are_tuples`` when a row function returned plain tuples: the columns are then named ``'0'``, ``'1'``,
    ... by position.
    """

    columns: dict[str, Column]
    num_rows: int
    rows_are_tuples: bool = False


def pandas_column(values: Column, field: UnischemaField | None = None) -> Any:
    """A column pandas can hold.

    Arrays of more than one dimension, lists and structs become an object array of the rows' values (arrays,
    dicts, None); values with nulls a pandas nullable array (``Int32``, ``boolean``, ``Float64``; ``NaT`` in
    times, None in text); times of a field whose stored type has a time zone a zone-aware column in it.
    """
    if isinstance(values, MaskedColumn):
        return _masked_for_pandas(values, field)
    if is_nested(values):
        return _objects(row_values(values), len(values) if not isinstance(values, StructColumn) else values.num_rows)
    assert isinstance(values, np.ndarray)
    if values.ndim > 1:
        out = np.empty(len(values), dtype=object)
        for i in range(len(values)):
            out[i] = values[i]
        return out
    zone = _time_zone(field)
    if zone is not None and values.dtype.kind == 'M':
        import pandas as pd

        return pd.Series(values).dt.tz_localize('UTC').dt.tz_convert(zone).array
    return values


def _objects(values: Any, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _masked_for_pandas(column: MaskedColumn, field: UnischemaField | None) -> Any:
    import pandas as pd

    values, missing = column.values, ~column.valid
    kind = values.dtype.kind
    if values.ndim == 1 and kind in 'iu':
        return pd.arrays.IntegerArray(values.copy(), missing)
    if values.ndim == 1 and kind == 'f':
        return pd.arrays.FloatingArray(values.copy(), missing)
    if values.ndim == 1 and kind == 'b':
        return pd.arrays.BooleanArray(values.copy(), missing)
    if values.ndim == 1 and kind in 'Mm':
        filled = values.copy()
        filled[missing] = np.datetime64('NaT') if kind == 'M' else np.timedelta64('NaT')
        return pandas_column(filled, field)
    return _objects(row_values(column), len(column))


def _time_zone(field: UnischemaField | None) -> str | None:
    if field is None or not isinstance(field.codec, ScalarCodec):
        return None
    arrow_type = field.codec.arrow_type()
    return arrow_type.tz if pa.types.is_timestamp(arrow_type) else None


# Python scalars a row transform may return, and the dtype torch's default collate gives a list of them.
_PYTHON_SCALAR_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64}


def column_from_values(values: list[Any]) -> np.ndarray:
    """One column from per-row values.

    Arrays of one shape are stacked, numpy or Python scalars of one type make a typed array, anything else
    (strings, Decimals, mixed types) an object array.
    """
    if values and all(isinstance(v, np.generic) for v in values) and len({v.dtype for v in values}) == 1:
        return np.array(values, dtype=values[0].dtype)
    kinds = {type(v) for v in values}
    if len(kinds) == 1 and (kind := next(iter(kinds))) in _PYTHON_SCALAR_DTYPES:
        try:
            return np.array(values, dtype=_PYTHON_SCALAR_DTYPES[kind])
        except OverflowError:  # ints beyond 64 bits stay Python objects
            pass
    return stack_or_objects(values)


def apply_transform(target: TransformTarget | None, columns: dict[str, Column], num_rows: int,
                    where: str) -> Transformed:
    """The columns after the transform (the columns themselves when there is none).

    Args:
        target: the transform and what it must produce, or None.
        columns: the decoded columns of the work item (all of ``num_rows`` rows).
        num_rows: rows of the work item.
        where: the file, row group and rows, named in errors.

    Raises:
        TransformResultError: the function returned something that does not fit the declared result.
    """
    if target is None:
        return Transformed(columns, num_rows)
    spec = target.spec
    if spec.func is None:
        return Transformed({name: columns[name] for name in target.result_fields}, num_rows)
    if target.batched:
        return _transform_frame(target, columns, num_rows, where)
    names = list(columns)
    rows = [dict(zip(names, values, strict=True)) for values in zip(
        *(row_values(c) if is_nested(c) else c for c in columns.values()), strict=True)] if names else [
        {} for _ in range(num_rows)]
    results = [spec.func(row) for row in rows]
    if results:
        check_row_result(spec, target.result_fields, results[0], where, target.result_schema)
    if results and isinstance(results[0], tuple) and not hasattr(results[0], '_fields'):
        width = len(results[0])
        try:
            out: dict[str, Column] = {str(i): column_from_values([r[i] for r in results]) for i in range(width)}
        except (TypeError, IndexError, KeyError):
            _raise_for_odd_row(target, results, where)
        return Transformed(out, len(results), rows_are_tuples=True)
    try:
        out_columns: dict[str, Column] = {
            name: _as_field_column(target, name, column_from_values([r[name] for r in results]))
            for name in target.result_fields}
    except (TypeError, IndexError, KeyError):
        _raise_for_odd_row(target, results, where)
    return Transformed(out_columns, len(results))


def _as_field_column(target: TransformTarget, name: str, values: np.ndarray) -> Column:
    """A transform's object column of a native field (Nones, lists, dicts) in the column form the reader gives.

    Columns of values that are all alike (numbers, arrays of one shape) are kept as they are.
    """
    schema = target.result_schema
    field = schema.fields.get(name) if schema is not None else None
    if field is None or values.dtype != object or not len(values):
        return values
    if field.codec is not None and not isinstance(field.codec, ScalarCodec):
        return values
    if tuple(field.shape) == () and not any(v is None for v in values) and not isinstance(values[0], dict):
        return values
    try:
        arrow_type = arrow_type_of_field(field)
        stored = pa.array([_arrow_value(v) for v in values], type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError):
        return values  # not what the field's stored type holds: the checks of the result report it
    return scalar_column_to_numpy(field, stored)


def _arrow_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist() if value.dtype != object else [_arrow_value(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _arrow_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_arrow_value(v) for v in value]
    return value


def _raise_for_odd_row(target: TransformTarget, results: Sequence[Any], where: str) -> NoReturn:
    """The first result passed the checks but a later one is not like it: name that row."""
    first = results[0]
    function = describe_function(target.spec.func)
    for index, result in enumerate(results[1:], start=1):
        if isinstance(first, tuple):
            if not isinstance(result, tuple) or len(result) != len(first):
                raise TransformResultError(f'the TransformSpec function {function} returned {type(result).__name__} '
                                           f'{result!r:.60} for row {index} of {where}, and a tuple of '
                                           f'{len(first)} values for its first row')
        elif isinstance(result, tuple):
            raise TransformResultError(f'the TransformSpec function {function} returned a tuple for row {index} of '
                                       f'{where}, and a dict for its first row')
        else:
            check_row_result(target.spec, target.result_fields, result, f'row {index} of {where}')
    raise TransformResultError(f'the TransformSpec function {function} returned rows that cannot be made into '
                               f'columns ({where})')


def _transform_frame(target: TransformTarget, columns: dict[str, Column], num_rows: int,
                     where: str) -> Transformed:
    import pandas as pd

    spec, result_fields = target.spec, target.result_fields
    assert spec.func is not None
    source = target.source_schema.fields if target.source_schema is not None else {}
    frame = pd.DataFrame({name: pandas_column(values, source.get(name)) for name, values in columns.items()},
                         index=range(num_rows))
    result = spec.func(frame)
    function = describe_function(spec.func)
    if not isinstance(result, pd.DataFrame):
        raise TransformResultError(f'a make_batch_reader TransformSpec function must return a pandas DataFrame, got '
                                   f'{type(result).__name__}: {function} returned it for {where}. It is called '
                                   f'with a DataFrame of a whole row group; to transform one row dict at a time, '
                                   f'read with make_reader')
    result = result.drop(columns=[c for c in spec.removed_fields if c in result.columns])
    if spec.selected_fields is not None:  # the function may return the whole frame: keep what the spec selects
        result = result[[c for c in result.columns if c in result_fields]]
    if set(result.columns) != set(result_fields):
        missing = [name for name in result_fields if name not in result.columns]
        unexpected = [str(name) for name in result.columns if name not in result_fields]
        wrong = ' and '.join(part for part in (f'left out {missing}' if missing else '',
                                               f'returned {unexpected}, not declared' if unexpected else '') if part)
        # The first sentence is the original's.
        raise TransformResultError(
            f'Transformed result columns ({", ".join(map(str, result.columns))}) do not match required schema '
            f'columns({", ".join(result_fields)}): the TransformSpec function {function} {wrong} ({where}); '
            f'declare new columns in edit_fields and dropped ones in removed_fields')
    out: dict[str, Column] = {}
    for name in result_fields:
        out[name] = _series_column(target, name, result[name], columns.get(name))
    if len(result) and target.result_schema is not None:
        check_transformed_values(spec, target.result_schema, {name: row_value(column, 0)
                                                              for name, column in out.items()},
                                 f'first row of {where}')
    return Transformed(out, len(result))


def _series_column(target: TransformTarget, name: str, series: Any, before: Column | None) -> Column:
    """A pandas result column as a reader column.

    Nullable pandas arrays become masked columns, zone-aware times UTC ``datetime64`` in the unit the column had
    before the transform (a ``date32`` column stays ``datetime64[D]``, though pandas holds it in seconds), object
    columns of a native field the list, struct or masked column the reader gives for it.
    """
    import pandas as pd

    dtype = series.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        series = series.dt.tz_convert('UTC').dt.tz_localize(None)
        dtype = series.dtype
    if dtype == np.dtype(object):
        return _as_field_column(target, name, column_from_values(list(series)))
    if isinstance(dtype, pd.api.extensions.ExtensionDtype) and series.hasnans and hasattr(dtype, 'numpy_dtype'):
        missing = series.isna().to_numpy()
        values = series.to_numpy(dtype=dtype.numpy_dtype, na_value=0)
        return MaskedColumn(values, ~missing)
    if isinstance(dtype, pd.api.extensions.ExtensionDtype) and hasattr(dtype, 'numpy_dtype'):
        return series.to_numpy(dtype=dtype.numpy_dtype)
    values = series.to_numpy()
    unit = _unit_before(before)
    if values.dtype.kind in 'Mm' and unit is not None and values.dtype.kind == unit.kind and values.dtype != unit:
        values = values.astype(unit)
    if values.dtype.kind in 'Mm':
        missing = np.isnat(values)
        if missing.any():  # NaT is how pandas holds a null time, as pyarrow reads it
            filled = values.copy()
            filled[missing] = np.zeros(1, dtype=values.dtype)[0]
            return MaskedColumn(filled, ~missing)
    return values


def _unit_before(column: Column | None) -> np.dtype | None:
    if isinstance(column, MaskedColumn):
        column = column.values
    if isinstance(column, np.ndarray) and column.dtype.kind in 'Mm':
        return column.dtype
    return None
