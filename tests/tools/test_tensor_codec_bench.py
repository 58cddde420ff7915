"""benchmarks/tensor_bench.py runs end to end and prints one row per column and metric."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / 'benchmarks' / 'tensor_bench.py'


def test_tensor_bench_quick_prints_the_comparison_table():
    completed = subprocess.run([sys.executable, str(SCRIPT), '--quick', '--rounds', '1'], capture_output=True,
                               text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr
    lines = [line for line in completed.stdout.splitlines() if line.startswith('|')]
    header = [cell.strip() for cell in lines[0].strip('|').split('|')]
    assert header == ['column', 'rows', 'metric', 'NdarrayCodec', 'ArrowTensorCodec', 'ratio']
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[2:]]
    assert len(rows) == 12  # 4 columns x (decode, batch reader, bytes on disk)
    assert {row[2] for row in rows} == {'decode rows/s', 'batch reader rows/s', 'bytes on disk'}
    assert all(float(row[5]) > 0 for row in rows)
