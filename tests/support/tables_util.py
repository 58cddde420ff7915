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


# -- Iceberg ---------------------------------------------------------------------------------------------------

_ICEBERG_FILE_PATH_ID, _ICEBERG_POS_ID = 2147483546, 2147483545


def _iceberg_delete_producer(table: Any, operation: Any) -> Any:
    """A snapshot producer of pyiceberg that writes the files it adds into a manifest of delete files.

    pyiceberg reads delete files but writes none (its deletes rewrite data files); engines such as Spark write
    them in merge-on-read mode. This producer commits them the way the format specifies.
    """
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2
    from pyiceberg.table.update.snapshot import _FastAppendFiles

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> Any:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, 'content': 'deletes'}

    class AddDeleteFiles(_FastAppendFiles):
        def new_manifest_writer(self, spec: Any) -> Any:
            return DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                        self._compression)

    return AddDeleteFiles, operation


def _commit_delete_file(table: Any, delete_file: Any) -> None:
    from pyiceberg.table.snapshots import Operation

    producer_class, _ = _iceberg_delete_producer(table, Operation.DELETE)
    with table.transaction() as transaction:
        producer = producer_class(operation=Operation.DELETE, transaction=transaction, io=table.io)
        producer.append_data_file(delete_file)
        producer.commit()


def _write_parquet(table: Any, data: pa.Table, name: str) -> tuple[str, int]:
    import pyarrow.parquet as pq

    location = f'{table.location()}/data/{name}-{uuid.uuid4().hex}.parquet'
    output = table.io.new_output(location)
    with output.create() as stream:
        pq.write_table(data, stream)
    return location, len(table.io.new_input(location))


def iceberg_position_deletes(table: Any, deletes: dict[str, Sequence[int]], *, spec_id: int = 0,
                             partition: Any = None) -> None:
    """Commit one position delete file deleting rows ``deletes[data file path]`` of those files."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    paths, positions = [], []
    for path, rows in sorted(deletes.items()):
        for row in sorted(rows):
            paths.append(path)
            positions.append(row)
    schema = pa.schema([pa.field('file_path', pa.string(), False, {'PARQUET:field_id': str(_ICEBERG_FILE_PATH_ID)}),
                        pa.field('pos', pa.int64(), False, {'PARQUET:field_id': str(_ICEBERG_POS_ID)})])
    location, size = _write_parquet(table, pa.table([paths, positions], schema=schema), 'pos-deletes')
    delete_file = DataFile.from_args(content=DataFileContent.POSITION_DELETES, file_path=location,
                                     file_format=FileFormat.PARQUET, partition=partition or Record(),
                                     record_count=len(paths), file_size_in_bytes=size)
    delete_file.spec_id = spec_id
    _commit_delete_file(table, delete_file)


def iceberg_equality_deletes(table: Any, keys: pa.Table, *, spec_id: int = 0, partition: Any = None) -> None:
    """Commit one equality delete file: rows whose ``keys.column_names`` columns equal a row of ``keys`` go."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = table.schema()
    ids = [schema.find_field(name).field_id for name in keys.column_names]
    fields = [pa.field(name, keys.schema.field(name).type, True, {'PARQUET:field_id': str(i)})
              for name, i in zip(keys.column_names, ids, strict=True)]
    location, size = _write_parquet(table, pa.table(keys.columns, schema=pa.schema(fields)), 'eq-deletes')
    delete_file = DataFile.from_args(content=DataFileContent.EQUALITY_DELETES, file_path=location,
                                     file_format=FileFormat.PARQUET, partition=partition or Record(),
                                     record_count=keys.num_rows, file_size_in_bytes=size, equality_ids=ids)
    delete_file.spec_id = spec_id
    _commit_delete_file(table, delete_file)


def iceberg_rows(table: Any, snapshot_id: int | None = None, columns: Sequence[str] | None = None) -> list[tuple]:
    """The rows pyiceberg's own reader gives for the snapshot (position deletes applied)."""
    return rows_of_table(table.scan(snapshot_id=snapshot_id).to_arrow(), columns)
