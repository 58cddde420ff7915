"""Build step for the one compiled module; everything else about the package is in pyproject.toml.

``petastorm._shuffle`` (the shuffling buffer's inner loops) is optional: where no C compiler is available the
install still succeeds and the loaders use their numpy code instead.
"""

import os

from setuptools import Extension, setup

# -O3 vectorises the byte moves; compilers that do not take GCC-style flags get their defaults.
_FLAGS = ['-O3'] if os.name == 'posix' else []

setup(ext_modules=[Extension('petastorm._shuffle', ['src/petastorm/_shuffle.c'], extra_compile_args=_FLAGS,
                             optional=True)])
