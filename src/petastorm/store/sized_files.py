"""Data files opened with the size their listing gave: a footer in one request, a row group without a ``HEAD``.

pyarrow's S3 and Azure clients ask an object's size (a ``HEAD``) whenever a file is opened by its path, before
reading a byte of it: reading a footer the plain way costs that request and the read of the file's end. Opened
with a size already known they ask nothing; pyarrow's Python API opens a file that way only as a
``pyarrow.dataset`` fragment made with ``file_size=``. A :class:`SizedFile` is such a fragment of one data file:
its footer is one ranged read of the file's end, and each of its row groups one read of their column chunks
(pyarrow coalesces them).

The ``HEAD`` also showed a file that changed since it was listed (another size) or vanished. Here the reads go
ahead on the listed size and a failed one asks for the size then (:func:`check_unchanged`): a file of another
size fails to read as Parquet (the end of the listed size is not a footer; a row group's column chunks are not
where the footer said, or past the end), and the error raised is then :class:`~petastorm.errors.DataFileChangedError`
naming its URL, or ``FileNotFoundError`` for a file that is gone.

Only S3 and Azure gain: pyarrow's GCS client asks for the object's metadata on every open, with a size or
without (its generation), so there the open file is kept instead (:class:`~petastorm.store.data_files.DataFiles`).

``pyarrow.dataset`` is imported at the first such read, not with this module: importing it imports pandas where
it is installed (0.2-0.25 s of CPU once per process; pyarrow asks for pandas when the module is loaded), which a
reader of local files never needs; a reader's first few files are opened the plain way before it
(:mod:`petastorm.store.plain_or_sized`), so that a first batch that needs only them does not wait for it.
"""

from __future__ import annotations

import errno
import functools
import sys
import threading
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.errors import DataFileChangedError
from petastorm.fs._errors import is_transient
from petastorm.fs._files import file_url

__all__ = ['SizedFile', 'changed_file_error', 'check_unchanged', 'opens_with_listed_size', 'prepare_sized_reads',
           'sized_reads_ready']

#: pyarrow's clients that ask a file's size when it is opened by path, and not when opened by a known size.
_SIZED_FILESYSTEMS: tuple[type, ...] = (pafs.S3FileSystem,) + tuple(
    kind for kind in (getattr(pafs, 'AzureFileSystem', None),) if kind is not None)  # Azure: pyarrow 16 and later


@functools.cache
def _dataset_module() -> Any:
    """``pyarrow.dataset``, imported at the first file read by its listed size (see the module docstring)."""
    import pyarrow.dataset

    return pyarrow.dataset


def sized_reads_ready() -> bool:
    """Whether ``pyarrow.dataset`` is imported already (by anyone): a :class:`SizedFile` then costs no import."""
    return 'pyarrow.dataset' in sys.modules


def prepare_sized_reads() -> None:
    """Import ``pyarrow.dataset`` for the reads by listed size to come (see the module docstring)."""
    _dataset_module()


def opens_with_listed_size(filesystem: pafs.FileSystem) -> bool:
    """Whether :class:`SizedFile` saves ``filesystem``'s request for a file's size: pyarrow's S3 and Azure clients."""
    return isinstance(filesystem, _SIZED_FILESYSTEMS)


def changed_file_error(filesystem: pafs.FileSystem, path: str, listed: int, actual: int) -> DataFileChangedError:
    """The error for data file ``path``, listed with ``listed`` bytes and of ``actual`` bytes now."""
    return DataFileChangedError(
        f'data file {file_url(filesystem, path)} changed after the reader was made: it had {listed} bytes when '
        f'listed and has {actual} now, so the row groups planned from it may not be its row groups. Make a new '
        f'reader to read the new contents (writers that replace files should write new names instead)')


def check_unchanged(filesystem: pafs.FileSystem, path: str, listed: int, err: BaseException) -> None:
    """After ``err`` reading ``path`` by its listed size: raise what the file's state now explains it by.

    A transient error is left to its retries (nothing is asked); otherwise the file's size is asked once.

    Raises:
        FileNotFoundError: the file is gone.
        DataFileChangedError: its size is not the listed one.
    """
    if is_transient(err):
        return
    try:
        info = filesystem.get_file_info(path)
    except (OSError, pa.ArrowException):
        return  # the failed read is what is reported
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, f'data file {file_url(filesystem, path)} no longer exists '
                                              f'(it was listed when the reader was made)') from err
    if info.size is not None and info.size != listed:
        raise changed_file_error(filesystem, path, listed, info.size) from err


class SizedFile:
    """One data file of a known size read through a ``pyarrow.dataset`` fragment (see the module docstring).

    Threads share it: the footer is read once (by the first thread that needs it).

    Args:
        filesystem: where the file is.
        path: the file.
        size: its size in bytes when it was listed.
    """

    def __init__(self, filesystem: pafs.FileSystem, path: str, size: int) -> None:
        self.filesystem = filesystem
        self.path = path
        self.size = size
        self._fragment = _dataset_module().ParquetFileFormat().make_fragment(path, filesystem, file_size=size)
        self._footer: pq.FileMetaData | None = None
        self._schema: pa.Schema | None = None
        self._lock = threading.Lock()

    @property
    def footer_read(self) -> bool:
        """Whether the footer was read from the file (by :meth:`footer` or a row group's read)."""
        return self._footer is not None

    def footer(self) -> pq.FileMetaData:
        """The file's footer: one read of the file's end, the first time.

        Raises:
            FileNotFoundError, DataFileChangedError: see :func:`check_unchanged`.
            OSError, pyarrow.ArrowException: the storage failed, or the file is not Parquet.
        """
        with self._lock:
            if self._footer is None:
                try:
                    self._fragment.ensure_complete_metadata()
                except (OSError, pa.ArrowException) as err:
                    check_unchanged(self.filesystem, self.path, self.size, err)
                    raise
                self._footer = self._fragment.metadata
                self._schema = self._footer.schema.to_arrow_schema()
            return self._footer

    def read_row_group(self, row_group: int, columns: list[str]) -> pa.Table | None:
        """Columns ``columns`` (Parquet paths, as ``pq.ParquetFile.read_row_group`` takes them) of a row group.

        None when the columns are not whole columns of the file (some leaves of a struct, a leaf under a list):
        the fragment would not give them as ``pq.ParquetFile`` does, and the caller reads them another way.

        Raises:
            FileNotFoundError, DataFileChangedError: see :func:`check_unchanged`.
            OSError, pyarrow.ArrowException: the storage failed, or the file is not readable Parquet.
        """
        footer = self.footer()
        assert self._schema is not None
        names = whole_columns(self._schema, columns)
        if names is None:
            return None
        rows = footer.row_group(row_group).num_rows
        try:
            # pre_buffer: the column chunks needed are fetched in few coalesced requests.
            return self._fragment.subset(row_group_ids=[row_group]).to_table(
                columns=names, batch_size=max(rows, 1),
                fragment_scan_options=_dataset_module().ParquetFragmentScanOptions(pre_buffer=True))
        except (OSError, pa.ArrowException) as err:
            check_unchanged(self.filesystem, self.path, self.size, err)
            raise


def whole_columns(schema: pa.Schema, columns: list[str]) -> list[str] | None:
    """The top-level columns that Parquet paths ``columns`` read whole, in ``pq.ParquetFile``'s order; None if not.

    A struct read by all its leaves (``'s.a'``, ``'s.b'``) is read whole (``'s'``); some of its leaves only, or a
    path below a list or map, is not a whole column (None). Each column comes once, where its first path was.
    """
    tops = set(schema.names)
    leaves_of = {field.name: _struct_leaves(field.name, field.type) for field in schema}
    top_of_leaf = {leaf: name for name, leaves in leaves_of.items() for leaf in leaves}
    wanted: dict[str, set[str]] = {}
    for column in columns:
        if column in tops:
            wanted.setdefault(column, set()).update(leaves_of[column] or {column})
        elif column in top_of_leaf:
            wanted.setdefault(top_of_leaf[column], set()).add(column)
        else:
            return None
    if any(asked != (leaves_of[name] or {name}) for name, asked in wanted.items()):
        return None
    return list(wanted)


def _struct_leaves(prefix: str, kind: pa.DataType) -> set[str]:
    """The Parquet paths of a struct's leaves below ``prefix`` (nested structs included); empty for other types.

    A struct holding a list or map has leaves whose paths this does not spell: it is read whole only by its name.
    """
    if not pa.types.is_struct(kind):
        return set()
    leaves: set[str] = set()
    for index in range(kind.num_fields):
        child = kind.field(index)
        if pa.types.is_nested(child.type) and not pa.types.is_struct(child.type):
            return set()
        below = _struct_leaves(f'{prefix}.{child.name}', child.type)
        leaves |= below or {f'{prefix}.{child.name}'}
    return leaves
