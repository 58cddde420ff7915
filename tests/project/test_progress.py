"""Progress of long work where a person waits: a tqdm bar on a terminal, log lines otherwise, nothing when asked."""

from __future__ import annotations

import logging
import re
import time
from types import SimpleNamespace

import pytest

import petastorm._progress as progress_module
from petastorm import write_dataset
from petastorm.etl.rowgroup_indexers import SingleFieldIndexer
from petastorm.etl.rowgroup_indexing import build_rowgroup_index
from support.readings import ROWS, Readings, readings_rows, write_readings


@pytest.fixture(scope='module')
def readings_url(tmp_path_factory):
    return write_readings(tmp_path_factory.mktemp('readings'))


@pytest.fixture
def terminal(monkeypatch):
    """stderr counts as a terminal and automatic bars appear at once."""
    pytest.importorskip('tqdm')
    monkeypatch.setattr(progress_module, '_stderr_is_terminal', lambda: True)
    monkeypatch.setattr(progress_module, 'BAR_DELAY_SECONDS', 0)


@pytest.fixture
def no_tqdm(monkeypatch):
    """tqdm is not installed, and every update is worth a log line."""
    monkeypatch.setattr(progress_module, '_tqdm_class', lambda: None)
    monkeypatch.setattr(progress_module, 'LOG_EVERY_SECONDS', 0.0)


# --- progress -----------------------------------------------------------------------------------------------------

def test_write_dataset_draws_a_bar_on_a_terminal(tmp_path, terminal, capsys):
    write_dataset(tmp_path.joinpath('ds').as_uri(), Readings, readings_rows(), row_group_size_mb=0.002)
    err = capsys.readouterr().err
    assert 'writing file://' in err
    assert f'{ROWS}/{ROWS}' in err
    assert '100%' in err


def test_write_dataset_logs_progress_without_tqdm(tmp_path, no_tqdm, caplog):
    with caplog.at_level(logging.INFO, logger='petastorm'):
        write_dataset(tmp_path.joinpath('ds').as_uri(), Readings, iter(readings_rows()), row_group_size_mb=0.002)
    lines = [r.getMessage() for r in caplog.records if r.name == 'petastorm.writer' and 'rows/s' in r.getMessage()]
    assert lines, caplog.text
    assert lines[-1].startswith(f'writing {tmp_path.joinpath("ds").as_uri()}: {ROWS} rows')  # a generator: no total


def test_write_dataset_progress_false_shows_nothing(tmp_path, terminal, caplog, capsys):
    with caplog.at_level(logging.INFO, logger='petastorm'):
        write_dataset(tmp_path.joinpath('ds').as_uri(), Readings, readings_rows(), row_group_size_mb=0.002,
                      progress=False)
    assert capsys.readouterr().err == ''
    assert not [r for r in caplog.records if 'rows/s' in r.getMessage()]


def test_a_bad_progress_argument_is_refused_before_anything_is_written(tmp_path):
    target = tmp_path / 'ds'
    with pytest.raises(ValueError, match='progress must be None'):
        write_dataset(target.as_uri(), Readings, readings_rows(), progress='yes')
    assert not target.exists()


def test_build_rowgroup_index_shows_the_row_groups_indexed(readings_url, terminal, capsys):
    build_rowgroup_index(readings_url, None, [SingleFieldIndexer('by_sensor', 'sensor')])
    err = capsys.readouterr().err
    assert f'indexing {readings_url}' in err
    assert 'row groups' in err
    assert '100%' in err


class _FakeTracker:
    """A SparkContext's status tracker with one job of two stages, finishing as it is looked at."""

    def __init__(self):
        self.looks = 0

    def getActiveJobsIds(self):  # noqa: N802 - pyspark's names
        self.looks += 1
        return [7] if self.looks > 1 else []

    def getJobIdsForGroup(self, group=None):  # noqa: N802
        return [3] + ([7] if self.looks > 1 else [])  # 3 ran before the block

    def getJobInfo(self, job_id):  # noqa: N802
        return SimpleNamespace(stageIds=[1, 2], status='RUNNING') if job_id == 7 else \
            SimpleNamespace(stageIds=[0], status='SUCCEEDED')

    def getStageInfo(self, stage_id):  # noqa: N802
        done = min(4, self.looks)
        return SimpleNamespace(numTasks=4, numCompletedTasks=done if stage_id == 1 else done // 2)


class _FakeContext:
    def __init__(self, console_progress='false'):
        self.tracker = _FakeTracker()
        self.console_progress = console_progress

    def getConf(self):  # noqa: N802
        return {'spark.ui.showConsoleProgress': self.console_progress}

    def getLocalProperty(self, key):  # noqa: N802
        return None

    def statusTracker(self):  # noqa: N802
        return self.tracker


def test_spark_job_progress_counts_the_tasks_of_the_jobs_started_in_the_block(no_tqdm, caplog, monkeypatch):
    monkeypatch.setattr(progress_module, 'SPARK_POLL_SECONDS', 0.01)
    context = _FakeContext()
    with caplog.at_level(logging.INFO, logger='petastorm'), \
            progress_module.SparkJobProgress(SimpleNamespace(sparkContext=context), 'copying', None):
        while context.tracker.looks < 6:
            time.sleep(0.005)
    lines = [r.getMessage() for r in caplog.records if 'tasks' in r.getMessage()]
    assert lines
    assert lines[-1].startswith('copying: 6/8 tasks'), lines  # job 3 (before the block) is not counted


def test_spark_job_progress_stays_quiet_when_spark_draws_its_own_bar_or_there_is_no_context(no_tqdm, caplog):
    with caplog.at_level(logging.INFO, logger='petastorm'):
        with progress_module.SparkJobProgress(_FakeContext(console_progress='true'), 'copying', None):
            pass
        with progress_module.SparkJobProgress(object(), 'copying', True):  # e.g. Spark Connect: no SparkContext
            pass
    assert not [r for r in caplog.records if 'tasks' in r.getMessage()]


@pytest.mark.spark
def test_spark_index_and_converter_show_their_spark_tasks(spark, tmp_path, no_tqdm, caplog):
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    url = tmp_path.joinpath('ds').as_uri()
    write_dataset(url, Readings, readings_rows(40), row_group_size_mb=0.001, progress=False)
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, tmp_path.joinpath('cache').as_uri())
    try:
        with caplog.at_level(logging.INFO, logger='petastorm'):
            build_rowgroup_index(url, spark.sparkContext, [SingleFieldIndexer('by_sensor', 'sensor')], progress=True)
            converter = make_spark_converter(spark.range(50), progress=True)
            converter.delete()
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    for description in (f'indexing {url}', 'make_spark_converter: writing'):
        assert_tasks_done(caplog, description)


def assert_tasks_done(caplog, description):
    """The last progress line of ``description`` counts every task of its Spark jobs as done."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(description)]
    assert lines, (description, caplog.text)
    done, total = re.search(r': (\d+)/(\d+) tasks', lines[-1]).groups()
    assert done == total, lines
    assert int(total) > 0
