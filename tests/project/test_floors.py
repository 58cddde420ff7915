"""The floors pyproject.toml declares are what ``make test-floors`` installs (ci/floors.txt), and CI runs it."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLOORS = ROOT / 'ci' / 'floors.txt'
#: The extras the floor run installs beside the core dependencies.
FLOOR_EXTRAS = ('image', 'torch', 'spark')

_REQUIREMENT = re.compile(r'([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*>=\s*([0-9][0-9.]*)')


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split('.'))


def _declared() -> dict[str, str]:
    """``{package: floor}`` of the core dependencies and of the extras the floor run installs."""
    tomllib = pytest.importorskip('tomllib')
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    requirements = list(project['dependencies'])
    for extra in FLOOR_EXTRAS:
        requirements += project['optional-dependencies'][extra]
    declared = {}
    for requirement in requirements:
        match = _REQUIREMENT.fullmatch(requirement)
        assert match, f'pyproject.toml: {requirement!r} declares no floor (NAME>=VERSION)'
        declared[match.group(1).lower()] = match.group(2)
    return declared


def _pinned() -> dict[str, str]:
    pins = {}
    for line in FLOORS.read_text().splitlines():
        line = line.split('#')[0].strip()
        if line:
            name, _, version = line.partition('==')
            assert version, f'ci/floors.txt: {line!r} is not NAME==VERSION'
            pins[name.strip().lower()] = version.strip()
    return pins


def test_every_declared_floor_is_installed_by_the_floor_run():
    pinned = _pinned()
    for name, floor in _declared().items():
        assert name in pinned, f'ci/floors.txt does not pin {name} (pyproject.toml declares {name}>={floor})'
        # 4.11 is pinned as 4.11.0.86, 15 as 15.0.0: the pin is the floor's first release.
        assert _release(pinned[name])[:len(_release(floor))] == _release(floor), \
            f'ci/floors.txt pins {name}=={pinned[name]}, pyproject.toml declares {name}>={floor}'


def test_the_floor_run_uses_the_oldest_python_declared_and_ci_runs_it():
    tomllib = pytest.importorskip('tomllib')
    python = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['requires-python']
    assert python == '>=3.10'
    makefile = (ROOT / 'Makefile').read_text()
    assert 'python3.10' in makefile
    assert 'ci/floors.txt' in makefile
    assert 'make test-floors' in (ROOT / '.ci' / 'run').read_text()
