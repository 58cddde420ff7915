"""Every public module says what it exports: an ``__all__``, sorted as ruff sorts it (RUF022), whose every name exists.

A module is public when no part of its path starts with an underscore. ``__all__`` is what ``from module import *``
takes and what a reader looks at first; a name that does not exist there would fail only the star import.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[2] / 'src'


def _public_modules() -> list[str]:
    names = []
    for path in sorted((SOURCE / 'petastorm').rglob('*.py')):
        parts = path.relative_to(SOURCE).with_suffix('').parts
        if any(part.startswith('_') and part != '__init__' for part in parts):
            continue
        names.append('.'.join(parts[:-1] if parts[-1] == '__init__' else parts))
    return names


def _declared_all(module: str) -> list[str] | None:
    """The module's ``__all__`` as written in its source (None when it has none), without importing it."""
    relative = module.replace('.', '/')
    path = SOURCE / f'{relative}.py'
    if not path.exists():
        path = SOURCE / relative / '__init__.py'
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == '__all__' for target in targets):
            return list(ast.literal_eval(node.value)) if node.value is not None else []
    return None


def _isort_order(name: str) -> tuple[int, list[int | str]]:
    """Ruff's isort-style order of ``__all__`` (RUF022): CONSTANTS, then CamelCase names, then the rest, naturally."""
    group = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return group, [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', name)]


PUBLIC = _public_modules()


def test_every_public_module_declares_a_sorted_all():
    missing = [m for m in PUBLIC if _declared_all(m) is None]
    assert missing == []
    unsorted = [m for m in PUBLIC if (names := _declared_all(m)) is not None
                and names != sorted(names, key=_isort_order)]
    assert unsorted == []


@pytest.mark.parametrize('module', PUBLIC)
def test_every_name_in_all_exists(module):
    names = _declared_all(module) or []
    loaded = importlib.import_module(module)
    assert [name for name in names if not hasattr(loaded, name)] == []
    assert len(set(names)) == len(names)
