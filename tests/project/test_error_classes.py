"""Every exception class of the package derives from ``PetastormError``, as ``petastorm.errors`` promises.

The check imports every module of the package (in a child process: the adapters load their frameworks) and looks
at every exception class defined there, public or private, so that a class added anywhere is checked. The few
exceptions that stay outside the tree are internal signals that never reach a caller; each is listed with the
reason, and the list must name only classes that exist.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[2] / 'src'

#: Exception classes that do not derive from PetastormError, by ``module:qualified name``, each with its reason.
INTERNAL_SIGNALS: dict[str, str] = {
    'petastorm.fs._errors:ShortReadError':
        'a ranged read cut short, raised for the retry loop to try again; PetastormErrors are never retried, and '
        'when the retries run out it is translated into a StorageError naming the URL (only its __cause__)',
    'petastorm.fs._versions:VersionGone':
        'a read of the listed version of an object refused by the store, raised to the fsspec layer, which raises '
        'DataFileChangedError naming the URL in its place (only its __cause__)',
    'petastorm.test_util._s3_requests:ErrorReply':
        'the loopback S3 server\'s way out of a request handler: caught by its connection and sent as the HTTP '
        'error answer',
}

_LIST_CLASSES = r'''
import importlib, inspect, json, pkgutil, sys
import petastorm
from petastorm.errors import PetastormError

found = {}
for info in pkgutil.walk_packages(petastorm.__path__, 'petastorm.'):
    module = importlib.import_module(info.name)
    for value in vars(module).values():
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith('petastorm'):
            found[f'{value.__module__}:{value.__qualname__}'] = issubclass(value, PetastormError)
json.dump(found, sys.stdout)
'''


@pytest.fixture(scope='module')
def exception_classes() -> dict[str, bool]:
    """``{'module:class': derives from PetastormError}`` for every exception class the package defines."""
    done = subprocess.run([sys.executable, '-c', _LIST_CLASSES], capture_output=True, text=True, check=True,
                          env={**os.environ, 'PYTHONPATH': str(SOURCE)})
    return json.loads(done.stdout)


def test_every_exception_class_derives_from_petastorm_error(exception_classes):
    outside = sorted(name for name, derives in exception_classes.items() if not derives)
    assert outside == sorted(INTERNAL_SIGNALS)


def test_the_walk_sees_the_classes_of_every_kind_of_module(exception_classes):
    # Public and private modules, packages and the adapters: the walk is not missing a part of the tree.
    for name in ('petastorm.errors:PetastormError', 'petastorm.errors:SchemaError', 'petastorm.cli:UsageError',
                 'petastorm.fs._retry:RetriesExhausted', 'petastorm.tf_utils._convert:RaggedColumnError',
                 'petastorm.pytorch._tensors:TorchTypeError', 'petastorm.benchmark.throughput:BenchmarkProcessError'):
        assert exception_classes.get(name) is True, name


@pytest.mark.parametrize(('name', 'builtin'), [
    ('petastorm.cli:UsageError', ValueError),
    ('petastorm.fs._retry:RetriesExhausted', OSError),
    ('petastorm.tf_utils._convert:RaggedColumnError', ValueError),
    ('petastorm.benchmark.throughput:BenchmarkProcessError', RuntimeError),
])
def test_errors_that_joined_the_tree_are_also_the_builtin_a_caller_catches(name, builtin):
    from petastorm.errors import PetastormError

    module, _, qualname = name.partition(':')
    cls = getattr(importlib.import_module(module), qualname)
    assert issubclass(cls, PetastormError)
    assert issubclass(cls, builtin)
