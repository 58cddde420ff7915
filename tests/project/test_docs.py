"""The code blocks of README.md and docs/*.md run as pasted, and the files the pages name exist.

The convention the pages follow (README.md, "About the code blocks"):

* The fenced ``python`` blocks of one page run in order, in one namespace of one fresh interpreter, so a block
  may use what an earlier block of the same page defined. Other blocks (``sh``, ``text``) are not run.
* A block may be marked by an HTML comment on the line before its fence, ``<!-- docs-test: NAME -->``:
  ``spark`` needs pyspark and Java (the page is then skipped without them); ``s3`` talks to an S3-compatible
  server at ``http://127.0.0.1:9000`` with a bucket named ``bucket``, which the test provides (moto's server on a
  free port, the page's endpoint pointed at it).
* Pages write under ``/tmp/``. The test runs each page with ``/tmp/`` in its code replaced by a temporary
  directory (also the working directory), so that runs neither meet each other nor what a user left in /tmp.
  Nothing else of the code is changed, and the interpreter gets no ``PYSPARK_PYTHON``: a page that starts Spark
  must set it, as a user's script must. Its path holds the ``petastorm`` this run imports (a worktree's ``src``
  given on ``PYTHONPATH`` is what the pages run against, not the installed package).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
MARKERS = {'spark', 's3', 'gcs', 'azure'}
#: the S3 endpoint and bucket the pages marked ``s3`` use.
S3_ENDPOINT = 'http://127.0.0.1:9000'
S3_BUCKET = 'bucket'
#: the emulators' endpoints and bucket (container) the pages marked ``gcs`` and ``azure`` use.
GCS_ENDPOINT = 'http://127.0.0.1:4443'
GCS_BUCKET = 'gcs-bucket'
AZURE_ENDPOINT = 'http://127.0.0.1:10000'
AZURE_CONTAINER = 'container'
PAGE_TIMEOUT_SECONDS = 240

_MARKER = re.compile(r'^<!--\s*docs-test:\s*([\w\s,-]+?)\s*-->\s*$')
_FENCE = re.compile(r'^(`{3,})\s*([\w+-]*)')

# Runs the blocks of one page in order in one namespace. Each block is compiled under the page's path, padded so
# that a traceback names the page's own line numbers.
_RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {'__name__': '__main__'}
for block in blocks:
    code = compile('\\n' * (block['line'] - 1) + block['code'], block['page'], 'exec')
    print(f"--- {block['page']}:{block['line']}", flush=True)
    exec(code, namespace)
"""


@dataclasses.dataclass(frozen=True)
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the block's first code line
    language: str
    markers: frozenset[str]
    code: str


def page_blocks(page: pathlib.Path) -> list[Block]:
    """Every fenced code block of a Markdown page, with the markers of the comment line before it."""
    lines = page.read_text().splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, language = match.groups()
        end = index + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        if end == len(lines):
            raise AssertionError(f'{page.name}:{index + 1}: a code block is never closed')
        before = next((line for line in reversed(lines[:index]) if line.strip()), '')
        marker = _MARKER.match(before)
        markers = frozenset(m for m in re.split(r'[\s,]+', marker.group(1)) if m) if marker else frozenset()
        blocks.append(Block(page, index + 2, language.lower(), markers, '\n'.join(lines[index + 1:end]) + '\n'))
        index = end + 1
    return blocks


def python_blocks(page: pathlib.Path) -> list[Block]:
    return [block for block in page_blocks(page) if block.language in ('python', 'py')]


def _page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def _package_root() -> pathlib.Path:
    """The directory holding the ``petastorm`` package this run imports."""
    import petastorm

    return pathlib.Path(petastorm.__file__).resolve().parents[1]


def _java_available() -> bool:
    import shutil

    java_home = os.environ.get('JAVA_HOME')
    return shutil.which('java') is not None or bool(java_home and (pathlib.Path(java_home) / 'bin' / 'java').exists())


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ('PYSPARK_PYTHON', 'PYSPARK_DRIVER_PYTHON', 'PYTHONPATH')}
    # The pages run against the package under test (a source tree on this run's path, or the installed one), not
    # whatever the interpreter would find first with the rest of this run's path.
    env['PYTHONPATH'] = str(_package_root())
    env.setdefault('SPARK_LOCAL_IP', '127.0.0.1')
    # The quick JIT tier and the serial collector start the JVM in about half the time; no effect on the code.
    env.setdefault('PYSPARK_SUBMIT_ARGS',
                   '--driver-java-options "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" pyspark-shell')
    return env


def run_page(page: pathlib.Path, workdir: pathlib.Path, replacements: dict[str, str] | None = None) -> str:
    """Run the page's python blocks in a fresh interpreter in ``workdir``; return its output, fail with it."""
    replacements = {'/tmp/': f'{workdir}/', **(replacements or {})}
    blocks = []
    for block in python_blocks(page):
        code = block.code
        for old, new in replacements.items():
            code = code.replace(old, new)
        blocks.append({'page': str(page), 'line': block.line, 'code': code})
    blocks_file = workdir / f'.{page.stem}-blocks.json'
    blocks_file.write_text(json.dumps(blocks))
    completed = subprocess.run([sys.executable, '-c', _RUNNER, str(blocks_file)], cwd=workdir, env=_environment(),
                               capture_output=True, text=True, timeout=PAGE_TIMEOUT_SECONDS, check=False)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f'the code of {_page_id(page)} failed:\n{output[-6000:]}'
    return completed.stdout


def _page_params():
    params = []
    for page in PAGES:
        if not python_blocks(page):
            continue
        markers = set().union(*(block.markers for block in python_blocks(page)))
        marks = [pytest.mark.spark] if 'spark' in markers else []
        params.append(pytest.param(page, marks=marks, id=_page_id(page)))
    return params


@pytest.mark.parametrize('page', PAGES, ids=_page_id)
def test_python_blocks_compile_and_use_only_known_markers(page):
    for block in page_blocks(page):
        where = f'{_page_id(page)}:{block.line}'
        assert block.language, f'{where}: name the language of the block (python, sh, text)'
        assert block.markers <= MARKERS, f'{where}: unknown marker(s) {sorted(block.markers - MARKERS)}'
        if block.markers:
            assert block.language in ('python', 'py'), f'{where}: only python blocks are run, so only they take markers'
        if block.language in ('python', 'py'):
            compile(block.code, where, 'exec')


def test_every_page_with_python_has_some():
    # The extraction itself works: the pages known to hold runnable code yield blocks.
    counts = {_page_id(page): len(python_blocks(page)) for page in PAGES}
    assert counts['README.md'] >= 3
    assert counts['docs/distributed.md'] >= 3
    assert counts['docs/spark_converter.md'] >= 1
    assert counts['docs/storage.md'] >= 2


@pytest.mark.parametrize('page', _page_params())
def test_page_runs_as_pasted(page, tmp_path, request):
    markers = set().union(*(block.markers for block in python_blocks(page)))
    replacements = {}
    if 'spark' in markers:
        pytest.importorskip('pyspark')
        if not _java_available():
            pytest.skip('Spark needs Java')
    if 's3' in markers:
        s3fs = pytest.importorskip('s3fs')
        pytest.importorskip('moto')
        from support.s3_loopback import MotoServer

        server = MotoServer()
        request.addfinalizer(server.stop)
        s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True).mkdir(S3_BUCKET)
        replacements[S3_ENDPOINT] = server.endpoint
    replacements.update(_cloud_emulators(markers, request))
    output = run_page(page, tmp_path, replacements)
    if page.name == 'README.md':
        # The first block trains: its last loss is well below the 1.39 of guessing among four classes.
        loss = float(re.search(r'loss after 3 epochs: ([\d.]+)', output).group(1))
        assert loss < 1.0, output
        # A user runs the README again, or after `make demo`: nothing it wrote may be in the way of the next run.
        run_page(page, tmp_path, replacements)


def _cloud_emulators(markers: set[str], request) -> dict[str, str]:
    """Start the emulators the page's ``gcs`` and ``azure`` blocks use; the endpoints the pages name -> theirs."""
    import pyarrow.fs as pafs

    from support.cloud_emulators import Azurite, FakeGcs, azurite_missing, fake_gcs_binary

    replacements = {}
    if 'gcs' in markers:
        if fake_gcs_binary() is None:
            pytest.skip('fake-gcs-server is not installed (the test extra)')
        gcs = FakeGcs()
        request.addfinalizer(gcs.stop)
        pafs.GcsFileSystem(anonymous=True, scheme='http', endpoint_override=f'127.0.0.1:{gcs.port}',
                           project_id='docs').create_dir(GCS_BUCKET)
        replacements[GCS_ENDPOINT] = gcs.endpoint
    if 'azure' in markers:
        reason = azurite_missing()
        if reason:
            pytest.skip(reason)
        azurite = Azurite()
        request.addfinalizer(azurite.stop)
        pafs.AzureFileSystem(account_name='devstoreaccount1', account_key=azurite.connection_string().split(
            'AccountKey=')[1].split(';')[0], blob_storage_authority=f'127.0.0.1:{azurite.port}',
            blob_storage_scheme='http', dfs_storage_authority=f'127.0.0.1:{azurite.port}',
            dfs_storage_scheme='http').create_dir(AZURE_CONTAINER)
        replacements[AZURE_ENDPOINT] = azurite.endpoint
    return replacements


def test_pages_write_nothing_where_the_demo_writes():
    demo = (ROOT / 'examples' / 'demo.py').read_text()
    demo_path = re.search(r"'--output-url', default='file://([^']+)'", demo).group(1)
    for page in PAGES:
        for block in python_blocks(page):
            assert demo_path not in block.code, f'{_page_id(page)}:{block.line} writes to {demo_path}, as the demo does'


def _console_scripts() -> set[str]:
    tomllib = pytest.importorskip('tomllib')
    return set(tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['scripts'])


def test_files_the_pages_name_exist():
    """Every ``*.py`` a page names in backticks is a file of the project (or one of its command-line tools)."""
    scripts = _console_scripts()
    files = {path.relative_to(ROOT).as_posix() for path in ROOT.rglob('*.py')
             if not {'.venv', 'build', '.git'} & set(path.relative_to(ROOT).parts)}
    names = {path.rsplit('/', 1)[-1] for path in files}
    missing = []
    for page in PAGES:
        for span in re.findall(r'`([^`\n]+)`', page.read_text()):
            for token in re.findall(r'[\w./-]+\.py\b', span):
                token = token.lstrip('./')
                known = token in files or token in scripts or ('/' not in token and token in names)
                known = known or any(path.endswith('/' + token) for path in files)
                if not known:
                    missing.append(f'{_page_id(page)}: {token}')
    assert not missing, f'the pages name files the project does not have: {missing}'
