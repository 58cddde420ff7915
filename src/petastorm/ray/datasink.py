"""A Ray Data datasink that writes a Petastorm dataset: write tasks encode and write files, the driver commits.

The steps are those of :func:`petastorm.write_dataset`, spread over a cluster: the driver checks the target and
makes a hidden staging directory inside it; every write task encodes its rows with the schema's codecs and writes
its own Parquet files there (row groups of about ``row_group_size_mb``); when every task succeeded, the driver
moves the files into place and writes ``_common_metadata`` last. When a task or the commit fails, the staging
directory (and a target directory the write created) is removed, so a failed write leaves nothing that looks
like a dataset.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from petastorm.errors import DatasetWriteError, SchemaError
from petastorm.fs import resolve_url
from petastorm.metadata.write import write_dataset_metadata
from petastorm.unischema import Unischema, arrow_type_of_field
from petastorm.writer import _commit, _encode_chunk, _FileRoller, _remove_quietly, _validate_options

logger = logging.getLogger(__name__)

_MB = 1024 * 1024
# Rows encoded into one Arrow table at a time inside a write task.
_ENCODE_ROWS = 256


class PetastormDatasink(Datasink[dict]):
    """Writes a Ray Dataset as a Petastorm dataset; use :func:`petastorm.ray.write_petastorm`.

    Each write task returns ``{file name: [rows of each row group]}`` of the files it wrote in the staging
    directory; the driver commits them all at once.
    """

    def __init__(self, dataset_url: str, schema: Unischema, *, row_group_size_mb: float = 32,
                 file_size_mb: float = 512, mode: str = 'error', compression: str | None = 'snappy',
                 storage_options: dict | None = None, filesystem: Any = None, legacy_metadata: bool = True) -> None:
        if not isinstance(schema, Unischema):
            raise SchemaError(f'write_petastorm needs a Unischema, got {type(schema).__name__}')
        _validate_options(row_group_size_mb, file_size_mb, mode, None, compression)
        self._url = dataset_url
        self._schema = schema
        self._row_group_bytes = int(row_group_size_mb * _MB)
        self._file_bytes = int(file_size_mb * _MB)
        self._replace = mode == 'overwrite'
        self._compression = compression
        self._legacy_metadata = legacy_metadata
        self._fs, self._root = resolve_url(dataset_url, storage_options, filesystem)
        self._arrow_schema = pa.schema([pa.field(f.name, arrow_type_of_field(f), nullable=bool(f.nullable))
                                        for f in schema.fields.values()])
        self._staging = posixpath.join(self._root, f'_petastorm_staging-{uuid.uuid4().hex}')
        self._created_root = False

    def get_name(self) -> str:
        return 'WritePetastorm'

    def on_write_start(self, schema: Any = None) -> None:
        existing = self._fs.get_file_info(self._root)
        if existing.type == pafs.FileType.File:
            raise FileExistsError(f'cannot write a dataset to {self._url}: it is a file')
        if existing.type == pafs.FileType.Directory and not self._replace and self._fs.get_file_info(
                pafs.FileSelector(self._root, recursive=False)):
            raise FileExistsError(f'cannot write a dataset to {self._url}: the directory is not empty '
                                  f"(pass mode='overwrite' to replace it)")
        self._created_root = existing.type == pafs.FileType.NotFound
        self._fs.create_dir(self._staging, recursive=True)

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict:
        """Encode the rows of ``blocks`` and write them as Parquet files into the staging directory."""
        roller = _FileRoller(self._fs, self._staging, self._arrow_schema, self._row_group_bytes, self._file_bytes,
                             self._compression)
        names = list(self._schema.fields)
        written = 0
        try:
            for block in blocks:
                accessor = BlockAccessor.for_block(block)
                missing = [name for name in names if name not in accessor.column_names()]
                if missing:
                    raise SchemaError(f'write_petastorm to {self._url}: the dataset has no column for the schema '
                                      f'fields {missing} (its columns: {", ".join(accessor.column_names())})')
                columns = accessor.to_batch_format('numpy')
                for start in range(0, accessor.num_rows(), _ENCODE_ROWS):
                    stop = min(start + _ENCODE_ROWS, accessor.num_rows())
                    # Encoding is per value (an image is one PNG): rows are the codecs' unit here.
                    rows = [{name: columns[name][i] for name in names} for i in range(start, stop)]
                    roller.add(_encode_chunk(self._schema, self._arrow_schema, rows, written + start))
                written += accessor.num_rows()
            roller.finish()
        except BaseException:
            roller.abort()
            raise
        return roller.row_groups

    def on_write_complete(self, write_result: WriteResult[dict]) -> None:
        """Move every task's files into place, then write the metadata: the dataset exists only now."""
        row_groups: dict[str, list[int]] = {}
        for task_row_groups in write_result.write_returns:
            row_groups.update(task_row_groups or {})
        try:
            if not row_groups:
                raise SchemaError(f'write_petastorm got no rows for {self._url}; nothing was written')
            _commit(self._fs, self._root, self._staging, list(row_groups), replace=self._replace)
            write_dataset_metadata(self._fs, self._root, self._schema, row_groups,
                                   legacy_metadata=self._legacy_metadata)
        except BaseException as err:
            for name in row_groups:  # files already moved into place by a commit that failed half-way
                _remove_quietly(self._fs, posixpath.join(self._root, name))
            self._roll_back()
            if isinstance(err, (OSError, pa.ArrowException)) and not isinstance(err, FileExistsError):
                raise DatasetWriteError(f'writing the dataset {self._url} failed and was rolled back: {err}') from err
            raise
        logger.info('wrote %d rows in %d files to %s', write_result.num_rows, len(row_groups), self._url)

    def on_write_failed(self, error: Exception) -> None:
        logger.debug('write_petastorm to %s failed (%s); removing its staging files', self._url, error)
        self._roll_back()

    def _roll_back(self) -> None:
        _remove_quietly(self._fs, self._staging)
        if self._created_root:
            _remove_quietly(self._fs, self._root)
