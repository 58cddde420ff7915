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
:func:`check_write_options`, :class:`StagedWrite` (the target, its staging directory, commit and roll-back),
:func:`encode_rows` (rows to an Arrow table) and :class:`FileRoller` (tables to Parquet files of row groups).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._compat import refuse_unreadable_null_lists
from petastorm._describe import counted
from petastorm._progress import ProgressMeter, check_progress_argument
from petastorm.codecs import ArrowTensorCodec, AudioCodec, VideoCodec
from petastorm.errors import DatasetWriteError, SchemaError
from petastorm.fs import resolve_url
from petastorm.fs._files import move_file, remove_dir, with_retries
from petastorm.metadata.write import write_dataset_metadata
from petastorm.store.listing import DELTA_LOG, SUMMARY_METADATA
from petastorm.tables.delta_write import DeltaWrite
from petastorm.unischema import Unischema, arrow_type_of_field, encode_row

__all__ = ['FileRoller', 'StagedWrite', 'WriteResult', 'check_write_options', 'encode_rows', 'write_dataset']

logger = logging.getLogger(__name__)

_MB = 1024 * 1024
_ROWS_PER_TASK = 64


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


def _rows_of(data: Any, schema: Unischema) -> Iterator[Mapping[str, Any]]:
    """Row dicts from an iterable of dicts, a pyarrow Table or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        for batch in data.to_batches(max_chunksize=_ROWS_PER_TASK):
            yield from (_coerce_cells(row, schema) for row in batch.to_pylist())
        return
    if type(data).__module__.startswith('pandas') and hasattr(data, 'to_dict'):
        for start in range(0, len(data), _ROWS_PER_TASK):
            records = data.iloc[start:start + _ROWS_PER_TASK].to_dict('records')
            yield from (_coerce_cells(row, schema) for row in records)
        return
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise SchemaError(f'write_dataset expects an iterable of row dicts, a pyarrow.Table or a pandas DataFrame, '
                          f'got {type(data).__name__}')
    yield from data


def _coerce_cells(row: dict[str, Any], schema: Unischema) -> dict[str, Any]:
    # Columns of tables hold lists or Python scalars; array codecs (binary payloads, tensors) want ndarrays.
    out = dict(row)
    for name, field in schema.fields.items():
        value = out.get(name)
        if value is None:
            continue
        if field.codec is not None and (isinstance(field.codec, ArrowTensorCodec) or arrow_type_of_field(
                field) == pa.binary()) and not isinstance(value, (np.ndarray, bytes)) and \
                not isinstance(field.codec, (AudioCodec, VideoCodec)):  # these take dicts and paths too
            out[name] = np.asarray(value, dtype=field.numpy_dtype)
        elif isinstance(value, float) and np.isnan(value) and field.nullable:
            out[name] = None
    return out


def encode_rows(schema: Unischema, arrow_schema: pa.Schema, rows: Sequence[Mapping[str, Any]],
                first_index: int = 0) -> pa.Table:
    """Validate rows against the schema and encode them into one Arrow table of the stored columns.

    Each value is checked with its row (as ``dict_to_spark_row`` checks it); each codec column is then built at
    once by the codec's ``encode_column``, native columns by Arrow.

    Args:
        schema: the schema every row follows.
        arrow_schema: the stored columns, ``schema.as_pyarrow_schema()``.
        rows: row dicts ``{field name: value}``.
        first_index: the position of ``rows[0]`` in the whole write, for messages.

    Returns:
        A table of ``len(rows)`` rows with ``arrow_schema``.

    Raises:
        SchemaError, TypeError: a row does not follow the schema; the message names the row (counted from
            ``first_index``) and the field.
    """
    columns: dict[str, list[Any]] = {name: [] for name in schema.fields}
    for offset, row in enumerate(rows):
        try:
            encoded = encode_row(schema, row, column_encoded=True)
        except (SchemaError, TypeError) as err:
            raise type(err)(f'row {first_index + offset}: {err}') from err
        for name, value in encoded.items():
            columns[name].append(value)
    arrays = []
    for column in arrow_schema:
        field = schema.fields[column.name]
        try:
            if field.codec is not None:
                arrays.append(field.codec.encode_column(field, columns[column.name]))
            else:
                arrays.append(pa.array(columns[column.name], type=column.type))
        except (pa.ArrowException, TypeError, ValueError) as err:
            raise SchemaError(f'field {column.name!r} (rows {first_index}..{first_index + len(rows) - 1}): values '
                              f'cannot be stored as {column.type}: {err}') from err
    table = pa.Table.from_arrays(arrays, schema=arrow_schema)
    refuse_unreadable_null_lists(table, f'rows {first_index}..{first_index + len(rows) - 1}')
    return table


def _encoded_tables(schema: Unischema, arrow_schema: pa.Schema, rows: Iterator[Mapping[str, Any]],
                    workers_count: int) -> Iterator[pa.Table]:
    """Encode rows in parallel, yielding tables in input order; at most ``2 * workers`` chunks in flight."""
    chunks = ((i * _ROWS_PER_TASK, list(chunk)) for i, chunk in enumerate(_batched(rows, _ROWS_PER_TASK)))
    with ThreadPoolExecutor(max_workers=workers_count, thread_name_prefix='petastorm-encode') as pool:
        pending = []
        for start, chunk in chunks:
            pending.append(pool.submit(encode_rows, schema, arrow_schema, chunk, start))
            if len(pending) >= 2 * workers_count:
                yield pending.pop(0).result()
        try:
            for future in pending:
                yield future.result()
        finally:
            for future in pending:
                future.cancel()


def _batched(iterable: Iterable[Any], n: int) -> Iterator[tuple[Any, ...]]:
    iterator = iter(iterable)
    while chunk := tuple(itertools.islice(iterator, n)):
        yield chunk


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


class StagedWrite:
    """A dataset write into ``root`` through a hidden staging directory, committed or rolled back as a whole.

    :meth:`begin` checks the target and makes the staging directory; files are written there (:meth:`file_roller`);
    :meth:`commit` moves them into place and writes ``_common_metadata`` last, so the dataset exists only once
    everything is in place. :meth:`roll_back` removes what the write made: the staging directory, files already
    moved, and the target directory when the write created it. The object is picklable (the filesystem and
    paths), so write tasks on other machines can write into the staging directory.

    Args:
        dataset_url: the target URL, for messages.
        filesystem: the target's filesystem.
        root: the target directory on ``filesystem``.
        replace: replace the target's contents on commit (``mode='overwrite'``) instead of refusing a non-empty
            target.
    """

    def __init__(self, dataset_url: str, filesystem: pafs.FileSystem, root: str, *, replace: bool) -> None:
        self.url = dataset_url
        self.filesystem = filesystem
        self.root = root
        self.replace = replace
        self.staging = posixpath.join(root, f'_petastorm_staging-{uuid.uuid4().hex}')
        self._created_root = False
        self._moved: list[str] = []

    def begin(self) -> None:
        """Check the target and make the staging directory.

        Raises:
            FileExistsError: the target is a file, or a non-empty directory and ``replace`` is False.
        """
        existing = self.filesystem.get_file_info(self.root)
        if existing.type == pafs.FileType.File:
            raise FileExistsError(f'cannot write a dataset to {self.url}: it is a file')
        if existing.type == pafs.FileType.Directory and not self.replace and self.filesystem.get_file_info(
                pafs.FileSelector(self.root, recursive=False)):
            raise FileExistsError(f'cannot write a dataset to {self.url}: the directory is not empty '
                                  f"(pass mode='overwrite' to replace it)")
        self._created_root = existing.type == pafs.FileType.NotFound
        self.filesystem.create_dir(self.staging, recursive=True)

    def file_roller(self, arrow_schema: pa.Schema, row_group_bytes: int, file_bytes: int,
                    compression: str | None) -> FileRoller:
        """A :class:`FileRoller` writing into the staging directory."""
        return FileRoller(self.filesystem, self.staging, arrow_schema, row_group_bytes, file_bytes, compression)

    def commit(self, schema: Unischema, row_groups: Mapping[str, list[int]], *, legacy_metadata: bool,
               summary: Mapping[str, pq.FileMetaData] | None = None) -> None:
        """Move the staged files into place (replacing the target's contents if asked), then write the metadata.

        Args:
            schema: the schema the files follow.
            row_groups: ``{staged file name: [rows of each row group]}`` of every file of the dataset.
            legacy_metadata: also store Petastorm's pickled schema entry (see :func:`write_dataset`).
            summary: the files' footers by name, to write as the ``_metadata`` summary (None: none).

        Raises:
            OSError, pyarrow.ArrowException: the storage failed; call :meth:`roll_back` (or commit inside
                :meth:`rolling_back_on_error`).
        """
        fs = self.filesystem
        if self.replace:
            for info in fs.get_file_info(pafs.FileSelector(self.root, recursive=False)):
                if info.path.rstrip('/') == self.staging:
                    continue
                if info.type == pafs.FileType.Directory:
                    fs.delete_dir(info.path)
                else:
                    fs.delete_file(info.path)
        for name in row_groups:
            move_file(fs, posixpath.join(self.staging, name), posixpath.join(self.root, name))
            self._moved.append(name)
        remove_dir(fs, self.staging)
        if summary:
            _write_summary(fs, self.root, summary)
        write_dataset_metadata(fs, self.root, schema, dict(row_groups), legacy_metadata=legacy_metadata)

    def roll_back(self) -> None:
        """Remove the staging directory, the files already moved into place and a target the write created.

        Failures to remove are logged, not raised: the write already failed.
        """
        _remove_quietly(self.filesystem, self.staging)
        for name in self._moved:
            _remove_quietly(self.filesystem, posixpath.join(self.root, name))
        self._moved = []
        if self._created_root:
            _remove_quietly(self.filesystem, self.root)

    @contextlib.contextmanager
    def rolling_back_on_error(self) -> Iterator[None]:
        """Roll the write back when the ``with`` block raises, then re-raise.

        Raises:
            DatasetWriteError: the block raised a storage error (``OSError`` other than ``FileExistsError``, or
                a pyarrow error), chained as the cause; other exceptions are re-raised as they are.
        """
        try:
            yield
        except BaseException as err:
            self.roll_back()
            if isinstance(err, (OSError, pa.ArrowException)) and not isinstance(err, FileExistsError):
                raise DatasetWriteError(f'writing the dataset {self.url} failed and was rolled back: {err}') from err
            raise


def _write_summary(filesystem: pafs.FileSystem, root: str, footers: Mapping[str, pq.FileMetaData]) -> None:
    """``root/_metadata``: every file's row groups (each tagged with its file's name) in one footer."""
    names = sorted(footers)
    summary = footers[names[0]]
    for name in names[1:]:
        summary.append_row_groups(footers[name])
    with filesystem.open_output_stream(posixpath.join(root, SUMMARY_METADATA)) as out:
        summary.write_metadata_file(out)


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
                for table in _encoded_tables(schema, arrow_schema, _rows_of(rows, schema),
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


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)
    except OSError:
        logger.warning('could not remove %s after a failed write', path, exc_info=True)
