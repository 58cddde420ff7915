"""Row predicates: which rows a reader delivers.

A predicate names the fields it needs (:meth:`PredicateBase.get_fields`); the reader loads and decodes those
columns first and reads the other columns only for row groups with at least one match.

``make_reader`` evaluates a predicate over a whole decoded column batch with :meth:`PredicateBase.evaluate`,
which built-in predicates implement with numpy; the default calls :meth:`PredicateBase.do_include` once per row
with a dict of that row's values. ``make_batch_reader`` calls ``do_include`` once per batch with a pandas
DataFrame (Petastorm's contract) unless the predicate has a vectorized ``evaluate``.
"""

from __future__ import annotations

import hashlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from petastorm.errors import PetastormError

__all__ = [
    'PredicateBase', 'PredicateError', 'in_intersection', 'in_lambda', 'in_negate', 'in_pseudorandom_split',
    'in_reduce', 'in_set',
]


class PredicateError(PetastormError, ValueError):
    """A predicate could not be evaluated as the reader calls it (the message names the predicate and the fix)."""


class PredicateBase(ABC):
    """Base class of predicates."""

    @abstractmethod
    def get_fields(self) -> set[str] | list[str]:
        """Names of the fields the predicate reads."""

    @abstractmethod
    def do_include(self, values: Any) -> Any:
        """Whether a row (dict of field values) is included."""

    #: whether :meth:`evaluate` is vectorized (then the batch reader uses it instead of a DataFrame call).
    vectorized = False

    def evaluate(self, columns: dict[str, np.ndarray], num_rows: int) -> np.ndarray:
        """A boolean mask over a batch of decoded columns (``{field: array of num_rows values}``)."""
        names = list(self.get_fields())
        mask = np.empty(num_rows, dtype=bool)
        for i in range(num_rows):
            mask[i] = bool(self.do_include({name: columns[name][i] for name in names}))
        return mask


def _column_isin(column: np.ndarray, values: Iterable[Any]) -> np.ndarray:
    values = list(values)
    if column.dtype != object:
        try:
            return np.isin(column, np.asarray(values, dtype=column.dtype) if values else values)
        except (TypeError, ValueError):
            pass
    lookup = set(values)
    return np.fromiter((v in lookup for v in column), dtype=bool, count=len(column))


class in_set(PredicateBase):  # noqa: N801 (Petastorm's public name)
    """Rows whose ``predicate_field`` value is one of ``inclusion_values``."""

    vectorized = True

    def __init__(self, inclusion_values: Iterable[Any], predicate_field: str) -> None:
        self._inclusion_values = set(inclusion_values)
        self._predicate_field = predicate_field

    def get_fields(self) -> set[str]:
        """``{predicate_field}``."""
        return {self._predicate_field}

    def do_include(self, values: Any) -> Any:
        """Whether the row's value is in the set (for a pandas batch: a boolean Series)."""
        column = values[self._predicate_field]
        if hasattr(column, 'isin'):  # a pandas Series (batch reader)
            return column.isin(self._inclusion_values)
        return column in self._inclusion_values

    def evaluate(self, columns: dict[str, np.ndarray], num_rows: int) -> np.ndarray:
        """The rows of the batch whose value is in the set, as a boolean mask (vectorized with numpy)."""
        return _column_isin(columns[self._predicate_field], self._inclusion_values)


class in_intersection(PredicateBase):  # noqa: N801
    """Rows whose ``predicate_field`` (an iterable value) shares at least one element with ``inclusion_values``."""

    def __init__(self, inclusion_values: Iterable[Any], _predicate_field: str) -> None:
        self._inclusion_values = list(inclusion_values)
        self._predicate_field = _predicate_field

    def get_fields(self) -> set[str]:
        """``{predicate_field}``."""
        return {self._predicate_field}

    def do_include(self, values: Any) -> bool:
        """Whether the row's value shares an element with ``inclusion_values``.

        Raises:
            ValueError: the value is not iterable.
        """
        value = values[self._predicate_field]
        if not hasattr(value, '__iter__'):
            raise ValueError('Predicate field should have iterable type')
        return bool(np.isin(np.asarray(list(value)), self._inclusion_values).any())


class in_lambda(PredicateBase):  # noqa: N801
    """Rows for which ``predicate_func(*field values[, state_arg])`` is true.

    ``make_reader`` calls ``predicate_func`` once per row with the row's values. ``make_batch_reader`` calls it
    once per row group with a pandas Series per field (Petastorm's contract), so the function must work element
    by element and return a boolean Series: ``lambda x: (x > 5) & (x < 10)`` or ``lambda x: x.isin(values)``,
    not ``5 < x < 10``, ``x in values`` or ``if x ...``, which ask a whole Series for one truth value (pandas'
    "truth value of a Series is ambiguous"; the reader's error then names the predicate and this rule).
    """

    def __init__(self, predicate_fields: list[str], predicate_func: Callable[..., Any], state_arg: Any = None) -> None:
        if not isinstance(predicate_fields, list):
            raise ValueError('Predicate fields should be a list')
        self._predicate_fields = predicate_fields
        self._predicate_func = predicate_func
        self._state_arg = state_arg

    def get_fields(self) -> list[str]:
        """``predicate_fields``, in the order their values are passed to ``predicate_func``."""
        return self._predicate_fields

    def do_include(self, values: Any) -> Any:
        """``predicate_func(*values of predicate_fields[, state_arg])`` for the row (or pandas batch)."""
        args = [values[f] for f in self._predicate_fields]
        if self._state_arg is not None:
            args.append(self._state_arg)
        return self._predicate_func(*args)

    def __repr__(self) -> str:
        from petastorm.transform import describe_function

        state = '' if self._state_arg is None else f', state_arg={self._state_arg!r}'
        return f'in_lambda({self._predicate_fields!r}, {describe_function(self._predicate_func)}{state})'


class in_negate(PredicateBase):  # noqa: N801
    """The logical negation of another predicate."""

    def __init__(self, predicate: PredicateBase) -> None:
        if not isinstance(predicate, PredicateBase):
            raise ValueError('Predicate is nor derived from PredicateBase')
        self._predicate = predicate
        self.vectorized = predicate.vectorized

    def get_fields(self) -> set[str] | list[str]:
        """The fields of the negated predicate."""
        return self._predicate.get_fields()

    def do_include(self, values: Any) -> Any:
        """The negation of the wrapped predicate's answer (element-wise for a pandas batch)."""
        result = self._predicate.do_include(values)
        return ~result if hasattr(result, '__invert__') and not isinstance(result, (bool, np.bool_)) else not result

    def evaluate(self, columns: dict[str, np.ndarray], num_rows: int) -> np.ndarray:
        """The inverse of the wrapped predicate's mask."""
        return ~self._predicate.evaluate(columns, num_rows)


class in_reduce(PredicateBase):  # noqa: N801
    """Combines predicates: ``reduce_func([p.do_include(values) for p in predicate_list])`` (e.g. ``all``, ``any``)."""

    def __init__(self, predicate_list: list[PredicateBase], reduce_func: Callable[[list[Any]], Any]) -> None:
        for predicate in predicate_list:
            if not isinstance(predicate, PredicateBase):
                raise ValueError('Predicate is nor derived from PredicateBase')
        self._predicate_list = list(predicate_list)
        self._reduce_func = reduce_func
        self.vectorized = reduce_func in (all, any) and all(p.vectorized for p in predicate_list)

    def get_fields(self) -> set[str]:
        """The union of the fields of every combined predicate."""
        fields: set[str] = set()
        for predicate in self._predicate_list:
            fields |= set(predicate.get_fields())
        return fields

    def do_include(self, values: Any) -> Any:
        """``reduce_func`` of the answers of every combined predicate for the row."""
        return self._reduce_func([p.do_include(values) for p in self._predicate_list])

    def evaluate(self, columns: dict[str, np.ndarray], num_rows: int) -> np.ndarray:
        """The combined mask: element-wise and/or of the predicates' masks for ``all``/``any``, else row by row."""
        if not self._predicate_list:  # what reduce_func says of no answers, for every row: all([]), not any([])
            return np.full(num_rows, bool(self._reduce_func([])))
        if self._reduce_func in (all, any):
            masks = np.stack([p.evaluate(columns, num_rows) for p in self._predicate_list])
            combine = np.logical_and if self._reduce_func is all else np.logical_or
            return combine.reduce(masks, axis=0)
        return super().evaluate(columns, num_rows)


class in_pseudorandom_split(PredicateBase):  # noqa: N801
    """A deterministic split of rows into subsets by a hash of one field (no seed: stable across runs).

    Args:
        fraction_list: sizes of the subsets, e.g. ``[0.8, 0.2]``.
        subset_index: which subset to keep.
        predicate_field: the field whose ``str()`` is hashed (md5).
    """

    def __init__(self, fraction_list: list[float], subset_index: int, predicate_field: str) -> None:
        if subset_index >= len(fraction_list):
            raise ValueError('subset_index is out of range')
        self._predicate_field = predicate_field
        bounds = np.cumsum([0.0, *fraction_list])
        self._low, self._high = bounds[subset_index], bounds[subset_index + 1]

    def get_fields(self) -> set[str]:
        """``{predicate_field}``."""
        return {self._predicate_field}

    def _included(self, value: Any) -> bool:
        digest = int(hashlib.md5(str(value).encode('utf-8')).hexdigest(), 16) % sys.maxsize
        scale = sys.maxsize - 1
        return self._low * scale <= digest < self._high * scale

    def do_include(self, values: Any) -> Any:
        """Whether the hash of the row's value falls in the kept subset (for a pandas batch: a boolean Series).

        Raises:
            ValueError: ``values`` has no ``predicate_field``.
        """
        if self._predicate_field not in values:
            raise ValueError(f'Tested values does not have split key: {self._predicate_field}')
        value = values[self._predicate_field]
        if hasattr(value, 'map') and hasattr(value, 'index'):  # a pandas Series
            return value.map(self._included)
        return self._included(value)
