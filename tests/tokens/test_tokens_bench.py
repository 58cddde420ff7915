"""benchmarks/tokens_bench.py runs end to end (a quick run on small corpora) and prints its table."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / 'benchmarks' / 'tokens_bench.py'


@pytest.mark.slow
def test_tokens_bench_quick_prints_every_figure(tmp_path):
    for module in ('torch', 'datasets', 'tokenizers'):
        pytest.importorskip(module)
    completed = subprocess.run([sys.executable, str(SCRIPT), '--quick', '--data-root', str(tmp_path)],
                               capture_output=True, text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [[cell.strip() for cell in line.strip('|').split('|')] for line in completed.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| figure')]
    assert [row[0] for row in rows] == ['1', '1', '1', '1', '1', '1', '2', '3', '4', '4', '4']
    for row in rows[:7]:
        assert float(row[6]) > 0
    assert float(rows[7][2].rstrip('%')) < 5, 'first_fit pads little'
