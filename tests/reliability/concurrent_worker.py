"""Run by test_concurrency in separate interpreters: read through a shared disk cache, or write a dataset.

Usage: ``python -m reliability.concurrent_worker read URL CACHE_DIR CACHE_LIMIT EPOCHS`` prints the ids read (one
JSON list, ids checked against their vectors); ``... write URL FIRST_ID`` writes a small dataset and prints its
row count.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from petastorm import make_reader
from reliability.helpers import small_row, write_small_dataset


def read_through_cache(url: str, cache_dir: str, cache_limit: int, epochs: int, pool: str = 'thread') -> list[int]:
    """Every id read (``epochs`` epochs), after checking each row's vector against its id."""
    ids = []
    with make_reader(url, reader_pool_type=pool, workers_count=2, num_epochs=epochs, cache_type='local-disk',
                     cache_location=cache_dir, cache_size_limit=cache_limit, cache_row_size_estimate=64) as reader:
        for row in reader:
            expected = small_row(int(row.id))['vec']
            if not np.array_equal(row.vec, expected):
                raise AssertionError(f'row {row.id} came back with vec {row.vec}, expected {expected}')
            ids.append(int(row.id))
    return ids


def main() -> None:
    command, url = sys.argv[1], sys.argv[2]
    if command == 'read':
        result = read_through_cache(url, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        result = write_small_dataset(url, int(sys.argv[3])).num_rows
    print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
