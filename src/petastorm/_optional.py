"""Lazy imports of optional, heavy dependencies, with an error that says which pip extra brings them."""

from __future__ import annotations

import importlib
from types import ModuleType

from petastorm.errors import MissingDependencyError

# The name pip knows this package by; the import name stays ``petastorm``.
_DISTRIBUTION = 'neo-petastorm'

_EXTRA_FOR_MODULE = {
    'cv2': 'image',
    'torch': 'torch',
    'tensorflow': 'tf',
    'pyspark': 'spark',
    's3fs': 's3',
    'gcsfs': 'gcs',
    'adlfs': 'azure',
    'ray': 'ray',
    'deltalake': 'delta',
    'pyiceberg': 'iceberg',
    'torchdata': 'torchdata',
    'jax': 'jax',
    'grain': 'jax',
    'av': 'media',
    'soundfile': 'media',
    'soxr': 'media',
}


def import_optional(module_name: str, feature: str) -> ModuleType:
    """Import ``module_name`` or raise :class:`MissingDependencyError` naming ``feature`` and the pip extra.

    Args:
        module_name: dotted module to import (``'cv2'``, ``'pyspark.sql.types'``, ...).
        feature: what the caller needed it for, used in the message.
    """
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        top = module_name.split('.')[0]
        extra = _EXTRA_FOR_MODULE.get(top)
        hint = f"pip install '{_DISTRIBUTION}[{extra}]'" if extra else f'pip install {top}'
        raise MissingDependencyError(
            f'{feature} needs the optional package {top!r}, which could not be imported ({err}). '
            f'Install it with: {hint}') from err
