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

LEGACY = Path(__file__).resolve().parents[1] / 'data' / 'legacy_0_13_1'
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


def test_the_report_sums_up_by_default_and_lists_row_groups_on_request(dataset_url):
    described = json.loads(_cli(dataset_url, '--json').stdout)
    groups = [g['rows'] for f in described['files'] for g in f['row_groups']]
    assert described['row_group_rows'] == {'min': min(groups), 'median': sorted(groups)[len(groups) // 2],
                                           'max': max(groups)}
    summary = _cli(dataset_url).stdout
    assert f"row groups: {min(groups)} / {sorted(groups)[len(groups) // 2]} / {max(groups)} rows" in summary
    assert 'row group 0:' not in summary
    assert '--files lists each file and row group' in summary
    detailed = _cli(dataset_url, '--files').stdout
    listed = [line for line in detailed.splitlines() if line.strip().startswith('row group ')]
    assert len(listed) == len(groups)
    assert listed[0].strip().startswith(f'row group 0: {groups[0]} rows')


def test_head_prints_the_first_rows_decoded(dataset_url):
    completed = _cli(dataset_url, '--head', '3')
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    start = lines.index('first 3 rows:')
    assert lines[start + 1].split() == ['id', 'color', 'matrix']
    assert [line.split()[:3] for line in lines[start + 2:start + 5]] == [
        ['0', 'red', 'float32[2,'], ['1', 'blue', 'float32[2,'], ['2', 'red', 'float32[2,']]
    head = json.loads(_cli(dataset_url, '--head', '2', '--json').stdout)['head']
    assert head == [{'id': '0', 'color': 'red', 'matrix': 'float32[2, 3] array'},
                    {'id': '1', 'color': 'blue', 'matrix': 'float32[2, 3] array'}]


def test_a_glob_url_inspects_the_files_it_matches(dataset_url):
    first = sorted(Path(dataset_url[len('file://'):]).glob('*.parquet'))[0]
    described = json.loads(_cli(f'{dataset_url}/{first.name[:-len(".parquet")]}*.parquet', '--json').stdout)
    assert described['metadata'] == 'json'
    assert described['total_rows'] == pq.ParquetFile(first).metadata.num_rows
    nothing = _cli(f'{dataset_url}/nothing-*.parquet')
    assert nothing.returncode == 2
    assert 'no data file matches' in nothing.stderr


def test_head_must_not_be_negative(dataset_url):
    completed = _cli(dataset_url, '--head', '-1')
    assert completed.returncode == 2
    assert '--head must be >= 0' in completed.stderr


@pytest.mark.parametrize('module', ['petastorm.tools.inspect', 'petastorm.tools.copy_dataset',
                                    'petastorm.tools.tensor_columns', 'petastorm.benchmark.cli',
                                    'petastorm.etl.petastorm_generate_metadata'])
def test_every_tool_calls_a_dataset_url_a_url(module):
    completed = subprocess.run([sys.executable, '-m', module, '--help'], capture_output=True, text=True, timeout=60,
                               check=False)
    assert completed.returncode == 0, completed.stderr
    assert 'Path to' not in completed.stdout
    assert 'dataset_path' not in completed.stdout
    assert 'URL of the' in completed.stdout or 'URL' in completed.stdout.split('positional arguments:')[-1]


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


def test_one_file_of_one_row_group_is_counted_in_the_singular(tmp_path):
    from petastorm.tools.inspect import format_description, inspect_dataset

    pq.write_table(pa.table({'id': np.arange(3)}), str(tmp_path / 'one.parquet'))
    report = format_description(inspect_dataset(f'file://{tmp_path}'), files=True)
    assert 'rows:     3 in 1 row group, 1 file, ' in report
    assert ' 3 rows, 1 row group\n' in report


def test_values_print_as_users_read_them():
    from petastorm.tables import TableVersion
    from petastorm.tools.inspect import describe_value

    assert [describe_value(v) for v in (np.float32(0.1), np.str_('cam0'), np.float64(1.5), np.int64(3))] == \
        ['0.1', 'cam0', '1.5', '3']
    assert repr(TableVersion('delta', 3)) == "TableVersion(format='delta', version=3)"
    assert repr(TableVersion('delta', 3, 1700)) == "TableVersion(format='delta', version=3, timestamp_ms=1700)"
