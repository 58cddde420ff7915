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
from collections.abc import Iterable
from typing import Any

from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from petastorm._describe import counted
from petastorm.errors import SchemaError
from petastorm.fs import resolve_url
from petastorm.unischema import Unischema
from petastorm.writer import check_write_options
from petastorm.writing import StagedWrite, encode_rows

__all__ = ['PetastormDatasink']

logger = logging.getLogger(__name__)

_MB = 1024 * 1024
# Rows encoded into one Arrow table at a time inside a write task.
_ENCODE_ROWS = 256


class PetastormDatasink(Datasink[dict]):
    """Writes a Ray Dataset as a Petastorm dataset; use :func:`petastorm.ray.write_petastorm`.

    Each write task returns ``{file name: [rows of each row group]}`` of the files it wrote in the staging
    directory; the driver commits them all at once.

    Args:
        dataset_url: the target directory URL.
        schema: the Unischema of the rows; every field must be a column of the Ray Dataset.
        row_group_size_mb: uncompressed size of a row group.
        file_size_mb: start a new file once a file holds about this much.
        mode: ``'error'`` refuses a non-empty target; ``'overwrite'`` replaces it on commit.
        compression: Parquet compression codec name, or None.
        storage_options: fsspec options for remote URLs.
        filesystem: a ready pyarrow or fsspec filesystem instead of resolving ``dataset_url``.
        legacy_metadata: also store Petastorm's pickled schema entry (see :func:`petastorm.write_dataset`).

    Raises:
        SchemaError: ``schema`` is not a Unischema.
        ValueError: an option is invalid.
    """

    def __init__(self, dataset_url: str, schema: Unischema, *, row_group_size_mb: float = 32,
                 file_size_mb: float = 512, mode: str = 'error', compression: str | None = 'snappy',
                 storage_options: dict | None = None, filesystem: Any = None, legacy_metadata: bool = True) -> None:
        if not isinstance(schema, Unischema):
            raise SchemaError(f'write_petastorm needs a Unischema, got {type(schema).__name__}')
        check_write_options(row_group_size_mb, file_size_mb, mode, None, compression)
        self._url = dataset_url
        self._schema = schema
        self._row_group_bytes = int(row_group_size_mb * _MB)
        self._file_bytes = int(file_size_mb * _MB)
        self._compression = compression
        self._legacy_metadata = legacy_metadata
        fs, root = resolve_url(dataset_url, storage_options, filesystem)
        self._staged = StagedWrite(dataset_url, fs, root, replace=mode == 'overwrite')
        self._arrow_schema = schema.as_pyarrow_schema()

    def get_name(self) -> str:
        """The name Ray shows for the write operator."""
        return 'WritePetastorm'

    def on_write_start(self, schema: Any = None) -> None:
        """Check the target and make the staging directory (on the driver, before any write task).

        Raises:
            FileExistsError: the target is a file, or a non-empty directory and ``mode`` is not ``'overwrite'``.
        """
        self._staged.begin()

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict:
        """Encode the rows of ``blocks`` and write them as Parquet files into the staging directory.

        Returns:
            ``{file name: [rows of each row group]}`` of the files written.

        Raises:
            SchemaError: a schema field has no column in the blocks, or a value does not follow the schema.
        """
        roller = self._staged.file_roller(self._arrow_schema, self._row_group_bytes, self._file_bytes,
                                          self._compression)
        names = list(self._schema.fields)
        written = 0
        try:
            for block in blocks:
                accessor = BlockAccessor.for_block(block)
                columns = accessor.to_numpy()  # every column of the block: {name: ndarray}
                if not isinstance(columns, dict):
                    raise SchemaError(f'write_petastorm to {self._url}: expected blocks of named columns, got a '
                                      f'{type(block).__name__} holding one unnamed array')
                missing = [name for name in names if name not in columns]
                if missing:
                    raise SchemaError(f'write_petastorm to {self._url}: the dataset has no column for the schema '
                                      f'fields {missing} (its columns: {", ".join(columns)})')
                for start in range(0, accessor.num_rows(), _ENCODE_ROWS):
                    stop = min(start + _ENCODE_ROWS, accessor.num_rows())
                    # Encoding is per value (an image is one PNG): rows are the codecs' unit here.
                    rows = [{name: columns[name][i] for name in names} for i in range(start, stop)]
                    roller.add(encode_rows(self._schema, self._arrow_schema, rows, written + start))
                written += accessor.num_rows()
            roller.finish()
        except BaseException:
            roller.abort()
            raise
        return roller.row_groups

    def on_write_complete(self, write_result: WriteResult[dict]) -> None:
        """Move every task's files into place, then write the metadata: the dataset exists only now.

        Raises:
            SchemaError: no rows were written (the write is rolled back).
            DatasetWriteError: the storage failed; the write was rolled back.
        """
        row_groups: dict[str, list[int]] = {}
        for task_row_groups in write_result.write_returns:
            row_groups.update(task_row_groups or {})
        with self._staged.rolling_back_on_error():
            if not row_groups:
                raise SchemaError(f'write_petastorm got no rows for {self._url}; nothing was written')
            self._staged.commit(self._schema, row_groups, legacy_metadata=self._legacy_metadata)
        logger.info('wrote %s in %s to %s', counted(write_result.num_rows, 'row'), counted(len(row_groups), 'file'),
                    self._url)

    def on_write_failed(self, error: Exception) -> None:
        """Remove the staging directory (and a target directory the write created) after a failed task."""
        logger.debug('write_petastorm to %s failed (%s); removing its staging files', self._url, error)
        self._staged.roll_back()
