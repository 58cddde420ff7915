"""Build step for the compiled modules; everything else about the package is in pyproject.toml.

Both are optional: where no C compiler is available the install still succeeds.

* ``petastorm.shuffle._kernel`` (the shuffling buffer's inner loops): without it the shuffling buffers use their
  numpy code, which draws the same rows in the same order.
* ``petastorm.codecs._png_rows`` (the chunk reading and row filters of our PNG reader; needs zlib's header):
  without it PNG images are decoded by the image libraries alone, to the same pixels.
"""

import os

from setuptools import Extension, setup

# -O3 vectorises the byte moves; compilers that do not take GCC-style flags get their defaults.
_FLAGS = ['-O3'] if os.name == 'posix' else []

setup(ext_modules=[
    Extension('petastorm.shuffle._kernel', ['src/petastorm/shuffle/_kernel.c'], extra_compile_args=_FLAGS,
              optional=True),
    Extension('petastorm.codecs._png_rows', ['src/petastorm/codecs/_png_rows.c'], extra_compile_args=_FLAGS,
              libraries=['z'], optional=True),
])
