"""Rows to Arrow tables: every row checked against the schema, each column built at once by its codec.

:func:`encode_rows` is the step every writer shares (``write_dataset`` here, Ray's datasink on its workers);
:func:`encoded_tables` runs it in threads over rows in chunks, in input order (image encoders release the GIL).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._compat import refuse_unreadable_null_lists
from petastorm.codecs import ArrowTensorCodec, AudioCodec, VideoCodec
from petastorm.errors import SchemaError
from petastorm.unischema import Unischema, arrow_type_of_field, encode_row

__all__ = ['ROWS_PER_TASK', 'encode_rows', 'encoded_tables', 'rows_of']

#: rows encoded per task (one call of :func:`encode_rows`).
ROWS_PER_TASK = 64


def rows_of(data: Any, schema: Unischema) -> Iterator[Mapping[str, Any]]:
    """Row dicts from an iterable of dicts, a pyarrow Table or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        for batch in data.to_batches(max_chunksize=ROWS_PER_TASK):
            yield from (_coerce_cells(row, schema) for row in batch.to_pylist())
        return
    if type(data).__module__.startswith('pandas') and hasattr(data, 'to_dict'):
        for start in range(0, len(data), ROWS_PER_TASK):
            records = data.iloc[start:start + ROWS_PER_TASK].to_dict('records')
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


def encoded_tables(schema: Unischema, arrow_schema: pa.Schema, rows: Iterator[Mapping[str, Any]],
                    workers_count: int) -> Iterator[pa.Table]:
    """Encode rows in parallel, yielding tables in input order; at most ``2 * workers`` chunks in flight."""
    chunks = ((i * ROWS_PER_TASK, list(chunk)) for i, chunk in enumerate(_batched(rows, ROWS_PER_TASK)))
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
