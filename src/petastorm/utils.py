"""Small helpers of Petastorm's public ``petastorm.utils`` module."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np

from petastorm.errors import DecodeFieldError
from petastorm.unischema import Unischema

__all__ = ['DecodeFieldError', 'decode_row']


def decode_row(row: dict[str, Any], schema: Unischema) -> dict[str, Any]:
    """Decode one row of stored values into field values (the per-row path; readers decode whole columns).

    Keys not in the schema are dropped and ``None`` stays ``None``. Codec fields are decoded by their codec;
    other values are cast to the field's numpy type.

    Raises:
        DecodeFieldError: naming the field that failed, with the original error chained.
    """
    decoded: dict[str, Any] = {}
    for name, value in row.items():
        field = schema.fields.get(name)
        if field is None:
            continue
        if value is None:
            decoded[name] = None
            continue
        try:
            if field.codec is not None:
                decoded[name] = field.codec.decode(field, value)
            elif tuple(field.shape) and isinstance(field.numpy_dtype, type) and issubclass(field.numpy_dtype,
                                                                                            np.generic):
                decoded[name] = np.asarray(value, dtype=field.numpy_dtype)  # a list column: np.str_(list) is wrong
            elif isinstance(field.numpy_dtype, type) and issubclass(field.numpy_dtype, (np.generic, decimal.Decimal)):
                decoded[name] = field.numpy_dtype(value)
            else:
                decoded[name] = value
        except Exception as err:
            raise DecodeFieldError(f'Decoding field "{name}" failed: {err}') from err
    return decoded
