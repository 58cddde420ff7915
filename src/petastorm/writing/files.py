"""Parquet files of a write: Arrow tables cut into row groups of a target size, rolled into files of a target size.

:class:`FileRoller` is what every writer of Parquet data files shares (``write_dataset``, Delta writes, Ray's
datasink on its workers); the files' footers are kept for a ``_metadata`` summary.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = ['FileRoller']

logger = logging.getLogger(__name__)


class FileRoller:
    """Writes tables as row groups of about ``row_group_bytes`` into Parquet files of about ``file_bytes``.

    Files are named ``part-<n>-<token>.parquet`` (the token is unique to the roller, so that rollers of one write
    can share a directory). Call :meth:`finish` after the last table, or :meth:`abort` when the write failed.

    Args:
        filesystem: where to write.
        directory: the directory the files go to.
        arrow_schema: the schema of every table added.
        row_group_bytes: uncompressed bytes of a row group (the unit readers read and shuffle).
        file_bytes: start a new file once a file holds about this many bytes.
        compression: Parquet compression codec name, or None.

    Attributes:
        row_groups: ``{file name: [rows of each row group]}`` of the files written so far.
    """

    def __init__(self, filesystem: pafs.FileSystem, directory: str, arrow_schema: pa.Schema, row_group_bytes: int,
                 file_bytes: int, compression: str | None) -> None:
        self._fs = filesystem
        self._dir = directory
        self._schema = arrow_schema
        self._row_group_bytes = row_group_bytes
        self._file_bytes = file_bytes
        self._compression = compression or 'none'
        self._buffer: list[pa.Table] = []
        self._buffered_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self._stream: Any = None
        self._file_written = 0
        self._token = uuid.uuid4().hex[:12]
        self.row_groups: dict[str, list[int]] = {}
        #: the footer of each file closed, by name (what a ``_metadata`` summary is made of).
        self.footers: dict[str, pq.FileMetaData] = {}
        self._collected: list[pq.FileMetaData] = []

    def add(self, table: pa.Table) -> None:
        """Buffer ``table``; write the row groups that are full."""
        self._buffer.append(table)
        self._buffered_bytes += table.nbytes
        if self._buffered_bytes < self._row_group_bytes:
            return
        pending = pa.concat_tables(self._buffer)
        bytes_per_row = max(1.0, pending.nbytes / max(1, pending.num_rows))
        rows_per_group = max(1, int(self._row_group_bytes // bytes_per_row))
        while pending.num_rows >= rows_per_group:
            self._write_row_group(pending.slice(0, rows_per_group))
            pending = pending.slice(rows_per_group)
        self._buffer = [pending] if pending.num_rows else []
        self._buffered_bytes = pending.nbytes if pending.num_rows else 0

    def _flush_row_group(self) -> None:
        if self._buffer:
            self._write_row_group(pa.concat_tables(self._buffer))
        self._buffer, self._buffered_bytes = [], 0

    def _write_row_group(self, table: pa.Table) -> None:
        # The chunks are written as they are: the Parquet writer fills its pages across chunks, and a column too
        # large for one Arrow array (a tensor column past 2**31 values) could not be combined into one.
        if self._writer is None:
            name = f'part-{len(self.row_groups):05d}-{self._token}.parquet'
            self._stream = self._fs.open_output_stream(posixpath.join(self._dir, name))
            self._writer = pq.ParquetWriter(self._stream, self._schema, compression=self._compression,
                                            metadata_collector=self._collected)
            self.row_groups[name] = []
            self._file_written = 0
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.row_groups[list(self.row_groups)[-1]].append(table.num_rows)
        self._file_written += table.nbytes
        if self._file_written >= self._file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._stream.close()
            self._writer = self._stream = None
            name = list(self.row_groups)[-1]
            self._collected[-1].set_file_path(name)
            self.footers[name] = self._collected[-1]

    def finish(self) -> None:
        """Write what is buffered as the last row group and close the file."""
        self._flush_row_group()
        self._close_file()

    def abort(self) -> None:
        """Close the open file after a failure (its removal is the caller's); never raises."""
        try:
            self._close_file()
        except Exception:  # the write already failed; the staging directory is removed next
            logger.debug('closing a partial file after a failed write failed', exc_info=True)
