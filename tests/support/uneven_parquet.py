"""A small Parquet store whose row groups have uneven sizes, shared by the distributed-training tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

#: (rows, row group size) of each file: 99 rows in row groups of 5 to 23 rows.
LAYOUT = [(40, 23), (31, 5), (28, 11)]
UNEVEN_ROWS = sum(rows for rows, _ in LAYOUT)


def write_uneven_parquet(root: Path, partitioned: bool) -> str:
    """Write the store under ``root`` (file ``k`` in hive directory ``part=k`` when ``partitioned``); its URL.

    Columns: ``id`` (0..98) and ``x`` (float32: ``id`` itself, or ``id % 10`` when not partitioned, small
    values for a model to fit).
    """
    start = 0
    for index, (rows, group) in enumerate(LAYOUT):
        ids = np.arange(start, start + rows, dtype=np.int64)
        x = ids if partitioned else ids % 10
        directory = root / f'part={index}' if partitioned else root
        directory.mkdir(exist_ok=True)
        pq.write_table(pa.table({'id': ids, 'x': x.astype(np.float32)}), directory / f'data{index}.parquet',
                       row_group_size=group)
        start += rows
    return 'file://' + str(root)
