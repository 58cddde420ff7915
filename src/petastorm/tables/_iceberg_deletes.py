"""The deletes of an Iceberg snapshot, resolved while planning to the positions of the rows they delete.

Position delete files name ``(data file, position)`` pairs: each is read once, and its positions go to the data
files of a data sequence number up to its own. Equality delete files name key values (by field id): a row of a data
file of a lower data sequence number, in the delete's partition (any partition for an unpartitioned delete), whose
key columns equal a deleted key is deleted, null matching null. pyiceberg's scan planning refuses snapshots with
equality deletes, so they are resolved here, by reading only the key columns of the data files they apply to.
Either way the result is, per data file, the sorted positions of its deleted rows, which planning turns into masks
of its row groups (:func:`petastorm.tables._files.plan_files`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.errors import PetastormMetadataError, StorageNotFoundError
from petastorm.tables._files import unique_positions

__all__ = ['EqualityDelete', 'equality_deleted', 'equality_deletes', 'position_deletes', 'read_delete_file']

# Field ids of the columns of position delete files (Iceberg's reserved ids).
_DELETE_FILE_PATH_ID, _DELETE_POS_ID = 2147483546, 2147483545

#: Reads a delete file (a manifest's ``DataFile``) into a table.
ReadDeleteFile = Callable[[Any], pa.Table]


def read_delete_file(fs: pafs.FileSystem, path: str, name: str) -> pa.Table:
    """The rows of the delete file ``path`` of the Iceberg table ``name``.

    Raises:
        StorageNotFoundError: the file does not exist.
    """
    try:
        with fs.open_input_file(path) as f:
            return pq.read_table(f)
    except FileNotFoundError as err:
        raise StorageNotFoundError(f'delete file {path} of the Iceberg table {name} does not exist') from err


def position_deletes(read: ReadDeleteFile, data_sequences: dict[str, int],
                     delete_files: Sequence[tuple[Any, int]]) -> dict[str, list[np.ndarray]]:
    """Positions the position delete files delete, by data file URI, each delete file read once.

    Args:
        read: reads a delete file.
        data_sequences: the data sequence number of each live data file, by URI.
        delete_files: the position delete files with their data sequence numbers.
    """
    deleted: dict[str, list[np.ndarray]] = {}
    for delete_file, delete_sequence in delete_files:
        rows = read(delete_file)
        ids = _field_ids(rows)
        rows = rows.select([ids.get(_DELETE_FILE_PATH_ID, 'file_path'), ids.get(_DELETE_POS_ID, 'pos')])
        grouped = rows.rename_columns(['file_path', 'pos']).group_by('file_path').aggregate([('pos', 'list')])
        for path, positions in zip(grouped.column('file_path').to_pylist(), grouped.column('pos_list').to_pylist(),
                                   strict=True):
            if path in data_sequences and data_sequences[path] <= delete_sequence:
                deleted.setdefault(path, []).append(np.asarray(positions, dtype=np.int64))
    return deleted


@dataclass(frozen=True)
class EqualityDelete:
    """An equality delete file: its key columns (by field id) and the keys it deletes.

    Attributes:
        file: the delete file, as its manifest lists it.
        sequence: its data sequence number.
        key_ids: the field ids of its key columns.
        keys: the deleted keys, one column per key field, named by its id.
        unpartitioned: whether its partition spec has no fields (it applies to every partition).
    """

    file: Any
    sequence: int
    key_ids: list[int]
    keys: pa.Table
    unpartitioned: bool

    def applies_to(self, data_file: Any, sequence: int) -> bool:
        """Whether it deletes from ``data_file``, of data sequence number ``sequence``.

        It does from the files of a lower data sequence number, in its partition (in any for an unpartitioned one).
        """
        return self.sequence > sequence and (self.unpartitioned or (
            self.file.spec_id == data_file.spec_id and self.file.partition == data_file.partition))


def equality_deletes(read: ReadDeleteFile, delete_files: Sequence[tuple[Any, int]], specs: dict[int, Any],
                     name: str) -> list[EqualityDelete]:
    """The equality delete files with their keys, each read once.

    Args:
        read: reads a delete file.
        delete_files: the equality delete files with their data sequence numbers.
        specs: the table's partition specs, by id.
        name: the table, for messages.

    Raises:
        PetastormMetadataError: a delete file lacks one of its key columns.
    """
    found = []
    for delete_file, delete_sequence in delete_files:
        keys_table = read(delete_file)
        ids = _field_ids(keys_table)
        key_ids = list(delete_file.equality_ids or [])
        missing = [i for i in key_ids if i not in ids]
        if missing:
            raise PetastormMetadataError(f'the equality delete file {delete_file.file_path} of the Iceberg table '
                                         f'{name} lacks the key columns of field ids {missing}')
        keys_table = pa.table([keys_table.column(ids[i]) for i in key_ids], names=[str(i) for i in key_ids])
        found.append(EqualityDelete(delete_file, delete_sequence, key_ids, keys_table,
                                    not specs[delete_file.spec_id].fields))
    return found


def equality_deleted(fs: pafs.FileSystem, data_path: str, deletes: Sequence[EqualityDelete]) -> list[np.ndarray]:
    """Positions of the rows of the data file ``data_path`` that each of ``deletes`` (all applying to it) deletes."""
    with fs.open_input_file(data_path) as f:
        resolve = _field_ids(pq.read_schema(f).empty_table())
    return [_matching_keys(fs, data_path, resolve, delete.keys, delete.key_ids) for delete in deletes]


def _field_ids(table: pa.Table) -> dict[int, str]:
    ids = {}
    for arrow_field in table.schema:
        raw = (arrow_field.metadata or {}).get(b'PARQUET:field_id')
        if raw is not None:
            ids[int(raw)] = arrow_field.name
    return ids


def _encoded_keys(data: pa.Table, deletes: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Both tables' key columns as dictionary indices of their values together, nulls being a value too.

    Iceberg's equality deletes match null to null; joins never match nulls, dictionary indices of encoded nulls do.
    """
    data_columns, delete_columns = [], []
    for name in data.column_names:
        both = pa.chunked_array(data.column(name).chunks + deletes.column(name).cast(data.column(name).type).chunks)
        indices = pc.dictionary_encode(both, null_encoding='encode').combine_chunks().indices
        data_columns.append(indices.slice(0, data.num_rows))
        delete_columns.append(indices.slice(data.num_rows))
    names = [f'k{i}' for i in range(len(data_columns))]
    return pa.table(data_columns, names=names), pa.table(delete_columns, names=names)


def _matching_keys(fs: pafs.FileSystem, data_path: str, resolve: dict[int, str], keys: pa.Table,
                   key_ids: Sequence[int]) -> np.ndarray:
    """Positions of the rows of a data file whose key columns equal a row of ``keys``."""
    stored = [resolve.get(field_id) for field_id in key_ids]
    with fs.open_input_file(data_path) as f:
        parquet = pq.ParquetFile(f)
        present = [name for name in stored if name is not None]
        data = parquet.read(columns=present) if present else pa.table({})
    columns = []
    for field_id, name in zip(key_ids, stored, strict=True):
        key_type = keys.column(str(field_id)).type
        columns.append(data.column(name) if name is not None else pa.nulls(parquet.metadata.num_rows, key_type))
    data_keys = pa.table(columns, names=[str(i) for i in key_ids])
    encoded_data, encoded_deletes = _encoded_keys(data_keys, keys.select([str(i) for i in key_ids]))
    encoded_data = encoded_data.append_column('__row', pa.array(np.arange(encoded_data.num_rows, dtype=np.int64)))
    matched = encoded_data.join(encoded_deletes.group_by(encoded_deletes.column_names).aggregate([]),
                                keys=encoded_deletes.column_names, join_type='left semi')
    return unique_positions(matched.column('__row').to_numpy())
