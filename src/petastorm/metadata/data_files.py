"""The data files of one store on remote storage, read with one request per row group.

Every request to remote storage waits a round trip. Reading a row group through ``pyarrow.parquet`` the plain way
costs three: the client asks for the file's size when it opens it (pyarrow's S3 client sends a ``HEAD``), the
footer is read to find the row group, then its column chunks. The reader knows the first two already: the listing
gave every file's size, and planning read the footers (or the metadata told the row groups without them). So
:class:`DataFiles` keeps, per process, one ``pyarrow.dataset`` fragment per file, created with the listed size
(no size request) and holding its footer once read; a row group is then its column chunks only, fetched in few
coalesced requests (``pre_buffer``).

A file that changed since it was listed is still refused (:class:`~petastorm.errors.DataFileChangedError`): the
first time a process reads a file, its size and modification time are asked for beside the read, in a thread of
their own, and compared with the listing's, so the check costs a request per file and process but no round trip.

This serves pyarrow's own remote filesystems (S3, GCS, HDFS, or one given as ``filesystem=``). Local disk is
memory-mapped instead, and our fsspec layer (:mod:`petastorm.fs`) keeps sizes and footers itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.errors import DataFileChangedError, StorageNotFoundError
from petastorm.fs._files import file_url
from petastorm.fs._handler import StorageHandler

__all__ = ['DataFiles', 'reads_by_fragments']

#: files whose footers a process keeps (the oldest are read again if needed).
_KEPT_FILES = 4096


def reads_by_fragments(filesystem: pafs.FileSystem) -> bool:
    """Whether row groups on ``filesystem`` are read through :class:`DataFiles`: pyarrow's remote filesystems."""
    if isinstance(filesystem, pafs.LocalFileSystem):
        return False
    return not (isinstance(filesystem, pafs.PyFileSystem) and isinstance(filesystem.handler, StorageHandler))


class DataFiles:
    """The data files of a store on one filesystem: their listed sizes and times, and per process their footers.

    It is part of every worker's context: pickled, it carries the listing (sizes and modification times) but no
    footer, which each worker process reads once per file.

    Args:
        filesystem: where the files are.
        sizes: each file's size in bytes when the store was listed, by path.
        mtimes: each file's modification time (ns) when listed, by path, where the filesystem reports one.
    """

    def __init__(self, filesystem: pafs.FileSystem, sizes: Mapping[str, int] | None = None,
                 mtimes: Mapping[str, int] | None = None) -> None:
        self.filesystem = filesystem
        self.sizes = dict(sizes or {})
        self.mtimes = dict(mtimes or {})
        self._fragments: OrderedDict[str, Any] = OrderedDict()
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return DataFiles, (self.filesystem, self.sizes, self.mtimes)

    # -- footers ----------------------------------------------------------------------------------------------

    def footer(self, path: str) -> pq.FileMetaData:
        """The Parquet footer of ``path``: one request the first time in this process, none after."""
        return self._fragment(path).metadata

    def _fragment(self, path: str) -> Any:
        with self._lock:
            fragment = self._fragments.get(path)
            if fragment is not None:
                self._fragments.move_to_end(path)
                return fragment
        import pyarrow.dataset as ds

        file_format = ds.ParquetFileFormat(
            default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))
        fragment = file_format.make_fragment(path, filesystem=self.filesystem, file_size=self.sizes.get(path))
        fragment.ensure_complete_metadata()  # reads the footer: one ranged request at the file's end
        with self._lock:
            self._fragments[path] = fragment
            while len(self._fragments) > _KEPT_FILES:
                self._fragments.popitem(last=False)
        return fragment

    # -- row groups -------------------------------------------------------------------------------------------

    def read_row_group(self, path: str, row_group: int, columns: list[str]) -> pa.Table:
        """Columns ``columns`` (Parquet paths: a struct's leaves as ``'s.a'``) of a row group of ``path``.

        Raises:
            DataFileChangedError: the file's size or modification time is not what the listing said.
            OSError, pyarrow.ArrowException: what the filesystem or the Parquet reader raised.
        """
        check = self._start_check(path)
        try:
            table = self._read(path, row_group, columns)
        except BaseException as err:
            if check is not None:
                check.join()
                check.raise_if_changed(err)  # a file read at the listed offsets fails when it changed: say so
            raise
        if check is not None:
            check.join()
            check.raise_if_changed()
        return table

    def _read(self, path: str, row_group: int, columns: list[str]) -> pa.Table:
        fragment = self._fragment(path)
        if any('.' in column for column in columns):
            # A struct's leaves by their paths: the dataset scanner would return the leaves as top-level columns,
            # where ParquetFile keeps them in their struct. Opening the file costs a size request here.
            with self.filesystem.open_input_file(path) as handle:
                return pq.ParquetFile(handle, metadata=fragment.metadata, pre_buffer=True).read_row_group(
                    row_group, columns=columns)
        return fragment.subset(row_group_ids=[row_group]).to_table(columns=columns, use_threads=False)

    def _start_check(self, path: str) -> _ChangeCheck | None:
        with self._lock:
            if path in self._checked or path not in self.sizes:
                return None
            self._checked.add(path)
        check = _ChangeCheck(self, path)
        check.start()
        return check


class _ChangeCheck(threading.Thread):
    """Asks for a file's size and modification time beside its first read, and compares them with the listing's."""

    def __init__(self, files: DataFiles, path: str) -> None:
        super().__init__(name='petastorm-file-check', daemon=True)
        self._files = files
        self._path = path
        self._info: pafs.FileInfo | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._info = self._files.filesystem.get_file_info(self._path)
        except BaseException as err:  # reported to the reading thread, which decides
            self._error = err

    def raise_if_changed(self, read_error: BaseException | None = None) -> None:
        """Raise DataFileChangedError if the file is not what it was when listed (a failed check says nothing).

        Args:
            read_error: what the read beside the check raised, if it failed (chained as the cause).
        """
        info = self._info
        if info is None:
            with self._files._lock:
                self._files._checked.discard(self._path)  # the next read checks again
            return
        files, path = self._files, self._path
        url = file_url(files.filesystem, path)
        if info.type != pafs.FileType.File:
            raise StorageNotFoundError(f'data file {url} no longer exists (it was listed when the reader was '
                                       f'made)') from read_error
        listed_size, listed_time = files.sizes.get(path), files.mtimes.get(path)
        if info.size != listed_size or (listed_time is not None and info.mtime_ns is not None
                                        and info.mtime_ns != listed_time):
            raise DataFileChangedError(
                f'data file {url} changed after the reader was made: it had {listed_size} bytes when listed and has '
                f'{info.size} now' + ('' if info.size != listed_size else ', written again since') + ', so the row '
                'groups planned from it may not be its row groups. Make a new reader to read the new contents '
                '(writers that replace files should write new names instead)') from read_error
