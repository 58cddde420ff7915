"""Helpers of the table tests: reference rows from the table libraries' own readers, and writers of what they lack.

delta-rs reads deletion vectors but does not write them (its deletes rewrite files), so :func:`add_deletion_vector`
writes one as the Delta protocol specifies it (a RoaringBitmapArray in a ``deletion_vector_<uuid>.bin`` file, the
descriptor in a new commit that re-adds the file); the tests check that delta-rs's own reader honours it before
comparing ours with it. :func:`commit_actions` writes any other commit by hand (renames with column mapping,
unknown features).
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

_Z85 = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#'
_DV_MAGIC = 1681511377


def z85(data: bytes) -> str:
    """Z85 text of ``data`` (a multiple of 4 bytes)."""
    out = []
    for start in range(0, len(data), 4):
        value = int.from_bytes(data[start:start + 4], 'big')
        chunk = []
        for _ in range(5):
            chunk.append(_Z85[value % 85])
            value //= 85
        out.extend(reversed(chunk))
    return ''.join(out)


def roaring_bitmap_array(rows: Iterable[int]) -> bytes:
    """The Delta RoaringBitmapArray serialization of ``rows`` (all below 2**32): magic, one 32-bit bitmap."""
    from pyroaring import BitMap

    return struct.pack('<I', _DV_MAGIC) + struct.pack('<Q', 1) + struct.pack('<I', 0) + BitMap(
        sorted(rows)).serialize()


def log_path(root: str, version: int) -> str:
    return os.path.join(root, '_delta_log', f'{version:020d}.json')


def latest_version(root: str) -> int:
    return max(int(name.split('.')[0]) for name in os.listdir(os.path.join(root, '_delta_log'))
               if name.endswith('.json') and name.split('.')[0].isdigit())


def current_adds(root: str) -> dict[str, dict[str, Any]]:
    """The add actions of the latest version, by path (replaying the JSON commits)."""
    adds: dict[str, dict[str, Any]] = {}
    for version in range(latest_version(root) + 1):
        with open(log_path(root, version)) as f:
            for line in f:
                action = json.loads(line)
                if 'add' in action:
                    adds[action['add']['path']] = action['add']
                elif 'remove' in action:
                    adds.pop(action['remove']['path'], None)
    return adds


def commit_actions(root: str, actions: Sequence[dict[str, Any]]) -> int:
    """Write the next commit of the table at ``root`` holding ``actions``; returns its version."""
    version = latest_version(root) + 1
    with open(log_path(root, version), 'x') as f:
        for action in actions:
            f.write(json.dumps(action) + '\n')
    return version


def add_deletion_vector(root: str, path: str, rows: Sequence[int], *, inline: bool = False) -> int:
    """Make ``rows`` (positions in the file) the deleted rows of data file ``path``, in a new commit.

    ``rows`` replaces the file's current deletion vector, so it lists every deleted row. Returns the new version.
    """
    add = current_adds(root)[path]
    previous = add.get('deletionVector')
    deleted = set(rows)
    data = roaring_bitmap_array(deleted)
    if inline:
        padded = data + b'\0' * (-len(data) % 4)
        descriptor = {'storageType': 'i', 'pathOrInlineDv': z85(padded), 'sizeInBytes': len(data),
                      'cardinality': len(deleted)}
    else:
        name = uuid.uuid4()
        with open(os.path.join(root, f'deletion_vector_{name}.bin'), 'wb') as f:
            f.write(b'\x01' + struct.pack('>I', len(data)) + data + struct.pack('>I', zlib.crc32(data)))
        descriptor = {'storageType': 'u', 'pathOrInlineDv': z85(name.bytes), 'offset': 1, 'sizeInBytes': len(data),
                      'cardinality': len(deleted)}
    now = int(time.time() * 1000)
    new_add = {k: v for k, v in add.items() if k != 'deletionVector'}
    new_add.update(deletionVector=descriptor, dataChange=True, modificationTime=now)
    remove = {'path': path, 'deletionTimestamp': now, 'dataChange': True, 'extendedFileMetadata': True,
              'partitionValues': add.get('partitionValues', {}), 'size': add['size']}
    if previous:
        remove['deletionVector'] = previous
    return commit_actions(root, [{'remove': remove}, {'add': new_add}])


def rows_of_table(table: pa.Table, columns: Sequence[str] | None = None) -> list[tuple]:
    """The rows of an Arrow table as sorted tuples (a multiset), view types made plain."""
    columns = list(columns or table.column_names)
    arrays = []
    for name in columns:
        column = table.column(name)
        if pa.types.is_string_view(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.string())
        arrays.append(column.to_pylist())
    return sorted(zip(*arrays, strict=True), key=repr)


def delta_rows(url: str, version: int | None = None, columns: Sequence[str] | None = None) -> list[tuple]:
    """The rows delta-rs's own reader gives for the version (deletion vectors and column mapping applied)."""
    from deltalake import DeltaTable

    table = pa.table(DeltaTable(url, version=version).scan().read_all())
    return rows_of_table(table, columns)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def reader_rows(reader: Any, columns: Sequence[str]) -> list[tuple]:
    """Every row a batch reader delivers, as sorted tuples of Python values of ``columns``."""
    rows = []
    for batch in reader:
        values = [getattr(batch, name) for name in columns]
        rows.extend(zip(*[[_plain(v) for v in column] for column in values], strict=True))
    return sorted(rows, key=repr)


def datetime64_to_py(values: Iterable[Any]) -> list[Any]:
    return [v.astype('datetime64[us]').item() if isinstance(v, np.datetime64) else v for v in values]
