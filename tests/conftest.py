"""Fixtures shared by the whole test run.

``spark``: one local Spark session (one JVM) for every test that asks for it, started on first use and stopped
at the end of the run. Tests that use it are marked ``@pytest.mark.spark``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import pytest

from support.spark_settings import FAST_START_JVM_OPTIONS, LOG4J2_PROPERTIES

TESTS_DIR = pathlib.Path(__file__).resolve().parent

_SPARK_SETTINGS = {
    'spark.master': 'local[2]',
    'spark.app.name': 'petastorm-tests',
    'spark.driver.memory': '1g',
    'spark.ui.enabled': 'false',
    'spark.ui.showConsoleProgress': 'false',
    'spark.sql.shuffle.partitions': '2',
    'spark.default.parallelism': '2',
    'spark.sql.session.timeZone': 'UTC',
    'spark.driver.host': '127.0.0.1',
    'spark.driver.bindAddress': '127.0.0.1',
    'spark.python.worker.reuse': 'true',
}


def pytest_configure(config):
    # pyspark warns that it does not fully support the installed pandas; no test uses its pandas conversions.
    config.addinivalue_line('filterwarnings', 'ignore:PySpark does not yet fully support pandas:FutureWarning')


def _java_available() -> bool:
    java_home = os.environ.get('JAVA_HOME')
    return shutil.which('java') is not None or bool(java_home and (pathlib.Path(java_home) / 'bin' / 'java').exists())


def _prepare_environment() -> None:
    # Python workers must run this interpreter, which has petastorm installed. The JVM copies the environment
    # when it starts, so this must happen before the session exists.
    os.environ['PYSPARK_PYTHON'] = sys.executable
    os.environ['PYSPARK_DRIVER_PYTHON'] = sys.executable
    os.environ.setdefault('SPARK_LOCAL_IP', '127.0.0.1')


def _ship_test_modules_by_value() -> None:
    # Functions that tests hand to Spark (row generators, lambdas) would otherwise be pickled as references
    # to test modules (in tests/ and its folders), which workers cannot import: test modules are not installed.
    from pyspark import cloudpickle

    for module in list(sys.modules.values()):
        path = getattr(module, '__file__', None)
        if path and TESTS_DIR in pathlib.Path(path).resolve().parents and module.__name__ != __name__:
            cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope='session')
def spark_jvm_options():
    """JVM options for a Spark session a test starts in a subprocess (a command-line tool)."""
    return FAST_START_JVM_OPTIONS


@pytest.fixture(scope='session')
def spark(tmp_path_factory):
    """A local[2] SparkSession shared by the whole run (UI off, 2 shuffle partitions, UTC, errors-only logs)."""
    pyspark_sql = pytest.importorskip('pyspark.sql')
    if not _java_available():
        pytest.skip('Spark tests need a Java runtime: put java on PATH or set JAVA_HOME')
    _prepare_environment()
    _ship_test_modules_by_value()
    log4j = tmp_path_factory.mktemp('spark-conf') / 'log4j2.properties'
    log4j.write_text(LOG4J2_PROPERTIES)
    builder = pyspark_sql.SparkSession.builder
    for key, value in _SPARK_SETTINGS.items():
        builder = builder.config(key, value)
    builder = builder.config('spark.driver.extraJavaOptions',
                             f'{FAST_START_JVM_OPTIONS} -Dlog4j2.configurationFile=file:{log4j}')
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel('ERROR')
    yield session
    session.stop()
