"""Writing a dataset without Spark: rows (dicts), Arrow tables or pandas DataFrames -> Parquet + metadata.

Example::

    from petastorm import write_dataset
    write_dataset('file:///tmp/hello_world', HelloWorldSchema, (row_generator(i) for i in range(1000)),
                  row_group_size_mb=64)

Rows are validated exactly as :func:`~petastorm.unischema.dict_to_spark_row` validates them and encoded in
parallel threads (image encoders release the GIL). Files are first written to a hidden staging directory
inside the target, moved into place when every row was written, and ``_common_metadata`` is written last, so a
failed write leaves nothing that looks like a dataset.

The steps are public for writers that spread them over a cluster (``petastorm.ray``'s datasink):
:func:`check_write_options`, and from :mod:`petastorm.writing` (re-exported here) :class:`StagedWrite` (the
target, its staging directory, commit and roll-back), :func:`encode_rows` (rows to an Arrow table) and
:class:`FileRoller` (tables to Parquet files of row groups).
"""

from __future__ import annotations

import logging
import os
import posixpath
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow.fs as pafs

from petastorm._describe import counted
from petastorm._progress import ProgressMeter, check_progress_argument
from petastorm.errors import SchemaError
from petastorm.fs import resolve_url
from petastorm.fs._files import with_retries
from petastorm.store.listing import DELTA_LOG
from petastorm.tables.delta_write import DeltaWrite
from petastorm.unischema import Unischema
from petastorm.writing.encode import encode_rows, encoded_tables, rows_of
from petastorm.writing.files import FileRoller
from petastorm.writing.staged import StagedWrite

__all__ = ['FileRoller', 'StagedWrite', 'WriteResult', 'check_write_options', 'encode_rows', 'write_dataset']

logger = logging.getLogger(__name__)

_MB = 1024 * 1024


@dataclass(frozen=True)
class WriteResult:
    """What :func:`write_dataset` wrote."""

    url: str
    files: tuple[str, ...]
    num_rows: int
    row_groups: dict[str, list[int]]


def check_write_options(row_group_size_mb: float, file_size_mb: float, mode: str, workers_count: int | None,
                        compression: str | None) -> None:
    """Refuse write options that cannot work, before anything is written (see :func:`write_dataset`).

    Raises:
        ValueError: naming the option, what it must be and what it got.
    """
    if not isinstance(row_group_size_mb, (int, float)) or row_group_size_mb <= 0:
        raise ValueError(f'row_group_size_mb must be a positive number, got {row_group_size_mb!r}')
    if not isinstance(file_size_mb, (int, float)) or file_size_mb < row_group_size_mb:
        raise ValueError(f'file_size_mb must be a number >= row_group_size_mb ({row_group_size_mb}), '
                         f'got {file_size_mb!r}')
    if mode not in ('error', 'overwrite', 'append'):
        raise ValueError(f"mode must be 'error', 'overwrite' or 'append' (Delta tables), got {mode!r}")
    if workers_count is not None and (not isinstance(workers_count, int) or workers_count < 1):
        raise ValueError(f'workers_count must be a positive int or None, got {workers_count!r}')
    if compression is not None and not isinstance(compression, str):
        raise ValueError(f'compression must be a codec name or None, got {compression!r}')


def write_dataset(dataset_url: str, schema: Unischema, rows: Any, *,
                  row_group_size_mb: float = 32, file_size_mb: float = 512,
                  mode: Literal['error', 'overwrite'] = 'error', workers_count: int | None = None,
                  compression: str | None = 'snappy', storage_options: dict | None = None,
                  filesystem: Any = None, legacy_metadata: bool = True,
                  progress: bool | None = None, table_format: Literal['parquet', 'delta'] | None = None,
                  write_summary: bool = False) -> WriteResult:
    """Write a Petastorm dataset (Parquet files plus ``_common_metadata``) without Spark.

    Args:
        dataset_url: target directory URL (``file:///...``, ``s3://...``, any fsspec URL).
        schema: the Unischema every row must follow.
        rows: an iterable of dicts ``{field name: value}`` (values as ``dict_to_spark_row`` takes them), a
            ``pyarrow.Table`` or a pandas DataFrame of such values.
        row_group_size_mb: target uncompressed size of a row group (the unit readers read and shuffle).
        file_size_mb: start a new file once a file holds about this much.
        mode: ``'error'`` refuses a non-empty target; ``'overwrite'`` replaces it once the new data is written;
            ``'append'`` (Delta tables only) adds the rows to the table, creating it if needed.
        workers_count: encoding threads (default: the number of CPUs).
        compression: Parquet compression codec (``'snappy'``, ``'zstd'``, ``None``...).
        storage_options: fsspec options for remote URLs (credentials, endpoint).
        filesystem: a ready pyarrow or fsspec filesystem instead of resolving ``dataset_url``.
        legacy_metadata: also store Petastorm's pickled schema entry so that Petastorm releases (0.13.1) can
            open the dataset; ``False`` stores only our JSON metadata.
        progress: show the rows written: None (default) draws a ``tqdm`` bar (the ``progress`` extra) when stderr
            is a terminal and the write takes more than a couple of seconds, else logs a line every few seconds
            (logger ``petastorm.writer``); True always shows it; False never.
        table_format: ``'delta'`` writes a Delta table: the files and one commit of the log naming them all (a new
            table, ``mode='append'`` or ``'overwrite'`` a new version of an existing one), the Unischema in the
            table's properties; a failed write leaves the table at its last version (see ``docs/tables.md``).
            ``'parquet'`` writes a Petastorm dataset. None (default): ``'delta'`` when the target is a Delta table,
            else ``'parquet'``.
        write_summary: also write a Parquet ``_metadata`` summary (every row group of every file, with its
            statistics, in one footer), that other tools (``pyarrow.dataset.parquet_dataset``, Spark) plan from,
            and that our readers prune ``filters`` with without reading each file's footer. Parquet datasets only.

    Returns:
        A :class:`WriteResult` with the files written and the rows per row group.

    Raises:
        SchemaError: a row does not follow the schema (the message names the row and field); nothing is left.
        FileExistsError: the target holds data and ``mode='error'``.
        DatasetWriteError: the storage failed; whatever was written was removed.
    """
    if not isinstance(schema, Unischema):
        raise SchemaError(f'write_dataset needs a Unischema, got {type(schema).__name__}')
    check_write_options(row_group_size_mb, file_size_mb, mode, workers_count, compression)
    progress = check_progress_argument(progress)
    for field in schema.fields.values():  # a missing image library is one error here, not one per thread
        if field.codec is not None:
            field.codec.check_available('encode')
    fs, root = resolve_url(dataset_url, storage_options, filesystem)
    arrow_schema = schema.as_pyarrow_schema()
    staged: StagedWrite | DeltaWrite
    # The checks of the target are retried where the client does not, and say which URL the storage refused.
    if with_retries(fs, lambda: _writes_delta(fs, root, table_format, mode), 'looking at the target', root):
        if write_summary:
            raise ValueError(f'write_summary=True writes a Parquet _metadata summary; {dataset_url} is written as a '
                             f'Delta table, whose log describes its files')
        staged = DeltaWrite(dataset_url, fs, root, schema, mode, storage_options)
        with_retries(fs, staged.begin, 'preparing the write to', root)
        roller = FileRoller(fs, root, arrow_schema, int(row_group_size_mb * _MB), int(file_size_mb * _MB),
                            compression)
        staged.track(roller)
    else:
        staged = StagedWrite(dataset_url, fs, root, replace=mode == 'overwrite')
        with_retries(fs, staged.begin, 'preparing the write to', root)
        roller = staged.file_roller(arrow_schema, int(row_group_size_mb * _MB), int(file_size_mb * _MB),
                                    compression)
    num_rows = 0
    with staged.rolling_back_on_error():
        try:
            with ProgressMeter(f'writing {dataset_url}', _known_length(rows), 'rows', progress, logger) as meter:
                for table in encoded_tables(schema, arrow_schema, rows_of(rows, schema),
                                             workers_count or os.cpu_count() or 1):
                    roller.add(table)
                    num_rows += table.num_rows
                    meter.update(table.num_rows)
            roller.finish()
        except BaseException:
            roller.abort()
            raise
        if num_rows == 0:
            raise SchemaError(f'write_dataset got no rows for {dataset_url}; nothing was written')
        if isinstance(staged, StagedWrite):
            staged.commit(schema, roller.row_groups, legacy_metadata=legacy_metadata,
                          summary=roller.footers if write_summary else None)
        else:
            staged.commit(schema, roller.row_groups, legacy_metadata=legacy_metadata)
    files = tuple(posixpath.join(root, name) for name in roller.row_groups)
    logger.info('wrote %s in %s to %s', counted(num_rows, 'row'), counted(len(files), 'file'), dataset_url)
    return WriteResult(dataset_url, files, num_rows, roller.row_groups)


def _writes_delta(fs: pafs.FileSystem, root: str, table_format: str | None, mode: str) -> bool:
    """True when ``write_dataset`` writes a Delta table (see its ``table_format``)."""
    if table_format not in (None, 'parquet', 'delta'):
        raise ValueError(f"table_format must be None, 'parquet' or 'delta', got {table_format!r}")
    if table_format is None:
        table_format = 'delta' if fs.get_file_info(posixpath.join(root, DELTA_LOG)).type == pafs.FileType.Directory \
            else 'parquet'
    if table_format == 'parquet' and mode == 'append':
        raise ValueError("mode='append' adds rows to a Delta table: pass table_format='delta' to create or extend "
                         "one (a Petastorm dataset of plain Parquet files is written whole, with mode='error' or "
                         "'overwrite')")
    return table_format == 'delta'


def _known_length(rows: Any) -> int | None:
    """The number of rows when ``rows`` knows it (a list, a Table, a DataFrame), else None (a generator)."""
    try:
        return len(rows)
    except TypeError:
        return None
