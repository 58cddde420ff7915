"""Warnings that point at the user's line: the first frame outside the package, however deep the call came from."""

from __future__ import annotations

import sys
import warnings
from types import FrameType

__all__ = ['user_stacklevel', 'warn_user']

_PACKAGE = 'petastorm'
# Test modules shipped under the package's name (Petastorm's own suite runs as ``petastorm.tests``) are callers.
_CALLERS_INSIDE = ('petastorm.tests',)


def _is_ours(module: str) -> bool:
    if module.startswith(_CALLERS_INSIDE):
        return False
    return module == _PACKAGE or module.startswith(_PACKAGE + '.')


def user_stacklevel(skip: int = 1) -> int:
    """The ``stacklevel`` for a ``warnings.warn`` call that makes the warning name the first frame outside petastorm.

    Args:
        skip: which frame calls ``warnings.warn``, counted from this function: 1 (default) its caller.
    """
    frame: FrameType | None = sys._getframe(skip)  # the frame calling warnings.warn: stacklevel 1
    level = 1
    while frame is not None and _is_ours(frame.f_globals.get('__name__', '')):
        frame = frame.f_back
        level += 1
    return level


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` shown at the user's line that led here (not at ours)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
