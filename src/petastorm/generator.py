"""Random data for a schema, for tests and examples."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np

from petastorm.unischema import Unischema

__all__ = ['LIST_SIZE', 'generate_datapoint']

#: size given to dimensions declared as ``None``.
LIST_SIZE = 13


def generate_datapoint(schema: Unischema, rng: np.random.Generator | None = None) -> dict[str, Any]:
    """One row of random values that satisfies ``schema`` (``None`` dimensions become ``LIST_SIZE``)."""
    rng = rng if rng is not None else np.random.default_rng()
    row = {}
    for name, field in schema.fields.items():
        shape = tuple(LIST_SIZE if d is None else d for d in field.shape)
        row[name] = _random_value(field.numpy_dtype, shape, rng)
    return row


def _random_value(dtype: Any, shape: tuple, rng: np.random.Generator) -> Any:
    if dtype is decimal.Decimal:
        return decimal.Decimal(f'{rng.integers(0, 10**6) / 1000:.3f}')
    kind = np.dtype(dtype).kind
    if kind in 'iu':
        info = np.iinfo(dtype)
        values = rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dtype)
    elif kind == 'f':
        values = rng.random(size=shape).astype(dtype)
    elif kind == 'b':
        values = rng.random(size=shape) < 0.5
    elif kind == 'U':
        values = np.array([f'str_{v}' for v in rng.integers(0, 1000, size=int(np.prod(shape)))]).reshape(shape)
    elif kind == 'S':
        values = np.array([f'bytes_{v}'.encode() for v in rng.integers(0, 1000, size=int(np.prod(shape)))],
                          dtype=np.bytes_).reshape(shape)
    elif kind == 'M':
        values = np.datetime64('2020-01-01T00:00:00', 'us') + rng.integers(0, 10**12, size=shape).astype(
            'timedelta64[us]')
    else:
        raise ValueError(f'cannot generate random values of type {dtype}')
    if shape == ():
        return values[()] if isinstance(values, np.ndarray) else dtype(values)
    return values
