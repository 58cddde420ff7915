"""petastorm: Parquet datasets of scalars, n-d arrays and images for PyTorch and TensorFlow training.

Nothing heavy is imported here: torch, TensorFlow, pyspark and OpenCV load only when a feature needs them.
"""

from __future__ import annotations

from typing import Any

from petastorm.errors import NoDataAvailableError

__version__ = '0.14.0.dev0'

__all__ = ['NoDataAvailableError', 'write_dataset', '__version__']


def __getattr__(name: str) -> Any:
    # Resolved on first use so that `import petastorm` stays cheap.
    if name == 'write_dataset':
        from petastorm.writer import write_dataset

        return write_dataset
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
