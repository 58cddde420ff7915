"""petastorm-throughput.py and petastorm.benchmark.throughput, run on a small dataset written here."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from petastorm import write_dataset
from petastorm.benchmark.throughput import BenchmarkResult, ReadMethod, WorkerPoolType, reader_throughput
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

Schema = Unischema('ThroughputSchema', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                                        UnischemaField('vec', np.float32, (4,), NdarrayCodec(), False)])
RESULT_LINE = re.compile(r'^Average sample read rate: (\d+\.\d\d) samples/sec; RAM (\d+\.\d\d) MB \(rss\); '
                         r'CPU (\d+\.\d\d)%$')


@pytest.fixture(scope='module')
def dataset_url(tmp_path_factory):
    url = tmp_path_factory.mktemp('throughput').joinpath('ds').as_uri()
    write_dataset(url, Schema, ({'id': i, 'vec': np.full(4, i, np.float32)} for i in range(200)),
                  row_group_size_mb=0.002)
    return url


def _cli(*args):
    return subprocess.run([sys.executable, '-m', 'petastorm.benchmark.cli', *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_help_lists_petastorm_flags():
    completed = _cli('--help')
    assert completed.returncode == 0
    for flag in ('--field-regex', '--workers-count', '--pool-type', '--warmup-cycles', '--measure-cycles',
                 '--profile-threads', '--read-method', '--shuffling-queue-size', '--min-after-dequeue', '-vv',
                 '--batch', '--json'):
        assert flag in completed.stdout


def test_run_prints_the_petastorm_result_line(dataset_url):
    completed = _cli(dataset_url, '-m', '10', '-n', '300', '-w', '2', '-p', 'thread', '--field-regex', 'id.*',
                     '--progress')
    assert completed.returncode == 0, completed.stderr
    rate, ram, cpu = (float(g) for g in RESULT_LINE.match(completed.stdout.strip().splitlines()[-1]).groups())
    assert rate > 0
    assert ram > 10
    assert cpu >= 0
    assert 'measure: 300/300' in completed.stderr


def test_json_output_of_a_batch_run(dataset_url):
    completed = _cli(dataset_url, '-m', '2', '-n', '20', '--batch', '--json', '-p', 'dummy')
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result['samples_per_second'] > 0
    assert result['rss_bytes'] > 0
    assert result['batch'] is True
    assert result['measure_cycles'] == 20
    assert result['pool_type'] == 'dummy'
    assert completed.stderr.count('\r') == 0  # no progress when stderr is not a terminal


@pytest.mark.parametrize('url', ['file:///nonexistent/petastorm/dataset', 'nosuchscheme://x/y'])
def test_bad_url_is_one_line_error(url):
    completed = _cli(url, '-n', '5')
    assert completed.returncode != 0
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith('petastorm-throughput.py: error:')


def test_tf_read_method_without_tensorflow_names_the_extra(dataset_url):
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        completed = _cli(dataset_url, '-d', 'tf', '-n', '5')
        assert completed.returncode != 0
        assert "petastorm[tf]" in completed.stderr
    else:
        pytest.skip('TensorFlow is installed')


def test_reader_throughput_in_process(dataset_url):
    progress = []
    result = reader_throughput(dataset_url, ['id'], warmup_cycles_count=5, measure_cycles_count=50,
                               pool_type=WorkerPoolType.NONE, loaders_count=1, spawn_new_process=False,
                               on_progress=lambda phase, done, total: progress.append((phase, done, total)))
    assert isinstance(result, BenchmarkResult)
    assert result.samples_per_second == pytest.approx(1 / result.time_mean)
    assert result.memory_info.rss > 0
    assert result.cpu >= 0
    assert progress[-1] == ('measure', 50, 50)


def test_reader_throughput_spawned_reports_child_errors_readably(dataset_url):
    with pytest.raises(RuntimeError, match='matches no field'):
        reader_throughput(dataset_url, ['no_such_field'], warmup_cycles_count=1, measure_cycles_count=1)


def test_enum_values_and_import_without_tensorflow():
    assert [t.value for t in WorkerPoolType] == ['thread', 'process', 'dummy']
    assert (ReadMethod.TF.value, ReadMethod.PYTHON.value) == ('tf', 'python')
    code = 'import sys, petastorm.benchmark.cli; print("tensorflow" in sys.modules)'
    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          check=True).stdout.strip() == 'False'


def test_without_psutil_memory_and_cpu_come_from_resource(dataset_url, monkeypatch):
    from petastorm.benchmark.throughput import MemoryInfo

    monkeypatch.setitem(sys.modules, 'psutil', None)  # makes `import psutil` raise ImportError
    result = reader_throughput(dataset_url, warmup_cycles_count=1, measure_cycles_count=20,
                               pool_type='dummy', spawn_new_process=False)
    assert isinstance(result.memory_info, MemoryInfo)
    assert result.memory_info.rss > 0
    assert result.cpu >= 0
