"""Writing a dataset without Spark: rows (dicts), Arrow tables or pandas DataFrames -> Parquet + metadata.

Example::

    from petastorm import write_dataset
    write_dataset('file:///tmp/hello_world', HelloWorldSchema, (row_generator(i) for i in range(1000)),
                  row_group_size_mb=64)

Rows are validated exactly as :func:`~petastorm.unischema.dict_to_spark_row` validates them and encoded in
parallel threads (image encoders release the GIL). Files are first written to a hidden staging directory
inside the target, moved into place when every row was written, and ``_common_metadata`` is written last, so a
failed write leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import itertools
import logging
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._progress import ProgressMeter, check_progress_argument
from petastorm.errors import DatasetWriteError, SchemaError
from petastorm.fs import resolve_url
from petastorm.metadata.write import write_dataset_metadata
from petastorm.unischema import Unischema, arrow_type_of_field, encode_row

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


def _validate_options(row_group_size_mb: float, file_size_mb: float, mode: str, workers_count: int | None,
                      compression: str | None) -> None:
    if not isinstance(row_group_size_mb, (int, float)) or row_group_size_mb <= 0:
        raise ValueError(f'row_group_size_mb must be a positive number, got {row_group_size_mb!r}')
    if not isinstance(file_size_mb, (int, float)) or file_size_mb < row_group_size_mb:
        raise ValueError(f'file_size_mb must be a number >= row_group_size_mb ({row_group_size_mb}), '
                         f'got {file_size_mb!r}')
    if mode not in ('error', 'overwrite'):
        raise ValueError(f"mode must be 'error' or 'overwrite', got {mode!r}")
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
    # Columns of tables hold lists or Python scalars; codec fields want ndarrays of the field's type.
    out = dict(row)
    for name, field in schema.fields.items():
        value = out.get(name)
        if value is None:
            continue
        if field.codec is not None and (hasattr(field.codec, 'encode_column') or arrow_type_of_field(
                field) == pa.binary()) and not isinstance(value, (np.ndarray, bytes)):
            out[name] = np.asarray(value, dtype=field.numpy_dtype)
        elif isinstance(value, float) and np.isnan(value) and field.nullable:
            out[name] = None
    return out


def _encode_chunk(schema: Unischema, arrow_schema: pa.Schema, rows: list[Mapping[str, Any]],
                  first_index: int) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in schema.fields}
    for offset, row in enumerate(rows):
        try:
            encoded = encode_row(schema, row, column_encoded=True)
        except (SchemaError, TypeError) as err:
            raise type(err)(f'row {first_index + offset}: {err}') from err
        for name, value in encoded.items():
            columns[name].append(value)
    arrays = []
    for field in arrow_schema:
        codec = schema.fields[field.name].codec
        try:
            if hasattr(codec, 'encode_column'):
                arrays.append(codec.encode_column(schema.fields[field.name], columns[field.name]))
            else:
                arrays.append(pa.array(columns[field.name], type=field.type))
        except (pa.ArrowException, TypeError, ValueError) as err:
            raise SchemaError(f'field {field.name!r} (rows {first_index}..{first_index + len(rows) - 1}): values '
                              f'cannot be stored as {field.type}: {err}') from err
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


def _encoded_tables(schema: Unischema, arrow_schema: pa.Schema, rows: Iterator[Mapping[str, Any]],
                    workers_count: int) -> Iterator[pa.Table]:
    """Encode rows in parallel, yielding tables in input order; at most ``2 * workers`` chunks in flight."""
    chunks = ((i * _ROWS_PER_TASK, list(chunk)) for i, chunk in enumerate(_batched(rows, _ROWS_PER_TASK)))
    with ThreadPoolExecutor(max_workers=workers_count, thread_name_prefix='petastorm-encode') as pool:
        pending = []
        for start, chunk in chunks:
            pending.append(pool.submit(_encode_chunk, schema, arrow_schema, chunk, start))
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


class _FileRoller:
    """Writes row groups of about ``row_group_bytes`` into files of about ``file_bytes``."""

    def __init__(self, filesystem: pafs.FileSystem, directory: str, arrow_schema: pa.Schema, row_group_bytes: int,
                 file_bytes: int, compression: str | None):
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

    def add(self, table: pa.Table) -> None:
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
        table = table.combine_chunks()
        if self._writer is None:
            name = f'part-{len(self.row_groups):05d}-{self._token}.parquet'
            self._stream = self._fs.open_output_stream(posixpath.join(self._dir, name))
            self._writer = pq.ParquetWriter(self._stream, self._schema, compression=self._compression)
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

    def finish(self) -> None:
        self._flush_row_group()
        self._close_file()

    def abort(self) -> None:
        try:
            self._close_file()
        except Exception:  # the write already failed; the staging directory is removed next
            logger.debug('closing a partial file after a failed write failed', exc_info=True)


def write_dataset(dataset_url: str, schema: Unischema, rows: Any, *,
                  row_group_size_mb: float = 32, file_size_mb: float = 512,
                  mode: Literal['error', 'overwrite'] = 'error', workers_count: int | None = None,
                  compression: str | None = 'snappy', storage_options: dict | None = None,
                  filesystem: Any = None, legacy_metadata: bool = True,
                  progress: bool | None = None) -> WriteResult:
    """Write a Petastorm dataset (Parquet files plus ``_common_metadata``) without Spark.

    Args:
        dataset_url: target directory URL (``file:///...``, ``s3://...``, any fsspec URL).
        schema: the Unischema every row must follow.
        rows: an iterable of dicts ``{field name: value}`` (values as ``dict_to_spark_row`` takes them), a
            ``pyarrow.Table`` or a pandas DataFrame of such values.
        row_group_size_mb: target uncompressed size of a row group (the unit readers read and shuffle).
        file_size_mb: start a new file once a file holds about this much.
        mode: ``'error'`` refuses a non-empty target; ``'overwrite'`` replaces it once the new data is written.
        workers_count: encoding threads (default: the number of CPUs).
        compression: Parquet compression codec (``'snappy'``, ``'zstd'``, ``None``...).
        storage_options: fsspec options for remote URLs (credentials, endpoint).
        filesystem: a ready pyarrow or fsspec filesystem instead of resolving ``dataset_url``.
        legacy_metadata: also store Petastorm's pickled schema entry so that Petastorm releases (0.13.1) can
            open the dataset; ``False`` stores only our JSON metadata.
        progress: show the rows written: None (default) draws a ``tqdm`` bar (the ``progress`` extra) when stderr
            is a terminal and the write takes more than a couple of seconds, else logs a line every few seconds
            (logger ``petastorm.writer``); True always shows it; False never.

    Returns:
        A :class:`WriteResult` with the files written and the rows per row group.

    Raises:
        SchemaError: a row does not follow the schema (the message names the row and field); nothing is left.
        FileExistsError: the target holds data and ``mode='error'``.
        DatasetWriteError: the storage failed; whatever was written was removed.
    """
    if not isinstance(schema, Unischema):
        raise SchemaError(f'write_dataset needs a Unischema, got {type(schema).__name__}')
    _validate_options(row_group_size_mb, file_size_mb, mode, workers_count, compression)
    progress = check_progress_argument(progress)
    fs, root = resolve_url(dataset_url, storage_options, filesystem)
    arrow_schema = pa.schema([pa.field(f.name, arrow_type_of_field(f), nullable=bool(f.nullable))
                              for f in schema.fields.values()])
    existing = fs.get_file_info(root)
    if existing.type == pafs.FileType.File:
        raise FileExistsError(f'cannot write a dataset to {dataset_url}: it is a file')
    if existing.type == pafs.FileType.Directory and mode == 'error' and fs.get_file_info(
            pafs.FileSelector(root, recursive=False)):
        raise FileExistsError(f'cannot write a dataset to {dataset_url}: the directory is not empty '
                              f"(pass mode='overwrite' to replace it)")
    staging = posixpath.join(root, f'_petastorm_staging-{uuid.uuid4().hex}')
    fs.create_dir(staging, recursive=True)
    roller = _FileRoller(fs, staging, arrow_schema, int(row_group_size_mb * _MB), int(file_size_mb * _MB),
                         compression)
    num_rows = 0
    meter = ProgressMeter(f'writing {dataset_url}', _known_length(rows), 'rows', progress, logger)
    try:
        for table in _encoded_tables(schema, arrow_schema, _rows_of(rows, schema), workers_count or os.cpu_count()
                                     or 1):
            roller.add(table)
            num_rows += table.num_rows
            meter.update(table.num_rows)
        meter.close()
        roller.finish()
        if num_rows == 0:
            raise SchemaError(f'write_dataset got no rows for {dataset_url}; nothing was written')
        _commit(fs, root, staging, list(roller.row_groups), replace=mode == 'overwrite')
        write_dataset_metadata(fs, root, schema, roller.row_groups, legacy_metadata=legacy_metadata)
    except BaseException as err:
        meter.close()
        roller.abort()
        _remove_quietly(fs, staging)
        for name in roller.row_groups:  # files already moved into place by a commit that failed half-way
            _remove_quietly(fs, posixpath.join(root, name))
        if existing.type == pafs.FileType.NotFound:
            _remove_quietly(fs, root)
        if isinstance(err, (OSError, pa.ArrowException)) and not isinstance(err, FileExistsError):
            raise DatasetWriteError(f'writing the dataset {dataset_url} failed and was rolled back: {err}') from err
        raise
    files = tuple(posixpath.join(root, name) for name in roller.row_groups)
    logger.info('wrote %d rows in %d files to %s', num_rows, len(files), dataset_url)
    return WriteResult(dataset_url, files, num_rows, roller.row_groups)


def _known_length(rows: Any) -> int | None:
    """The number of rows when ``rows`` knows it (a list, a Table, a DataFrame), else None (a generator)."""
    try:
        return len(rows)
    except TypeError:
        return None


def _commit(fs: pafs.FileSystem, root: str, staging: str, names: list[str], replace: bool) -> None:
    if replace:
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=False)):
            if info.path.rstrip('/') == staging:
                continue
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(info.path)
            else:
                fs.delete_file(info.path)
    for name in names:
        fs.move(posixpath.join(staging, name), posixpath.join(root, name))
    fs.delete_dir(staging)


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)
    except OSError:
        logger.warning('could not remove %s after a failed write', path, exc_info=True)
