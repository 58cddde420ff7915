"""Reading one row group of a data file: the one place every reader of row groups goes through.

The reader's workers (:mod:`petastorm.reading.worker`) and the row-group indexer
(:mod:`petastorm.etl.rowgroup_indexing`) read row groups with :func:`read_row_group`: a local file is
memory-mapped, a remote one pre-buffered, a transient storage error retries the whole row group (so its rows are
delivered once), a file that changed size since it was listed is refused, and what goes wrong is raised as the
error of :mod:`petastorm.errors` that says whether the storage or the file failed.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.errors import CorruptDataError, DataFileChangedError, PetastormError, StorageError, StorageNotFoundError
from petastorm.fs._errors import is_transient
from petastorm.fs._files import file_url, with_retries

__all__ = ['read_row_group']


def read_row_group(filesystem: pafs.FileSystem, path: str, row_group: int, columns: list[str], *,
                   expected_size: int | None = None) -> pa.Table:
    """Columns ``columns`` (Parquet paths: a struct's leaves as ``'s.a'``) of row group ``row_group`` of ``path``.

    Args:
        filesystem: where the file is.
        path: the data file.
        row_group: the row group's number in the file.
        columns: the column paths to read.
        expected_size: the file's size when it was listed; a file found with another size changed since.

    Raises:
        StorageNotFoundError: the file no longer exists.
        StorageError: the storage failed (after retries for transient errors).
        DataFileChangedError: the file's size is not ``expected_size``.
        CorruptDataError: the file is not readable Parquet with that row group.
        OSError: the storage refused or failed for a reason of the operating system (permissions, network).
    """
    def attempt() -> pa.Table:
        with _open_data_file(filesystem, path) as handle:
            _check_unchanged(filesystem, path, handle, expected_size)
            # Remote files: pre_buffer fetches the selected column chunks in few coalesced ranged requests,
            # not one each. A memory-mapped local file is read in place, and pre-buffering would copy it.
            remote = not isinstance(handle, pa.MemoryMappedFile)
            return pq.ParquetFile(handle, pre_buffer=remote).read_row_group(row_group, columns=columns)

    url = file_url(filesystem, path)
    try:
        # A whole row group is retried, so a retry delivers its rows once (our filesystem layer retries each
        # request instead, and local disk not at all: with_retries leaves those alone).
        return with_retries(filesystem, attempt, f'reading row group {row_group} of', path)
    except PetastormError:
        raise  # storage errors already translated by the filesystem layer
    except FileNotFoundError as err:
        raise StorageNotFoundError(f'data file {url} no longer exists (it was listed when the reader '
                                   f'was made): {err}') from err
    except (OSError, pa.ArrowException) as err:
        if isinstance(err, OSError) and _is_access_error(err):
            raise  # the storage refused or failed (permissions, network): the file itself may be fine
        if is_transient(err):
            raise StorageError(f'reading row group {row_group} of {url} failed: {type(err).__name__}: '
                               f'{err}') from err
        raise CorruptDataError(f'cannot read row group {row_group} of the Parquet file {url}: '
                               f'expected a readable Parquet file with the row groups listed in the dataset '
                               f'metadata ({type(err).__name__}: {err})') from err


def _open_data_file(filesystem: pafs.FileSystem, path: str) -> pa.NativeFile:
    """The data file, memory-mapped when it is on local disk.

    Parquet pages are then read straight from the page cache instead of being copied into the process first,
    which takes about a third off the time to read the row groups of an image store (measured on the hello-world
    store: 69 against 39-49 µs per row). The map lives only while one row group is read; a file truncated in
    place during that read would fault the process, but writers (ours, Spark's) write new files.
    """
    if isinstance(filesystem, pafs.LocalFileSystem):
        return pa.memory_map(path)
    return filesystem.open_input_file(path)


def _check_unchanged(filesystem: pafs.FileSystem, path: str, handle: pa.NativeFile,
                     expected: int | None) -> None:
    """Raise DataFileChangedError if the file opened is not the size it was listed with."""
    if expected is None:
        return
    actual = handle.size()
    if actual != expected:
        raise DataFileChangedError(
            f'data file {file_url(filesystem, path)} changed after the reader was made: it had {expected} bytes '
            f'when listed and has {actual} now, so the row groups planned from it may not be its row groups. Make a '
            f'new reader to read the new contents (writers that replace files should write new names instead)')


def _is_access_error(err: OSError) -> bool:
    """True when ``err`` comes from reaching the storage rather than from the bytes read.

    Errors of the operating system or of a user filesystem carry an errno or have a specific type; pyarrow's
    own errors about an undecodable file are plain OSErrors without one.
    """
    return err.errno is not None or isinstance(err, (PermissionError, ConnectionError, TimeoutError))
