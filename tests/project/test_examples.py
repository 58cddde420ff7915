"""The scripts under examples/: the demo trains, the Spark-free writer writes, and Spark examples find petastorm.

The Spark example runs as a user runs it: ``.venv/bin/python examples/...`` in a fresh interpreter, with no
``PYSPARK_PYTHON`` and without the virtual environment on ``PATH``, so Spark's workers would start whatever other
``python3`` the machine has unless the example names this interpreter.
"""

from __future__ import annotations

import ast
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from petastorm import make_reader

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / 'examples'


def _run(args: list[str], timeout: float, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ('PYSPARK_PYTHON', 'PYSPARK_DRIVER_PYTHON')}
    env.setdefault('SPARK_LOCAL_IP', '127.0.0.1')
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _spark_examples() -> list[pathlib.Path]:
    return sorted(path for path in EXAMPLES.rglob('*.py') if re.search(r'^\s*(from|import) pyspark', path.read_text(),
                                                                       re.MULTILINE))


@pytest.mark.torch
def test_demo_writes_an_image_dataset_and_trains_from_it(tmp_path):
    pytest.importorskip('torch')
    pytest.importorskip('cv2')
    url = f'file://{tmp_path}/demo'
    completed = _run([str(EXAMPLES / 'demo.py'), '--output-url', url, '--rows', '256', '--epochs', '2',
                      '--log-every', '2'], timeout=180)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    out = completed.stdout
    assert re.search(r'wrote 256 images .* row groups', out), out
    step_lines = [line for line in out.splitlines() if line.startswith('step ')]
    assert len(step_lines) == 4, out  # 512 samples in batches of 64, a line every 2 steps
    assert all('samples/s' in line and 'loss' in line for line in step_lines), out
    summary = out.splitlines()[-1]
    assert re.match(r'trained 8 steps on 512 samples in [\d.]+ s: [\d,]+ samples/s; last loss [\d.]+', summary), out
    assert math.isfinite(float(re.search(r'last loss ([\d.]+)', summary).group(1)))
    with make_reader(url, reader_pool_type='dummy', num_epochs=1) as reader:
        rows = list(reader)
    assert len(rows) == 256
    assert rows[0].image.shape == (32, 32, 3)
    assert {int(row.label) for row in rows} == {0, 1, 2, 3}


def test_spark_free_hello_world_writer(tmp_path, capsys):
    pytest.importorskip('cv2')
    import importlib.util

    spec = importlib.util.spec_from_file_location('_write_hello_world',
                                                  EXAMPLES / 'hello_world' / 'write_hello_world_dataset.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    url = f'file://{tmp_path}/hello'
    module.main(url)
    module.main(url)  # again: it replaces what it wrote
    assert capsys.readouterr().out.count('read id=') == 20
    with make_reader(url, reader_pool_type='dummy') as reader:
        assert sorted(int(row.id) for row in reader) == list(range(10))


def test_every_spark_example_names_this_interpreter_for_the_workers():
    examples = _spark_examples()
    assert examples, 'expected at least the hello-world generator'
    for path in examples:
        tree = ast.parse(path.read_text())
        calls = [node for node in tree.body if isinstance(node, ast.Expr) and 'PYSPARK_PYTHON' in ast.unparse(node)]
        assert any(ast.unparse(node) == "os.environ.setdefault('PYSPARK_PYTHON', sys.executable)" for node in calls), \
            f'{path.name} must set PYSPARK_PYTHON (to sys.executable unless the user set it) at module level'


@pytest.mark.spark
@pytest.mark.slow
def test_spark_example_runs_without_an_activated_environment(tmp_path):
    pytest.importorskip('pyspark')
    venv_bin = str(pathlib.Path(sys.executable).parent)
    path = os.pathsep.join(entry for entry in os.environ.get('PATH', '').split(os.pathsep) if entry != venv_bin)
    url = f'file://{tmp_path}/hello_world'
    completed = _run([str(EXAMPLES / 'hello_world' / 'generate_hello_world_dataset.py'), url], timeout=280,
                     PATH=path, VIRTUAL_ENV=None,
                     PYSPARK_SUBMIT_ARGS='--driver-java-options "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" '
                                         'pyspark-shell')
    assert completed.returncode == 0, completed.stderr[-4000:]
    with make_reader(url, reader_pool_type='dummy') as reader:
        assert sorted(int(row.id) for row in reader) == list(range(10))
