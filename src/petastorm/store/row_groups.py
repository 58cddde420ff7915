"""Reading one row group of a data file: the one place every reader of row groups goes through.

The reader's workers (:mod:`petastorm.reading.worker`) and the row-group indexer
(:mod:`petastorm.etl.rowgroup_indexing`) read row groups with :func:`read_row_group`, through the store's
:class:`~petastorm.store.data_files.DataFiles` (which opens each file as cheaply as its filesystem allows and
refuses one that changed since it was listed): a transient storage error retries the whole row group (so its rows
are delivered once), and what goes wrong is raised as the error of :mod:`petastorm.errors` that says whether the
storage or the file failed.
"""

from __future__ import annotations

import pyarrow as pa

from petastorm._compat import null_fixed_size_list_hint
from petastorm.errors import CorruptDataError, PetastormError, StorageError, StorageNotFoundError
from petastorm.fs._errors import is_transient
from petastorm.fs._files import file_url, with_retries
from petastorm.store.data_files import DataFiles

__all__ = ['read_row_group']


def read_row_group(files: DataFiles, path: str, row_group: int, columns: list[str], readers: int = 1) -> pa.Table:
    """Columns ``columns`` (Parquet paths: a struct's leaves as ``'s.a'``) of row group ``row_group`` of ``path``.

    Args:
        files: the store's data files (their filesystem, listed sizes and, per process, footers).
        path: the data file.
        row_group: the row group's number in the file.
        columns: the column paths to read.
        readers: how many reads of these columns of the row group are coming (parts of one work item): they
            share one read in this process (see :meth:`DataFiles.read_row_group`).

    Raises:
        StorageNotFoundError: the file no longer exists.
        StorageError: the storage failed (after retries for transient errors).
        DataFileChangedError: the file is not what it was when listed (its size, or its time where known).
        CorruptDataError: the file is not readable Parquet with that row group (or, with pyarrow before 26, holds
            null rows of a fixed-size list column, which that pyarrow cannot read: the message says so).
        OSError: the storage refused or failed for a reason of the operating system (permissions, network).
    """
    filesystem = files.filesystem

    def attempt() -> pa.Table:
        return files.read_row_group(path, row_group, columns, readers)

    url = file_url(filesystem, path)
    try:
        # A whole row group is retried, so a retry delivers its rows once (our filesystem layer retries each
        # request instead, and local disk not at all: with_retries leaves those alone).
        return with_retries(filesystem, attempt, f'reading row group {row_group} of', path, limited=False)
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
        expected = null_fixed_size_list_hint(err) or ('expected a readable Parquet file with the row groups listed '
                                                      'in the dataset metadata')
        raise CorruptDataError(f'cannot read row group {row_group} of the Parquet file {url}: {expected} '
                               f'({type(err).__name__}: {err})') from err


def _is_access_error(err: OSError) -> bool:
    """True when ``err`` comes from reaching the storage rather than from the bytes read.

    Errors of the operating system or of a user filesystem carry an errno or have a specific type; pyarrow's
    own errors about an undecodable file are plain OSErrors without one.
    """
    return err.errno is not None or isinstance(err, (PermissionError, ConnectionError, TimeoutError))
