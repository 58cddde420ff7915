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
from petastorm.benchmark.stages import stage_breakdown
from petastorm.benchmark.throughput import (
    BenchmarkResult,
    Loader,
    ReadMethod,
    WorkerPoolType,
    measure_throughput,
    reader_throughput,
)
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
    import importlib.util

    if importlib.util.find_spec('tensorflow') is not None:  # finding is fast; importing TensorFlow is not
        pytest.skip('TensorFlow is installed')
    completed = _cli(dataset_url, '-d', 'tf', '-n', '5')
    assert completed.returncode != 0
    assert "petastorm[tf]" in completed.stderr


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


BREAKDOWN_ROW = re.compile(r'^  (I/O|filter|decode|transform|collate|queue wait)\s+(workers|consumer)\s+(\d+\.\d+)\s+'
                           r'(\d+)%$')


def test_torch_loader_run_prints_the_stage_breakdown_then_the_result_line(dataset_url):
    completed = _cli(dataset_url, '-m', '2', '-n', '10', '-w', '2', '--loader', 'torch', '--loader-batch-size', '16',
                     '-v')
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.strip().splitlines()
    assert RESULT_LINE.match(lines[-1])
    rows = {m.group(1): (m.group(2), float(m.group(3)), int(m.group(4)))
            for m in map(BREAKDOWN_ROW.match, lines) if m}
    assert set(rows) == {'I/O', 'filter', 'decode', 'transform', 'collate', 'queue wait'}
    assert rows['I/O'][1] > 0
    assert rows['collate'][0] == 'consumer'
    assert re.match(r'^Bottleneck: bound by (I/O|filter|decode|transform|collate) in the (workers|consumer)',
                    lines[-2])


def test_torch_batched_loader_json_counts_rows_and_names_the_bound_stage(dataset_url):
    completed = _cli(dataset_url, '-m', '2', '-n', '8', '--loader', 'torch-batched', '--loader-batch-size', '32',
                     '--json', '-p', 'dummy')
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert (result['loader'], result['loader_batch_size']) == ('torch-batched', 32)
    # A cycle is one 32-row batch: the rate counts rows, not batches.
    assert result['samples_per_second'] == pytest.approx(32 / result['time_mean'])
    stages = result['stages']
    assert stages['bound'] in ('io', 'filter', 'decode', 'transform', 'collate')
    assert stages['workers'] == 1  # the dummy pool works inline
    assert set(stages['shares']) == {'io', 'filter', 'decode', 'transform', 'collate', 'queue_wait'}
    assert stages['seconds']['collate'] + stages['seconds']['queue_wait'] <= stages['wall_seconds'] * 1.01


def test_loader_with_bad_url_is_one_line_error():
    completed = _cli('file:///nonexistent/petastorm/dataset', '--loader', 'torch', '-n', '5')
    assert completed.returncode != 0
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith('petastorm-throughput.py: error:')


def test_loader_cannot_be_combined_with_tf_read_method(dataset_url):
    completed = _cli(dataset_url, '--loader', 'torch', '-d', 'tf', '-n', '5')
    assert completed.returncode == 2
    assert completed.stderr.strip() == ('petastorm-throughput.py: error: --loader torch cannot be combined with '
                                        '--read-method tf')


def test_measure_throughput_through_a_loader_in_process(dataset_url):
    report = measure_throughput(dataset_url, warmup_cycles_count=1, measure_cycles_count=6, pool_type='thread',
                                loaders_count=2, spawn_new_process=False, loader=Loader.TORCH,
                                loader_batch_size=8, time_stages=True)
    assert report.result.samples_per_second == pytest.approx(8 / report.result.time_mean)
    assert report.stages is not None
    assert report.stages.workers == 2
    assert 'Bottleneck: bound by' in report.stages.format()
    assert measure_throughput(dataset_url, warmup_cycles_count=0, measure_cycles_count=3, pool_type='dummy',
                              spawn_new_process=False).stages is None


def _snapshot(rows, wait=0.0, **worker_seconds):
    return {'seconds': {'io': 0.0, 'filter': 0.0, 'decode': 0.0, 'transform': 0.0, 'queue_wait': wait,
                        **worker_seconds}, 'items': 1, 'rows': rows}


def test_stage_breakdown_blames_the_busiest_side():
    start = _snapshot(0)
    # 1000 rows in 1 s; 2 workers spent 1.8 s decoding them while the consumer waited 0.9 s: decode bounds.
    workers_bound = stage_breakdown(start, _snapshot(1000, wait=0.9, io=0.1, decode=1.8), 1.0, 1000, 2, inline=False)
    assert workers_bound.bound == 'decode'
    assert workers_bound.shares['decode'] == pytest.approx(0.9)
    assert workers_bound.seconds['collate'] == pytest.approx(0.1)
    # The consumer never waited: it is the bottleneck, whatever the workers do.
    consumer_bound = stage_breakdown(start, _snapshot(1000, wait=0.05, decode=0.4), 1.0, 1000, 2, inline=False)
    assert consumer_bound.bound == 'collate'
    assert 'more workers will not help' in consumer_bound.verdict
    # Worker costs are per delivered row: 100 rows delivered out of a 1000-row item cost a tenth of it.
    partial = stage_breakdown(start, _snapshot(1000, wait=0.2, decode=2.0), 1.0, 100, 1, inline=False)
    assert partial.seconds['decode'] == pytest.approx(0.2)


def test_stage_breakdown_of_the_inline_pool_takes_the_work_out_of_the_wait():
    breakdown = stage_breakdown(_snapshot(0), _snapshot(500, wait=0.8, io=0.5, decode=0.25), 1.0, 500, 4,
                                inline=True)
    assert breakdown.workers == 1
    assert breakdown.seconds['queue_wait'] == pytest.approx(0.05)
    assert breakdown.seconds['collate'] == pytest.approx(0.2)
    assert breakdown.bound == 'io'


@pytest.mark.parametrize('pool', ['dummy', 'thread', pytest.param('process', marks=pytest.mark.slow)])
def test_reader_times_its_stages_only_when_asked(dataset_url, pool):
    from petastorm.reader import Reader
    from petastorm.reading.options import validate_options

    options = validate_options(dataset_url_or_urls=dataset_url, batched_output=True, reader_pool_type=pool,
                               workers_count=2)
    with Reader(options, time_stages=True) as reader:
        assert sum(len(batch.id) for batch in reader) == 200
        stages = reader.diagnostics['stages']
    assert stages['rows'] == 200
    assert stages['items'] == reader.diagnostics['work_items_per_epoch']
    assert stages['seconds']['io'] > 0
    assert stages['seconds']['decode'] > 0
    with Reader(options) as reader:
        batches = list(reader.column_batches())
        assert 'stages' not in reader.diagnostics
    assert all(batch.stage_seconds is None for batch in batches)


@pytest.mark.slow  # importing TensorFlow takes most of it
def test_tf_read_method_counts_rows(dataset_url):
    pytest.importorskip('petastorm.tf_utils')
    report = measure_throughput(dataset_url, warmup_cycles_count=2, measure_cycles_count=30, read_method='tf',
                                shuffling_queue_size=10, spawn_new_process=False, time_stages=True)
    assert report.result.samples_per_second == pytest.approx(1 / report.result.time_mean)
    batched = measure_throughput(dataset_url, warmup_cycles_count=1, measure_cycles_count=3, read_method='tf',
                                 batch=True, pool_type='dummy', spawn_new_process=False)
    assert batched.result.samples_per_second > 1 / batched.result.time_mean  # a batch holds several rows


@pytest.mark.slow
def test_tf_read_method_cli_prints_the_breakdown_and_the_result_line(dataset_url):
    pytest.importorskip('petastorm.tf_utils')
    completed = _cli(dataset_url, '-m', '2', '-n', '40', '-d', 'tf', '-q', '10', '-v')
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.strip().splitlines()
    rate = float(RESULT_LINE.match(lines[-1]).group(1))
    assert rate > 0
    assert lines[-2].startswith('Bottleneck: bound by')
