"""Build step for the one compiled module; everything else about the package is in pyproject.toml.

``petastorm.shuffle._kernel`` (the shuffling buffer's inner loops) is optional: where no C compiler is available
the install still succeeds and the shuffling buffers use their numpy code instead, which draws the same rows in the
same order.
"""

import os

from setuptools import Extension, setup

# -O3 vectorises the byte moves; compilers that do not take GCC-style flags get their defaults.
_FLAGS = ['-O3'] if os.name == 'posix' else []

setup(ext_modules=[Extension('petastorm.shuffle._kernel', ['src/petastorm/shuffle/_kernel.c'],
                             extra_compile_args=_FLAGS, optional=True)])
