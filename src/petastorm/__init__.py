"""petastorm: Parquet datasets of scalars, n-d arrays and images for PyTorch and TensorFlow training.

Nothing heavy is imported here: torch, TensorFlow, pyspark and OpenCV load only when a feature needs them.
"""

from __future__ import annotations

from typing import Any

from petastorm.errors import NoDataAvailableError

__version__ = '0.14.0.dev0'

__all__ = ['NoDataAvailableError', 'TransformSpec', '__version__', 'make_batch_reader', 'make_reader', 'write_dataset']

_LAZY = {
    'make_reader': 'petastorm.reader',
    'make_batch_reader': 'petastorm.reader',
    'TransformSpec': 'petastorm.transform',
    'write_dataset': 'petastorm.writer',
}


def __getattr__(name: str) -> Any:
    # Resolved on first use so that `import petastorm` stays cheap.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
