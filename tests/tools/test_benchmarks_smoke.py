"""The codec and pool benchmarks and the benchmark runner work end to end (quick runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / 'benchmarks' / 'codecs_bench.py'


def test_codecs_bench_quick_prints_a_ratio_table():
    completed = subprocess.run([sys.executable, str(SCRIPT), '--quick'], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    codec_table, decoder_table = completed.stdout.split('image decoders against OpenCV')
    lines = [line for line in codec_table.splitlines() if line.startswith('|')]
    header = [cell.strip() for cell in lines[0].strip('|').split('|')]
    assert 'ratio' in header
    assert header[:2] == ['field', 'op']
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[2:]]
    assert len(rows) == 9  # 3 fields x (encode, decode, decode_column)
    assert {row[1] for row in rows} == {'encode', 'decode', 'decode_column'}
    ratio = header.index('ratio')
    for row in rows:
        assert len(row) == len(header)
        assert float(row[ratio]) > 0
        assert float(row[header.index('ours rows/s')].replace(',', '')) > 0
    decoders = [[cell.strip() for cell in line.strip('|').split('|')]
                for line in decoder_table.splitlines() if line.startswith('|')][2:]
    # photo PNG (4 decoders), photo JPEG (3) and hello-world noise PNG (4), every one OpenCV's pixels
    assert len(decoders) == 11
    assert {row[-1] for row in decoders} == {'yes'}


RUN = SCRIPT.parent / 'run.py'


def test_run_quick_writes_the_markdown_table_and_the_plot(tmp_path):
    completed = subprocess.run([sys.executable, str(RUN), '--quick', '--cases', 'codecs', '--output-dir',
                                str(tmp_path)], capture_output=True, text=True, timeout=180, check=False)
    assert completed.returncode == 0, completed.stderr
    report = (tmp_path / 'benchmarks.md').read_text()
    assert report.startswith('# Benchmarks')
    for key in ('| date |', '| cpu | 2 cores' if os.cpu_count() == 2 else '| cpu |', '| ram |', '| python |',
                '| pyarrow |', '| numpy |', '| torch |'):
        assert key in report
    table = [line for line in report.splitlines() if line.startswith('| codecs |')]
    # 3 fields x (encode, decode, decode_column), then 3 image sets x (1 core, all cores) against OpenCV
    assert len(table) == 9 + 6
    for line in table:
        cells = [cell.strip() for cell in line.strip('|').split('|')]
        assert float(cells[-1]) == pytest.approx(float(cells[2].replace(',', '')) / float(cells[4].replace(',', '')),
                                                 rel=0.05, abs=0.01)
    assert '![ours / limit per case](benchmarks.png)' in report
    assert (tmp_path / 'benchmarks.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_run_refuses_an_unknown_case_group(tmp_path):
    completed = subprocess.run([sys.executable, str(RUN), '--cases', 'codecs,nosuch', '--output-dir', str(tmp_path)],
                               capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 2
    assert "unknown --cases ['nosuch']" in completed.stderr
    assert not (tmp_path / 'benchmarks.md').exists()


POOL_BENCH = SCRIPT.parent / 'pool_bench.py'


def test_pool_bench_quick_prints_a_ratio_per_case_and_leaves_no_shared_memory():
    bench = subprocess.Popen([sys.executable, str(POOL_BENCH), '--quick', '--rounds', '1'], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = bench.communicate(timeout=180)
    finally:
        bench.kill()
        bench.wait()
    assert bench.returncode == 0, stderr
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in stdout.splitlines()
            if line.startswith('| ')][1:]
    cases = [row[0] for row in rows]
    assert cases == ['transfer 1 MiB', 'transfer 8 MiB', 'transfer 64 MiB', 'small results, 4 in flight',
                     'small results, ours 64 in flight', 'start-up (spawn)', 'start-up (forkserver)',
                     'segment create+open+unlink']
    for case, unit, ours, stdlib, ratio in rows:
        ours_value, stdlib_value = float(ours.replace(',', '')), float(stdlib.split()[0].replace(',', ''))
        assert ours_value > 0
        assert stdlib_value > 0
        expected = ours_value / stdlib_value if unit == 'items/s' else stdlib_value / ours_value
        assert float(ratio) == pytest.approx(expected, rel=0.05, abs=0.01), case
    assert 'load average' in stdout
    assert 'leaked' not in stderr
    if os.path.isdir('/dev/shm'):
        own = (f'psm{bench.pid:x}_', f'psmbench{bench.pid:x}_')  # the bench's pool slots and its test segments
        left = [name for name in os.listdir('/dev/shm') if name.startswith(own)]
        assert left == []
