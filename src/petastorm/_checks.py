"""Checks of argument values shared by every layer: one rule each, one message each."""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ['check_positive_int', 'is_integer']


def is_integer(value: Any) -> bool:
    """True for Python and numpy integers; False for bools, which are integers to Python but never meant as counts."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive_int(name: str, value: Any, *, unit: str = '', error: type[Exception] = ValueError) -> int:
    """``value`` as an ``int`` when it is an integer >= 1.

    Args:
        name: the argument, as the caller wrote it (named in the message).
        value: what was passed.
        unit: what the number counts, added to the message (``'bytes'``).
        error: the exception raised, ``ValueError`` or a subclass of it the caller's users catch.

    Raises:
        ValueError: (or ``error``) ``value`` is not an integer, is a bool, or is below 1.
    """
    if not is_integer(value) or value < 1:
        counted = f' ({unit})' if unit else ''
        raise error(f'{name} must be a positive integer{counted}, got {value!r}')
    return int(value)
