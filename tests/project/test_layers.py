"""The package's shape holds: imports point down the layers, and neither modules nor folders import in a circle.

Every ``import`` statement of ``src/petastorm`` counts, at module level or inside a function: a lazy import is
still a dependency. The layers are those of ``docs/architecture.md``; a new module must be given one here.

Within one layer, the folders (packages) depend on each other one way: two folders whose modules import each other
(``a/x.py`` imports ``b``, ``b/y.py`` imports ``a/z.py``) are one subsystem cut in two, even when no single module
is in a circle. A folder is a package of the tree, whatever its name; a folder that spans two layers on purpose
(``reading/``) counts as one folder per layer, and each module loose at the top of the package is a folder of its
own.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Mapping

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[2] / 'src'

#: Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ('foundation', ('petastorm.errors', 'petastorm._checks', 'petastorm._optional', 'petastorm._describe',
                    'petastorm._progress', 'petastorm._warnings', 'petastorm._compat', 'petastorm.stage_timing')),
    ('model', ('petastorm.columns', 'petastorm.unischema', 'petastorm.codecs', 'petastorm.typemaps',
               'petastorm.transform', 'petastorm.predicates', 'petastorm.selectors', 'petastorm.ngram',
               'petastorm.generator')),
    ('storage', ('petastorm.fs', 'petastorm.fs_utils', 'petastorm.hdfs', 'petastorm.store', 'petastorm.metadata',
                 'petastorm.writer', 'petastorm.writing', 'petastorm.cache', 'petastorm.local_disk_cache',
                 'petastorm.tables')),
    ('plan', ('petastorm.plan',)),
    ('execution', ('petastorm.reading.worker', 'petastorm.reading.media_paths', 'petastorm.reading.batch',
                   'petastorm.reading.column_transform',
                   'petastorm.pools', 'petastorm.shuffle', 'petastorm.workers_pool', 'petastorm.reader_impl')),
    ('api', ('petastorm', 'petastorm.reading', 'petastorm.reader', 'petastorm.weighted_sampling_reader',
             'petastorm.utils')),
    ('adapters', ('petastorm.pytorch', 'petastorm.tf_utils', 'petastorm.spark', 'petastorm.spark_utils',
                  'petastorm.ray', 'petastorm.etl', 'petastorm.tools', 'petastorm.cli', 'petastorm.benchmark',
                  'petastorm.test_util', 'petastorm.torchdata', 'petastorm.jax', 'petastorm.tokens',
                  'petastorm.reader_impl.pytorch_shuffling_buffer')),
)

#: Upward imports that are allowed, each for a stated reason: (importer, imported).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ('petastorm.unischema', 'petastorm.tf_utils._dtypes'):
        'Unischema.as_tf_dtypes() and petastorm.unischema.numpy_to_tf_dtype (two imports) stay where Petastorm\'s '
        'users call them; the TensorFlow type table they call needs TensorFlow, so it lives in the TF adapter, '
        'imported only when they are called',
}


def layer_of(module: str) -> int | None:
    """Index of the layer of ``module`` in :data:`LAYERS`, or None when no prefix names it."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + '.')) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def source_modules(root: pathlib.Path = SOURCE) -> dict[str, pathlib.Path]:
    """``{module name: file}`` of every module of the package under ``root`` (compiled ones by their stubs)."""
    modules = {}
    package = root / 'petastorm'
    for path in sorted([*package.rglob('*.py'), *package.rglob('*.pyi')]):
        parts = path.relative_to(root).with_suffix('').parts
        name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
        modules[name] = path
    return modules


def imports_of(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> Iterator[tuple[str, int]]:
    """``(imported petastorm module, line)`` of every import statement in the file, nested ones included."""
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) - node.level + 1]
                origin = '.'.join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ''
            # ``from package import submodule`` depends on the submodule; ``from module import name`` on the module.
            targets = [f'{origin}.{alias.name}' if f'{origin}.{alias.name}' in modules else origin
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition('.')[0]
            if target and target != module:
                yield target, node.lineno


def import_graph(root: pathlib.Path = SOURCE) -> dict[str, dict[str, int]]:
    """``{module: {imported module: first line}}`` over the whole package."""
    modules = source_modules(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(module, path, modules):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """One line per import that points to a higher layer (and is not allowed)."""
    found = []
    for module, edges in sorted(graph.items()):
        own = layer_of(module)
        for target, line in sorted(edges.items()):
            other = layer_of(target)
            if own is not None and other is not None and other > own and (module, target) not in ALLOWED_UPWARD:
                found.append(f'{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[other][0]}) at line {line}')
    return found


def import_cycles(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """The groups of modules (or folders) that import each other in a circle (strongly connected, more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def folder_of(module: str, modules: dict[str, pathlib.Path]) -> str:
    """The folder ``module`` belongs to, with its layer: ``'petastorm.codecs (model)'``.

    The folder is the package holding the module (a package's ``__init__`` belongs to the package itself); a module
    loose at the top of ``petastorm`` is a folder of its own.
    """
    path = modules[module]
    folder = module if path.stem == '__init__' else module.rpartition('.')[0]
    if folder == 'petastorm':
        folder = module
    layer = layer_of(module)
    return f'{folder} ({"?" if layer is None else LAYERS[layer][0]})'


def folder_graph(graph: dict[str, dict[str, int]], root: pathlib.Path = SOURCE) -> dict[str, dict[str, str]]:
    """``{folder: {imported folder of the same layer: 'module imports module at line n'}}`` (the first such import).

    Imports across layers are left out: one that points up is :func:`upward_imports`' to report.
    """
    modules = source_modules(root)
    folders: dict[str, dict[str, str]] = {}
    for module, edges in sorted(graph.items()):
        own = folder_of(module, modules)
        targets = folders.setdefault(own, {})
        for target, line in sorted(edges.items()):
            other = folder_of(target, modules)
            if other != own and layer_of(target) == layer_of(module):
                targets.setdefault(other, f'{module} imports {target} at line {line}')
    return folders


def folder_cycles(folders: dict[str, dict[str, str]]) -> list[str]:
    """One line per import that closes a circle of folders of one layer, grouped by circle."""
    found = []
    for group in import_cycles(folders):
        members = set(group)
        found.extend(f'{folder} -> {target}: {why}' for folder in group
                     for target, why in sorted(folders[folder].items()) if target in members)
    return found


@pytest.fixture(scope='module')
def graph() -> dict[str, dict[str, int]]:
    return import_graph()


def test_every_module_has_a_layer(graph):
    assert [module for module in graph if layer_of(module) is None] == []


def test_imports_point_down_the_layers(graph):
    assert upward_imports(graph) == []


def test_no_import_cycles(graph):
    assert import_cycles(graph) == []


def test_no_folder_cycles(graph):
    assert folder_cycles(folder_graph(graph)) == []


def test_allowed_upward_imports_still_exist(graph):
    stale = [pair for pair in ALLOWED_UPWARD if pair[1] not in graph.get(pair[0], {})]
    assert stale == [], 'remove allowances for imports that are gone'


def _write_package(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / 'petastorm' / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    # The checks themselves, on a small package: a planner importing the torch adapter lazily, and two modules
    # of one layer importing each other.
    _write_package(tmp_path, {
        '__init__.py': '',
        'plan/__init__.py': 'def f():\n    from petastorm.pytorch import DataLoader\n',
        'pytorch/__init__.py': 'DataLoader = None\n',
        'unischema.py': 'from petastorm import codecs\n',
        'codecs/__init__.py': 'def g():\n    import petastorm.unischema\n',
    })
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == ['petastorm.plan (plan) imports petastorm.pytorch (adapters) at line 2']
    assert import_cycles(graph) == [['petastorm.codecs', 'petastorm.unischema']]


def test_the_checks_catch_a_cycle_of_folders(tmp_path):
    # Two folders of one layer whose modules import each other, with no module in a circle; a folder that spans two
    # layers (its lower module imported from below, its upper module importing from below) is not a circle; nor are
    # a package's own modules importing each other.
    _write_package(tmp_path, {
        '__init__.py': '',
        'codecs/__init__.py': 'from petastorm.codecs import _scalar\n',
        'codecs/_scalar.py': 'from petastorm.typemaps import scalars\n',
        'typemaps/__init__.py': '',
        'typemaps/scalars.py': '',
        'typemaps/hf.py': 'from petastorm.codecs import _scalar\n',
        'pools/__init__.py': 'from petastorm.reading import batch\n',
        'reading/__init__.py': 'from petastorm.reading import setup\n',
        'reading/batch.py': '',
        'reading/setup.py': 'import petastorm.pools\nfrom petastorm.reading import batch\n',
    })
    graph = import_graph(tmp_path)
    assert import_cycles(graph) == []
    assert upward_imports(graph) == []
    assert folder_cycles(folder_graph(graph, tmp_path)) == [
        'petastorm.codecs (model) -> petastorm.typemaps (model): petastorm.codecs._scalar imports '
        'petastorm.typemaps.scalars at line 1',
        'petastorm.typemaps (model) -> petastorm.codecs (model): petastorm.typemaps.hf imports '
        'petastorm.codecs._scalar at line 1',
    ]
