"""The shape of the source tree, for before/after notes of a restructuring.

Prints: files and lines per package, the longest functions, modules over 500 lines, ruff's complexity findings
(C901 at its default limit of 10) and the members of the seam protocols the loaders implement.

    python benchmarks/code_shape.py [--root src/petastorm] [--top 15]
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# The protocols every loader, mixer or store implements: (module path under the root, class names).
SEAMS = (
    ('reading/source.py', ('ColumnSource', 'BatchSource', 'PositionSource')),
    ('store/model.py', ('Store',)),
    ('store/pieces.py', ('LogicalRows',)),
)


def package_lines(root: Path) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in sorted(root.rglob('*.py')):
        relative = path.relative_to(root)
        package = relative.parts[0] if len(relative.parts) > 1 else '(top level)'
        counts[package][0] += 1
        counts[package][1] += len(path.read_text().splitlines())
    return {name: (files, lines) for name, (files, lines) in sorted(counts.items())}


def functions(root: Path) -> list[tuple[int, int, str]]:
    """(lines, lines without the docstring, name) of every function, longest first."""
    found = []
    for path in sorted(root.rglob('*.py')):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                docstring = 0
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                        isinstance(first.value.value, str):
                    docstring = (first.end_lineno or first.lineno) - first.lineno + 1
                found.append((length, length - docstring, f'{path.relative_to(root)}:{node.name}'))
    return sorted(found, reverse=True)


def long_modules(root: Path, limit: int = 500) -> list[tuple[int, str]]:
    sizes = [(len(p.read_text().splitlines()), str(p.relative_to(root))) for p in root.rglob('*.py')]
    return sorted((size, name) for size, name in sizes if size > limit)[::-1]


def complexity_findings(root: Path) -> int:
    ruff = Path(sys.executable).with_name('ruff')
    result = subprocess.run([str(ruff), 'check', '--select', 'C901', '--output-format', 'concise', '--quiet',
                             str(root)], capture_output=True, text=True, check=False)
    return sum(1 for line in result.stdout.splitlines() if 'C901' in line)


def seam_members(root: Path) -> dict[str, int]:
    members = {}
    for module, classes in SEAMS:
        path = root / module
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in classes:
                members[f'{module}:{node.name}'] = sum(
                    1 for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.AnnAssign)))
    return members


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--root', default='src/petastorm')
    parser.add_argument('--top', type=int, default=15)
    args = parser.parse_args()
    root = Path(args.root)

    print('## Files and lines per package')
    total_files = total_lines = 0
    for name, (files, lines) in package_lines(root).items():
        print(f'{name:24s} {files:4d} files {lines:7d} lines')
        total_files += files
        total_lines += lines
    print(f'{"total":24s} {total_files:4d} files {total_lines:7d} lines')
    print(f'\n## The {args.top} longest functions (lines; without the docstring)')
    for length, code, name in functions(root)[:args.top]:
        print(f'{length:4d} {code:4d}  {name}')
    print('\n## Modules over 500 lines')
    for size, name in long_modules(root):
        print(f'{size:4d}  {name}')
    print(f'\n## ruff C901 findings: {complexity_findings(root)}')
    print('\n## Members of the seam protocols')
    for name, count in seam_members(root).items():
        print(f'{count:3d}  {name}')


if __name__ == '__main__':
    main()
