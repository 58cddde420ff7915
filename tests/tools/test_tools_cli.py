"""What every command-line tool shares: --version, exit codes (2 usage, 1 data), one error label, the
--storage-options flag; and the first-hour fixes of petastorm-generate-metadata.py, petastorm-copy-dataset.py and
petastorm-throughput.py, run as commands."""

from __future__ import annotations

import logging
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petastorm
from petastorm import make_reader, write_dataset
from petastorm.benchmark.stages import STAGES, WORKER_STAGES, stage_breakdown
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url
from petastorm.unischema import Unischema, UnischemaField

BIN = pathlib.Path(sys.executable).parent
COMMANDS = ['petastorm-inspect', 'petastorm-copy-dataset.py', 'petastorm-generate-metadata.py',
            'petastorm-throughput.py', 'petastorm-tensor-columns']

Points = Unischema('Points', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                              UnischemaField('xy', np.float32, (2,), NdarrayCodec(), False)])

SCHEMA_MODULE = '''
import numpy as np
import pyarrow as pa
from petastorm.codecs import ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

Plain = Unischema('Plain', [UnischemaField('a', np.int64, (), ScalarCodec(pa.int64()), False)])
Wrong = Unischema('Wrong', [UnischemaField('a', np.int64, (), ScalarCodec(pa.int64()), False),
                            UnischemaField('label', np.int64, (), ScalarCodec(pa.int64()), False)])
'''


def _run(command, *args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True, timeout=180, cwd=cwd,
                          env=env, check=False)


def _error_lines(completed):
    return [line for line in completed.stderr.splitlines() if 'error:' in line]


@pytest.fixture(scope='module')
def points_url(tmp_path_factory):
    url = tmp_path_factory.mktemp('points').joinpath('ds').as_uri()
    write_dataset(url, Points, ({'id': i, 'xy': np.full(2, i, np.float32)} for i in range(60)),
                  row_group_size_mb=0.001)
    return url


@pytest.fixture
def plain_dir(tmp_path):
    """A Parquet store without Petastorm metadata, and a module of schemas beside it (the current directory)."""
    store = tmp_path / 'plain'
    store.mkdir()
    pq.write_table(pa.table({'a': pa.array(range(40), pa.int64())}), store / 'part-0.parquet', row_group_size=10)
    (tmp_path / 'my_schemas.py').write_text(SCHEMA_MODULE)
    return store


@pytest.fixture
def corrupt_url(tmp_path, points_url):
    import shutil

    target = tmp_path / 'corrupt'
    shutil.copytree(points_url[len('file://'):], target)
    next(target.glob('*.parquet')).write_bytes(b'not parquet at all')
    return target.as_uri()


# --- shared by every tool -------------------------------------------------------------------------------------------

@pytest.mark.parametrize('command', COMMANDS)
def test_every_tool_prints_its_version(command):
    completed = _run(command, '--version')
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == f'{command} {petastorm.__version__}'


@pytest.mark.parametrize('command', COMMANDS)
def test_a_missing_dataset_is_a_usage_error_everywhere(command, tmp_path):
    missing = (tmp_path / 'missing').as_uri()
    args = {'petastorm-copy-dataset.py': [missing, (tmp_path / 'out').as_uri()],
            'petastorm-tensor-columns': [missing, '--columns', 'x']}.get(command, [missing])
    completed = _run(command, *args)
    assert completed.returncode == 2, completed.stderr
    errors = _error_lines(completed)
    assert len(errors) == 1, completed.stderr
    assert 'does not exist' in errors[0]
    assert 'Traceback' not in completed.stderr


@pytest.mark.parametrize('command', COMMANDS)
def test_an_unknown_flag_is_a_usage_error_everywhere(command):
    assert _run(command, 'file:///x', 'file:///y', '--no-such-flag').returncode == 2


@pytest.mark.parametrize('command', ['petastorm-inspect', 'petastorm-throughput.py'])
def test_a_corrupt_dataset_is_a_data_error_with_one_label(command, corrupt_url):
    completed = _run(command, corrupt_url, *(['-n', '20', '-m', '0'] if command == 'petastorm-throughput.py' else []))
    assert completed.returncode == 1, completed.stderr
    errors = _error_lines(completed)
    assert len(errors) == 1, completed.stderr
    line = errors[0]
    assert line.startswith(f'{command}: error: ')
    # One label, the original error's, at the end: not "ArrowInvalid: ... (RuntimeError)".
    assert line.count('(') >= 1
    assert line.rstrip().endswith(')')
    assert 'RuntimeError' not in line
    assert 'Error: ' not in line.split(': error: ', 1)[1]


# --- petastorm-generate-metadata.py -------------------------------------------------------------------------------

def test_generate_metadata_takes_the_url_positionally_and_finds_a_schema_module_here(plain_dir):
    completed = _run('petastorm-generate-metadata.py', plain_dir.as_uri(), '--unischema_class', 'my_schemas.Plain',
                     cwd=plain_dir.parent)
    assert completed.returncode == 0, completed.stderr
    assert get_schema_from_dataset_url(plain_dir.as_uri()).fields.keys() == {'a'}
    with make_reader(plain_dir.as_uri(), reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        assert [row.a for row in reader] == list(range(40))


def test_generate_metadata_keeps_dataset_url_and_refuses_two_different_urls(plain_dir, points_url):
    completed = _run('petastorm-generate-metadata.py', '--dataset_url', plain_dir.as_uri(), '--unischema_class',
                     'my_schemas.Plain', cwd=plain_dir.parent)
    assert completed.returncode == 0, completed.stderr
    completed = _run('petastorm-generate-metadata.py', plain_dir.as_uri(), '--dataset_url', points_url)
    assert completed.returncode == 2
    assert 'two different dataset URLs' in completed.stderr
    completed = _run('petastorm-generate-metadata.py')
    assert completed.returncode == 2
    assert 'DATASET_URL' in _error_lines(completed)[0]


def test_generate_metadata_names_pythonpath_when_the_schema_module_is_elsewhere(plain_dir, tmp_path):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    completed = _run('petastorm-generate-metadata.py', plain_dir.as_uri(), '--unischema_class', 'my_schemas.Plain',
                     cwd=elsewhere)
    assert completed.returncode == 2
    assert 'PYTHONPATH=.' in _error_lines(completed)[0]
    assert not (plain_dir / '_common_metadata').exists()


def test_generate_metadata_refuses_a_schema_whose_fields_are_not_in_the_files(plain_dir):
    completed = _run('petastorm-generate-metadata.py', plain_dir.as_uri(), '--unischema_class', 'my_schemas.Wrong',
                     cwd=plain_dir.parent)
    assert completed.returncode == 1, completed.stderr
    errors = _error_lines(completed)
    assert len(errors) == 1, completed.stderr
    assert "['label']" in errors[0]
    assert 'part-0.parquet' in errors[0]
    assert not (plain_dir / '_common_metadata').exists()


def test_generate_metadata_in_process_refuses_the_mismatch_before_writing(plain_dir, monkeypatch):
    from petastorm.errors import PetastormMetadataGenerationError
    from petastorm.etl import petastorm_generate_metadata as tool

    monkeypatch.syspath_prepend(str(plain_dir.parent))
    with pytest.raises(PetastormMetadataGenerationError, match=r"fields \['label'\] are not columns"):
        tool._main([plain_dir.as_uri(), '--unischema_class', 'my_schemas.Wrong'])
    assert not (plain_dir / '_common_metadata').exists()


# --- petastorm-copy-dataset.py ------------------------------------------------------------------------------------

def test_copy_takes_a_fractional_row_group_size_and_checks_not_null_fields_before_spark(points_url, tmp_path):
    started = time.monotonic()
    completed = _run('petastorm-copy-dataset.py', points_url, (tmp_path / 'copy').as_uri(), '--row-group-size-mb',
                     '0.5', '--not-null-fields', 'nope')
    assert completed.returncode == 2, completed.stderr
    errors = _error_lines(completed)
    assert len(errors) == 1, completed.stderr
    assert "not-null fields ['nope']" in errors[0]
    # Refused before a JVM was started: no Spark line, and far quicker than a Spark session.
    assert 'Spark' not in completed.stderr.replace(errors[0], '')
    assert time.monotonic() - started < 30


def test_copy_refuses_a_row_group_size_that_is_not_positive(points_url, tmp_path):
    completed = _run('petastorm-copy-dataset.py', points_url, (tmp_path / 'copy').as_uri(), '--row-group-size-mb',
                     '0')
    assert completed.returncode == 2
    assert '--row-group-size-mb must be a positive number' in completed.stderr


def test_copy_regexes_that_match_nothing_are_a_usage_error(points_url, tmp_path):
    completed = _run('petastorm-copy-dataset.py', points_url, (tmp_path / 'copy').as_uri(), '--field-regex', 'zzz')
    assert completed.returncode == 2
    assert 'do not match any fields' in completed.stderr


# --- petastorm-throughput.py --------------------------------------------------------------------------------------

def test_throughput_on_plain_parquet_names_batch(plain_dir):
    completed = _run('petastorm-throughput.py', plain_dir.as_uri(), '-n', '20', '-m', '0', '-p', 'dummy')
    assert completed.returncode == 0, completed.stderr
    assert '--batch' in completed.stderr
    assert 'UserWarning' not in completed.stderr  # the reader's generic warning is replaced, not repeated


def test_throughput_verbose_prints_a_readable_summary(points_url):
    completed = _run('petastorm-throughput.py', points_url, '-n', '50', '-m', '5', '-w', '1', '-v')
    assert completed.returncode == 0, completed.stderr
    done = [line for line in completed.stderr.splitlines() if 'Done measuring' in line]
    assert len(done) == 1
    assert 'samples/sec' in done[0]
    assert 'MB' in done[0]
    assert 'BenchmarkResult(' not in completed.stderr
    assert 'mem(' not in completed.stderr


def test_throughput_field_regex_matching_nothing_is_a_usage_error(points_url):
    completed = _run('petastorm-throughput.py', points_url, '--field-regex', 'zzz', '-n', '5')
    assert completed.returncode == 2
    assert 'matches no field' in completed.stderr


@pytest.mark.parametrize(('item_rows', 'rows', 'workers', 'inline'),
                         [(10, 10_000, 2, False), (0, 500, 1, False), (5, 5_000, 1, True), (1, 100, 4, False)])
def test_stage_shares_never_exceed_100_percent(item_rows, rows, workers, inline):
    before = {'seconds': dict.fromkeys(STAGES, 0.0), 'rows': 0}
    after = {'seconds': {'io': 0.8, 'filter': 0.1, 'decode': 0.6, 'transform': 0.2, 'queue_wait': 1.7},
             'rows': item_rows or 20}
    if item_rows == 0:  # no item taken during the measurement: costs come from the whole run
        before = after
    breakdown = stage_breakdown(before, after, wall_seconds=1.0, rows=rows, workers=workers, inline=inline)
    assert all(0.0 <= share <= 1.0 for share in breakdown.shares.values()), breakdown.shares
    assert sum(breakdown.shares[s] for s in WORKER_STAGES) <= 1.0 + 1e-9
    assert breakdown.shares['collate'] + breakdown.shares['queue_wait'] <= 1.0 + 1e-9
    assert all('%' not in line or int(line.split()[-1].rstrip('%')) <= 100
               for line in breakdown.format().splitlines()[2:-1])


# --- progress of the tools' long work -----------------------------------------------------------------------------

@pytest.fixture
def progress_as_log_lines(monkeypatch):
    """No tqdm, and every update is worth a log line."""
    import petastorm._progress as progress_module

    monkeypatch.setattr(progress_module, '_tqdm_class', lambda: None)
    monkeypatch.setattr(progress_module, 'LOG_EVERY_SECONDS', 0.0)


def test_generate_metadata_shows_the_footers_read(tmp_path, progress_as_log_lines, caplog):
    from petastorm.etl.petastorm_generate_metadata import generate_petastorm_metadata

    url = tmp_path.joinpath('ds').as_uri()
    write_dataset(url, Points, ({'id': i, 'xy': np.zeros(2, np.float32)} for i in range(200)),
                  row_group_size_mb=0.001, file_size_mb=0.002, progress=False)
    with caplog.at_level(logging.INFO, logger='petastorm'):
        generate_petastorm_metadata(None, url)
    lines = [r.getMessage() for r in caplog.records if 'files/s' in r.getMessage()]
    assert lines, caplog.text
    assert lines[-1].startswith(f'reading the footers of {url}: ')


@pytest.mark.spark
def test_copy_dataset_shows_its_spark_tasks(spark, points_url, tmp_path, progress_as_log_lines, caplog):
    from petastorm.tools.copy_dataset import copy_dataset

    target = tmp_path.joinpath('copy').as_uri()
    with caplog.at_level(logging.INFO, logger='petastorm'):
        copy_dataset(spark, points_url, target, ['id'], None, False, 1, 0.5, progress=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f'copying to {target}: ')]
    assert lines, caplog.text
    done, total = re.search(r': (\d+)/(\d+) tasks', lines[-1]).groups()
    assert done == total
    with make_reader(target, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        assert [row.id for row in reader] == list(range(60))


def test_progress_logging_writes_to_the_current_stderr(monkeypatch, capsys):
    # A tool run in-process added a handler bound to the sys.stderr of that moment; once that stream was closed
    # (a test's capture, a redirect_stderr block), every later petastorm log record printed a logging error.
    import io

    from petastorm import cli as _cli

    logger = logging.getLogger('petastorm')
    handlers, level = list(logger.handlers), logger.level
    logger.handlers[:] = [h for h in handlers if not getattr(h, _cli._PROGRESS_HANDLER, False)]
    try:
        replaced = io.StringIO()
        with monkeypatch.context() as patch:
            patch.setattr(sys, 'stderr', replaced)
            _cli.configure_progress_logging()
            logging.getLogger('petastorm.tools.test').info('while redirected')
            assert 'while redirected' in replaced.getvalue()
        replaced.close()
        logging.getLogger('petastorm.tools.test').info('after the redirect')
        err = capsys.readouterr().err
        assert 'after the redirect' in err
        assert 'Logging error' not in err
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def test_storage_options_flag_takes_json_key_value_pairs_or_a_file(tmp_path):
    from petastorm.cli import parse_storage_options

    assert parse_storage_options(None) is None
    assert parse_storage_options('{"client_kwargs": {"endpoint_url": "http://h:9000"}}') == {
        'client_kwargs': {'endpoint_url': 'http://h:9000'}}
    assert parse_storage_options('anon=true, endpoint_url=http://h:9000,max_concurrency=4') == {
        'anon': True, 'endpoint_url': 'http://h:9000', 'max_concurrency': 4}
    options_file = tmp_path / 'options.json'
    options_file.write_text('{"key": "k", "secret": "s"}')
    assert parse_storage_options(f'@{options_file}') == {'key': 'k', 'secret': 's'}


@pytest.mark.parametrize(('text', 'message'), [
    ('{"secret": "hunter2"', 'is not valid JSON'),
    ('@{list_file}', 'must be a JSON object, got a JSON list'),
    ('endpoint_url', 'has no "="'),
    ('=hunter2', 'a pair has an empty key'),
    ('@/nonexistent/options.json', "'/nonexistent/options.json' cannot be read"),
    # A file that is not UTF-8 text escaped as a UnicodeDecodeError traceback.
    ('@{binary_file}', 'options.bin\' is not UTF-8 text (an invalid byte at position 19)'),
])
def test_bad_storage_options_flag_is_a_usage_error_without_the_values(text, message, tmp_path):
    from petastorm.cli import UsageError, parse_storage_options

    list_file = tmp_path / 'list.json'
    list_file.write_text('["hunter2"]')
    binary_file = tmp_path / 'options.bin'
    binary_file.write_bytes(b'{"secret": "hunter2\xff"}')
    with pytest.raises(UsageError, match=re.escape(message)) as raised:
        parse_storage_options(text.replace('{list_file}', str(list_file)).replace('{binary_file}', str(binary_file)))
    assert 'hunter2' not in str(raised.value)


def test_a_tool_run_in_process_leaves_logging_as_it_was(plain_dir, monkeypatch):
    # A tool's main adds a handler for its progress while it runs; a caller (a script, a notebook, the next test)
    # must not find it still installed afterwards, printing the caller's own petastorm log records.
    from petastorm.etl import petastorm_generate_metadata as tool

    logger = logging.getLogger('petastorm')
    handlers, level = list(logger.handlers), logger.level
    monkeypatch.syspath_prepend(str(plain_dir.parent))
    with pytest.raises(SystemExit) as exit_info:
        tool.main([plain_dir.as_uri(), '--unischema_class', 'my_schemas.Wrong'])
    assert exit_info.value.code != 0
    assert logger.handlers == handlers
    assert logger.level == level
