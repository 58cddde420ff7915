"""The compiled kernel (``petastorm.shuffle._kernel``): whether it is built, and the switch that turns it off.

The kernel is an optional part of the install (built where a C compiler is available). It makes no random numbers:
which rows a draw takes follows from random words numpy draws, and without the kernel numpy replays the same draw
(:mod:`petastorm.shuffle._draw`). Turning the kernel off changes the speed of a shuffling buffer, never the rows it
hands out or their order.

The environment variable ``PETASTORM_NO_COMPILED_SHUFFLE`` is read each time a buffer is made (never at import), so
a program or a test can switch between the two paths as it goes.
"""

from __future__ import annotations

import os
from types import ModuleType

NO_COMPILED_SHUFFLE_ENV = 'PETASTORM_NO_COMPILED_SHUFFLE'

_OFF, _ON = ('1',), ('', '0')


def _switched_off() -> bool:
    """True when ``PETASTORM_NO_COMPILED_SHUFFLE=1``.

    Raises:
        ValueError: the variable holds something other than ``1``, ``0`` or nothing.
    """
    value = os.environ.get(NO_COMPILED_SHUFFLE_ENV, '').strip()
    if value in _OFF:
        return True
    if value in _ON:
        return False
    raise ValueError(f'{NO_COMPILED_SHUFFLE_ENV}={value!r}: expected 1 (shuffle with numpy, without the compiled '
                     f'kernel) or 0 / unset (use the kernel when it is built)')


def built_kernel() -> ModuleType | None:
    """The compiled kernel module, or None when the package was installed without it (no C compiler)."""
    try:
        from petastorm.shuffle import _kernel
    except ImportError:
        return None
    return _kernel


def kernel_in_use() -> ModuleType | None:
    """The kernel a buffer made now should use: None when it is not built or ``PETASTORM_NO_COMPILED_SHUFFLE=1``."""
    return None if _switched_off() else built_kernel()


def compiled_shuffle_in_use() -> bool:
    """Whether shuffling buffers made now move their rows with the compiled kernel.

    True when the kernel was built at install time (a C compiler was available) and the environment variable
    ``PETASTORM_NO_COMPILED_SHUFFLE`` is not ``1``. Either way the buffers hand out the same rows in the same order
    for the same seed; the kernel only makes packing and drawing rows faster.

    Returns:
        True when the compiled kernel is built and switched on.

    Raises:
        ValueError: ``PETASTORM_NO_COMPILED_SHUFFLE`` holds something other than ``1``, ``0`` or nothing.

    Example:
        >>> import os
        >>> from petastorm.shuffle import compiled_shuffle_in_use
        >>> os.environ['PETASTORM_NO_COMPILED_SHUFFLE'] = '1'
        >>> compiled_shuffle_in_use()
        False
    """
    return kernel_in_use() is not None
