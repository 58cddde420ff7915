"""`import petastorm` and its core modules stay light: no framework or image library is loaded."""

import subprocess
import sys

import pytest

HEAVY = ('torch', 'tensorflow', 'pyspark', 'cv2', 'PIL')
CORE_MODULES = ['petastorm', 'petastorm.unischema', 'petastorm.codecs', 'petastorm.etl.dataset_metadata',
                'petastorm.utils', 'petastorm.writer', 'petastorm.metadata.legacy', 'petastorm.generator',
                'petastorm.tf_utils', 'petastorm.reader', 'petastorm.reading', 'petastorm.typemaps.scalars',
                'petastorm.cli']


@pytest.mark.parametrize('module', CORE_MODULES)
def test_core_import_loads_no_heavy_framework(module):
    code = (f'import sys, {module}\n'
            f'print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})))')
    loaded = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == '', f'importing {module} loaded {loaded}'


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    from petastorm._optional import import_optional
    from petastorm.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, 'cv2', None)  # makes `import cv2` raise ImportError
    with pytest.raises(MissingDependencyError, match=r"petastorm\[image\]"):
        import_optional('cv2', 'CompressedImageCodec')
