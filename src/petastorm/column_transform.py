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

from petastorm.codecs import stack_or_objects
from petastorm.transform import (
    TransformResultError,
    TransformSpec,
    check_row_result,
    check_transformed_values,
    describe_function,
)
from petastorm.unischema import Unischema


@dataclass(frozen=True)
class TransformTarget:
    """What a transform must produce.

    Attributes:
        spec: the transform.
        result_fields: names of the fields after the transform, in output order.
        result_schema: the schema after the transform, against which the first result is checked (None: only the
            field names are checked).
        batched: ``make_batch_reader`` semantics: the function receives and returns a pandas DataFrame.
    """

    spec: TransformSpec
    result_fields: tuple[str, ...]
    result_schema: Unischema | None
    batched: bool


@dataclass(frozen=True)
class Transformed:
    """The columns a transform produced.

    ``rows_are_tuples`` when a row function returned plain tuples: the columns are then named ``'0'``, ``'1'``,
    ... by position.
    """

    columns: dict[str, np.ndarray]
    num_rows: int
    rows_are_tuples: bool = False


def pandas_column(values: np.ndarray) -> Any:
    """A column pandas can hold: arrays of more than one dimension become an object array of per-row arrays."""
    if values.ndim > 1:
        out = np.empty(len(values), dtype=object)
        for i in range(len(values)):
            out[i] = values[i]
        return out
    return values


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


def apply_transform(target: TransformTarget | None, columns: dict[str, np.ndarray], num_rows: int,
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
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)] if names else [
        {} for _ in range(num_rows)]
    results = [spec.func(row) for row in rows]
    if results:
        check_row_result(spec, target.result_fields, results[0], where, target.result_schema)
    if results and isinstance(results[0], tuple) and not hasattr(results[0], '_fields'):
        width = len(results[0])
        try:
            out = {str(i): column_from_values([r[i] for r in results]) for i in range(width)}
        except (TypeError, IndexError, KeyError):
            _raise_for_odd_row(target, results, where)
        return Transformed(out, len(results), rows_are_tuples=True)
    try:
        out_columns = {name: column_from_values([r[name] for r in results]) for name in target.result_fields}
    except (TypeError, IndexError, KeyError):
        _raise_for_odd_row(target, results, where)
    return Transformed(out_columns, len(results))


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


def _transform_frame(target: TransformTarget, columns: dict[str, np.ndarray], num_rows: int,
                     where: str) -> Transformed:
    import pandas as pd

    spec, result_fields = target.spec, target.result_fields
    assert spec.func is not None
    frame = pd.DataFrame({name: pandas_column(values) for name, values in columns.items()}, index=range(num_rows))
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
    out = {}
    for name in result_fields:
        series = result[name]
        if series.dtype == object:
            out[name] = column_from_values(list(series))
        else:
            out[name] = series.to_numpy()
    if len(result) and target.result_schema is not None:
        check_transformed_values(spec, target.result_schema, {name: column[0] for name, column in out.items()},
                                 f'first row of {where}')
    return Transformed(out, len(result))
