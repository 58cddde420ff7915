"""The distribution's name: not Uber's ``petastorm`` on the package index, and every install hint names it.

The import name stays ``petastorm``; what pip installs is ``neo-petastorm``, so a hint that says
``pip install 'petastorm[torch]'`` would install Uber's Petastorm 0.13.1 instead of the missing extra.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import sys

import pytest

from petastorm._optional import _EXTRA_FOR_MODULE, import_optional
from petastorm.errors import MissingDependencyError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DISTRIBUTION = 'neo-petastorm'

# `pip install NAME[extra]`, quoted or not; NAME is what pip would install.
_HINT = re.compile(r"""pip install\s+(?:-e\s+)?['"]?([\w.\-]+)\[""")


def _pyproject() -> dict:
    tomllib = pytest.importorskip('tomllib')
    return tomllib.loads((ROOT / 'pyproject.toml').read_text())


def _hint_sources() -> list[pathlib.Path]:
    sources = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
    for folder in ('src', 'examples', 'benchmarks'):
        sources += sorted((ROOT / folder).rglob('*.py'))
    return sources


def test_pyproject_names_the_distribution_and_its_own_extras_by_it():
    project = _pyproject()['project']
    assert project['name'] == DISTRIBUTION
    for extra, requirements in project['optional-dependencies'].items():
        for requirement in requirements:
            name = re.match(r'[\w.\-]+', requirement).group(0)
            assert name != 'petastorm', f'extra {extra!r} requires Uber\'s petastorm ({requirement!r})'


def test_the_installed_distribution_provides_petastorm():
    assert DISTRIBUTION in importlib.metadata.packages_distributions().get('petastorm', [])
    assert importlib.metadata.metadata(DISTRIBUTION)['Name'] == DISTRIBUTION


def test_every_pip_install_hint_names_the_distribution():
    wrong = []
    for path in _hint_sources():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for name in _HINT.findall(line):
                if name not in (DISTRIBUTION, '.'):  # '.' is a checkout
                    wrong.append(f'{path.relative_to(ROOT)}:{number}: {line.strip()}')
    assert not wrong, f'pip install hints that do not name {DISTRIBUTION}:\n' + '\n'.join(wrong)


def test_hints_name_extras_the_distribution_has():
    extras = set(_pyproject()['project']['optional-dependencies'])
    for path in _hint_sources():
        for hint in re.findall(rf"{DISTRIBUTION}\[([\w,]+)\]", path.read_text()):
            unknown = set(hint.split(',')) - extras - {'extra'}
            assert not unknown, f'{path.relative_to(ROOT)} names unknown extra(s) {sorted(unknown)}'


@pytest.mark.parametrize(('module', 'extra'), sorted(_EXTRA_FOR_MODULE.items()))
def test_missing_optional_package_message_names_the_distribution(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    with pytest.raises(MissingDependencyError, match=re.escape(f"pip install '{DISTRIBUTION}[{extra}]'")):
        import_optional(module, 'this feature')
