"""petastorm-inspect on datasets written here and on the bundled legacy datasets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.etl.rowgroup_indexers import SingleFieldIndexer
from petastorm.etl.rowgroup_indexing import build_rowgroup_index
from petastorm.unischema import Unischema, UnischemaField

LEGACY = Path(__file__).resolve().parent / 'data' / 'legacy_0_13_1'
Schema = Unischema('InspectSchema', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                                     UnischemaField('color', np.str_, (), ScalarCodec(pa.string()), True),
                                     UnischemaField('matrix', np.float32, (None, 3), NdarrayCodec(), False)])


@pytest.fixture(scope='module')
def dataset_url(tmp_path_factory):
    url = tmp_path_factory.mktemp('inspect').joinpath('ds').as_uri()
    rows = ({'id': i, 'color': ['red', 'blue'][i % 2], 'matrix': np.zeros((2, 3), np.float32)} for i in range(50))
    write_dataset(url, Schema, rows, row_group_size_mb=0.001)
    build_rowgroup_index(url, None, [SingleFieldIndexer('by_color', 'color')])
    return url


def _cli(*args):
    return subprocess.run([sys.executable, '-m', 'petastorm.tools.inspect', *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_help():
    completed = _cli('--help')
    assert completed.returncode == 0
    assert '--json' in completed.stdout
    assert 'dataset_url' in completed.stdout


def test_json_description(dataset_url):
    completed = _cli(dataset_url, '--json')
    assert completed.returncode == 0, completed.stderr
    described = json.loads(completed.stdout)
    assert described['metadata'] == 'json'
    assert described['total_rows'] == 50
    assert [f['name'] for f in described['fields']] == ['id', 'color', 'matrix']
    matrix = described['fields'][2]
    assert (matrix['dtype'], matrix['shape'], matrix['codec'], matrix['nullable']) == (
        'float32', [None, 3], 'NdarrayCodec()', False)
    assert described['fields'][1]['nullable'] is True
    groups = [g for f in described['files'] for g in f['row_groups']]
    assert len(groups) == described['num_row_groups'] > 1
    assert sum(g['rows'] for g in groups) == 50
    assert all(g['bytes'] > 0 for g in groups)
    assert described['rowgroup_indexes']['by_color']['columns'] == ['color']


def test_text_report(dataset_url):
    completed = _cli(dataset_url)
    assert completed.returncode == 0, completed.stderr
    assert 'metadata: json (_common_metadata)' in completed.stdout
    assert 'rows:     50 in' in completed.stdout
    assert 'by_color: SingleFieldIndexer on color' in completed.stdout


@pytest.mark.parametrize(('name', 'kind'), [('all_types', 'legacy-pickle'), ('plain_parquet', 'none')])
def test_legacy_and_plain_stores(name, kind):
    completed = _cli(LEGACY.joinpath(name).as_uri(), '--json')
    assert completed.returncode == 0, completed.stderr
    described = json.loads(completed.stdout)
    assert described['metadata'] == kind
    expected_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in LEGACY.joinpath(name).glob('*.parquet'))
    assert described['total_rows'] == expected_rows


def _assert_one_line_error(completed):
    assert completed.returncode != 0
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith('petastorm-inspect: error:'), completed.stderr


@pytest.mark.parametrize('url', ['file:///nonexistent/petastorm/dataset', 'nosuchscheme://x/y', '/no/scheme'])
def test_bad_url_is_one_line_error(url):
    _assert_one_line_error(_cli(url))


def test_non_dataset_directory_is_one_line_error(tmp_path):
    tmp_path.joinpath('notes.txt').write_text('not parquet')
    completed = _cli(tmp_path.as_uri())
    _assert_one_line_error(completed)
    assert 'not a Parquet dataset' in completed.stderr
