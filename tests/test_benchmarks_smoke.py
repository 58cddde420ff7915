"""The codec benchmark runs end to end and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / 'benchmarks' / 'codecs_bench.py'


def test_codecs_bench_quick_prints_a_ratio_table():
    completed = subprocess.run([sys.executable, str(SCRIPT), '--quick'], capture_output=True, text=True,
                               timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    lines = [line for line in completed.stdout.splitlines() if line.startswith('|')]
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
