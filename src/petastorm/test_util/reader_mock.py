"""A stand-in for a reader that yields generated rows, for testing training code without a dataset.

Example:
    >>> from petastorm.test_util.reader_mock import ReaderMock, schema_data_generator_example
    >>> reader = ReaderMock(MySchema, schema_data_generator_example)  # doctest: +SKIP
    >>> row = next(reader)  # a MySchema namedtuple of zeros  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np

from petastorm.unischema import Unischema

__all__ = ['ReaderMock', 'schema_data_generator_example']

#: The length given to variable (``None``) dimensions by :func:`schema_data_generator_example`.
VARIABLE_DIM_SIZE = 10


class ReaderMock:
    """An endless reader of rows made by ``schema_data_generator(schema)`` (a dict of field values).

    It has the attributes training loops use (``schema``, ``batched_output``, ``ngram``), iterates forever and its
    ``stop``/``join`` do nothing.

    Args:
        schema: the rows' Unischema.
        schema_data_generator: ``f(schema) -> {field name: value}``, called once per row.
        ngram: must be None; NGram output is not mocked.

    Raises:
        ValueError: ``ngram`` is not None.
    """

    def __init__(self, schema: Unischema, schema_data_generator: Callable[[Unischema], dict[str, Any]],
                 ngram: Any = None) -> None:
        if ngram is not None:
            raise ValueError('ReaderMock does not support NGram output yet (pass ngram=None)')
        self.schema = schema
        self.ngram = None
        self.batched_output = False
        self.is_batched_reader = False
        self.last_row_consumed = False
        self.stopped = False
        self._generator = schema_data_generator

    def fetch(self) -> Any:
        """The next generated row, as a ``schema`` namedtuple."""
        return self.schema.make_namedtuple(**self._generator(self.schema))

    def __iter__(self) -> ReaderMock:
        return self

    def __next__(self) -> Any:
        return self.fetch()

    def next(self) -> Any:
        """Same as ``next(reader)``."""
        return self.fetch()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Always empty: there are no workers."""
        return {}

    def reset(self) -> None:
        """Does nothing: the mock never runs out of rows."""

    def stop(self) -> None:
        """Does nothing (there are no workers)."""

    def join(self) -> None:
        """Does nothing (there are no workers)."""

    def __enter__(self) -> ReaderMock:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
        self.join()


def schema_data_generator_example(schema: Unischema) -> dict[str, Any]:
    """Zeros of every field's dtype and shape (``None`` dimensions become 10); ``Decimal('0.0')`` for decimals.

    Scalars (shape ``()``) are numpy scalars, e.g. ``np.int64(0)``, ``np.str_('')``.
    """
    row: dict[str, Any] = {}
    for field in schema.fields.values():
        if field.numpy_dtype is Decimal:
            row[field.name] = Decimal('0.0')
            continue
        shape = tuple(VARIABLE_DIM_SIZE if d is None else d for d in field.shape)
        zeros = np.zeros(shape, dtype=field.numpy_dtype)
        row[field.name] = zeros if shape else zeros[()]
    return row
