"""``petastorm-inspect``: describe a dataset, from its metadata and footers, and show its first rows on request.

The report sums the dataset up: the total row count, which metadata the dataset carries (our versioned JSON,
Petastorm's legacy pickle, or none: the schema is then inferred from Parquet), the files and row groups (how
many, and the smallest, median and largest row group in rows and bytes), the schema (fields, numpy dtypes,
shapes, codecs, nullability) and its row-group indexes. ``--files`` lists every file and row group; ``--head N``
reads and prints the first N rows, decoded (only then is any data read: otherwise the Parquet footers and
``_common_metadata`` are all it reads). ``--json`` prints the whole description as one object. For a Delta or
Iceberg table it also says the version described (the latest, or ``--table-version``), its features, the rows the
version deleted from each file, and its delete files.

Example::

    petastorm-inspect file:///tmp/hello_world_dataset
    petastorm-inspect file:///tmp/hello_world_dataset --head 5
    petastorm-inspect s3://bucket/dataset --json | jq .total_rows
    petastorm-inspect s3://bucket/dataset --storage-options '{"endpoint_url": "http://127.0.0.1:9000"}'
    petastorm-inspect file:///tmp/delta_table --table-version 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm import cli as _cli
from petastorm._describe import counted
from petastorm.errors import PetastormMetadataError
from petastorm.metadata.row_group_indexes import load_row_group_indexes
from petastorm.metadata.schemas import stored_or_inferred_schema
from petastorm.store import keys
from petastorm.store.formats import TABLE_FORMATS
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_any_store
from petastorm.unischema import UnischemaField

__all__ = ['PROG', 'describe_value', 'format_description', 'head_rows', 'inspect_dataset', 'main']

PROG = 'petastorm-inspect'
_MAX_FOOTER_READERS = 16


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, type):
        return np.dtype(dtype).name if issubclass(dtype, np.generic) else dtype.__name__
    return str(dtype)


def _describe_field(field: UnischemaField) -> dict[str, Any]:
    return {'name': field.name, 'dtype': _dtype_name(field.numpy_dtype),
            'shape': [None if d is None else int(d) for d in field.shape],
            'codec': None if field.codec is None else str(field.codec), 'nullable': bool(field.nullable)}


def _metadata_kind(store: ParquetStore) -> str:
    if keys.SCHEMA_JSON_KEY in store.metadata_kv:
        return 'json'
    if keys.UNISCHEMA_KEY in store.metadata_kv:
        return 'legacy-pickle'
    return 'none'


def _describe_file(store: ParquetStore, path: str) -> dict[str, Any]:
    try:
        with store.filesystem.open_input_file(path) as f:
            size = f.size()
            metadata = pq.read_metadata(f)
    except (OSError, pa.ArrowException) as err:
        raise PetastormMetadataError(f'{path} is not a readable Parquet file: {_cli.one_line(err)}') from err
    row_groups = []
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        compressed = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        row_groups.append({'index': i, 'rows': group.num_rows, 'bytes': group.total_byte_size,
                           'compressed_bytes': compressed})
    return {'path': store.relpath(path), 'bytes': size, 'rows': metadata.num_rows, 'row_groups': row_groups}


def _describe_indexes(store: ParquetStore) -> dict[str, Any]:
    if keys.INDEXES_JSON_KEY not in store.metadata_kv and keys.ROWGROUPS_INDEX_KEY not in store.metadata_kv:
        return {}
    try:
        indexes = load_row_group_indexes(store)
    except (ValueError, PetastormMetadataError) as err:
        return {'error': _cli.one_line(err)}
    return {name: {'kind': type(indexer).__name__, 'columns': sorted(indexer.column_names),
                   'values': len(indexer.indexed_values)} for name, indexer in indexes.items()}


def inspect_dataset(dataset_url: Any, storage_options: dict | None = None, filesystem: Any = None, *,
                    table_version: Any = None, table_format: str = 'auto') -> dict[str, Any]:
    """A JSON-serializable description of the dataset at ``dataset_url`` (see the module docstring).

    Args:
        dataset_url: the dataset directory (or Parquet store), a Delta or Iceberg table, or a ``pyiceberg`` table.
        storage_options: options of the filesystem behind the URL (credentials, endpoint...).
        filesystem: a ready ``pyarrow.fs`` or fsspec filesystem to use instead of resolving the URL.
        table_version: the version of a table to describe (default: the latest); see ``make_reader``.
        table_format: ``'auto'``, ``'delta'``, ``'iceberg'`` or ``'parquet'``; see ``make_reader``.

    Raises:
        FileNotFoundError: nothing exists at the URL.
        PetastormMetadataError: not a Parquet dataset, or its metadata is unreadable.
    """
    store = open_any_store(dataset_url, storage_options=storage_options, filesystem=filesystem,
                           table_format=table_format, table_version=table_version)
    table = store.describe_version()  # a table's version: None for plain Parquet
    if not store.files:
        if table is None:
            raise PetastormMetadataError(f'{dataset_url} holds no Parquet data files')
        return _empty_version(store, table)
    try:
        with ThreadPoolExecutor(max_workers=min(_MAX_FOOTER_READERS, len(store.files))) as pool:
            files = list(pool.map(lambda path: _describe_file(store, path), store.files))
    except PetastormMetadataError as err:
        raise PetastormMetadataError(f'{dataset_url} is not a Parquet dataset: {err}') from err
    schema = stored_or_inferred_schema(store).schema
    deleted = store.deleted_rows_by_file()
    for path, file in zip(store.files, files, strict=True):  # the rows of a table's file that the version deleted
        if path in deleted:
            file['deleted_rows'] = deleted[path]
    groups = [g for f in files for g in f['row_groups']]
    return {
        'url': str(store.url),
        'metadata': _metadata_kind(store),
        'metadata_file': store.metadata_source(),
        'schema_name': schema._name,
        'fields': [_describe_field(f) for f in schema.fields.values()],
        'partition_columns': store.partition_names,
        'total_rows': sum(f['rows'] for f in files),
        'total_bytes': sum(f['bytes'] for f in files),
        'num_row_groups': len(groups),
        'row_group_rows': _spread([g['rows'] for g in groups]),
        'row_group_bytes': _spread([g['bytes'] for g in groups]),
        'files': files,
        'rowgroup_indexes': _describe_indexes(store),
        **({} if table is None else {'table': table}),
    }


def _empty_version(store: ParquetStore, table: dict[str, Any]) -> dict[str, Any]:
    """The description of a table version without data files (an empty table)."""
    schema = stored_or_inferred_schema(store).schema
    return {'url': str(store.url), 'metadata': _metadata_kind(store), 'metadata_file': None,
            'schema_name': schema._name, 'fields': [_describe_field(f) for f in schema.fields.values()],
            'partition_columns': store.partition_names, 'total_rows': 0, 'total_bytes': 0, 'num_row_groups': 0,
            'files': [], 'rowgroup_indexes': {}, 'table': table}


def _spread(values: list[int]) -> dict[str, int] | None:
    """``{'min', 'median', 'max'}`` of the values (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    return {'min': ordered[0], 'median': ordered[len(ordered) // 2], 'max': ordered[-1]}


def head_rows(dataset_url: str, count: int, storage_options: dict | None = None, *, table_version: Any = None,
              table_format: str = 'auto') -> list[dict[str, Any]]:
    """The first ``count`` rows of the dataset in file order, decoded, as dicts of field values.

    Read with ``make_batch_reader`` (it reads any store and decodes codec fields), one row group at a time, until
    ``count`` rows are in.
    """
    from petastorm.reader import make_batch_reader

    rows: list[dict[str, Any]] = []
    if count <= 0:
        return rows
    with make_batch_reader(dataset_url, reader_pool_type='dummy', shuffle_row_groups=False,
                           storage_options=storage_options, table_version=table_version,
                           table_format=table_format) as reader:  # type: ignore[arg-type]
        for batch in reader:
            columns = batch._asdict()
            length = len(next(iter(columns.values()))) if columns else 0
            for i in range(min(length, count - len(rows))):
                rows.append({name: values[i] for name, values in columns.items()})
            if len(rows) >= count:
                break
    return rows


_CELL_WIDTH = 40


def describe_value(value: Any) -> str:
    """A short text for one field value: numbers and text as they are, arrays by dtype and shape when large."""
    if isinstance(value, np.ndarray):
        if value.size <= 6 and value.ndim <= 1:
            return np.array2string(value, separator=', ')
        return f'{value.dtype}{list(value.shape)} array'
    if isinstance(value, bytes) and len(value) > 16:
        return f'{len(value)} bytes'
    # A numpy float prints its own shortest digits (float32 0.1 is '0.1', not the float64 '0.10000000149011612').
    text = str(value if isinstance(value, np.floating) else value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= _CELL_WIDTH else text[:_CELL_WIDTH - 3] + '...'


def _shape(shape: list[int | None]) -> str:
    return '(' + ', '.join('None' if d is None else str(d) for d in shape) + (',)' if len(shape) == 1 else ')')


def _table(rows: list[tuple[str, ...]], indent: str = '  ') -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + '  '.join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_description(description: dict[str, Any], files: bool = False) -> str:
    """The human-readable report: a summary, plus every file and row group when ``files``.

    With a ``'head'`` entry (rows from :func:`head_rows`, as :func:`describe_value` texts) the rows are shown too.
    """
    count = len(description['files'])
    lines = [f"dataset:  {description['url']}",
             f"metadata: {description['metadata']}"
             + (f" ({description['metadata_file']})" if description['metadata_file'] else ' (schema inferred)'),
             f"rows:     {description['total_rows']} in {counted(description['num_row_groups'], 'row group')}, "
             f"{counted(count, 'file')}, {description['total_bytes']} bytes"]
    rows_spread, bytes_spread = description.get('row_group_rows'), description.get('row_group_bytes')
    if rows_spread and bytes_spread:
        lines.append(f"row groups: {rows_spread['min']} / {rows_spread['median']} / {rows_spread['max']} rows, "
                     f"{bytes_spread['min']} / {bytes_spread['median']} / {bytes_spread['max']} bytes "
                     f'(smallest / median / largest)')
    lines += ['', f"schema {description['schema_name']}:"]
    table = description.get('table')
    if table is not None:
        label = 'version' if table['format'] == 'delta' else 'snapshot'
        lines[1:1] = [f"table:    {table['format']} {label} {table['version']}"
                      + (f" ({', '.join(table['features'])})" if table['features'] else ''),
                      f"deletes:  {table['deleted_rows']} rows deleted, {table['live_rows']} live"
                      + (f", {len(table['delete_files'])} delete files" if table['delete_files'] else '')]
        lines += [f'  delete file {path}' for path in table['delete_files']]
    rows = [(f['name'], f['dtype'], _shape(f['shape']), f['codec'] or '-', 'nullable' if f['nullable'] else '')
            for f in description['fields']]
    widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
    lines += ['  ' + '  '.join(cell.ljust(w) for cell, w in zip(r, [*widths, 0], strict=True)).rstrip()
              for r in rows]
    if description['partition_columns']:
        lines.append(f"partition columns: {', '.join(description['partition_columns'])}")
    if files:
        lines += ['', 'files:']
        for file in description['files']:
            deleted = f" ({file['deleted_rows']} deleted)" if file.get('deleted_rows') else ''
            lines.append(f"  {file['path']}: {file['bytes']} bytes, {counted(file['rows'], 'row')}{deleted}, "
                         f"{counted(len(file['row_groups']), 'row group')}")
            lines += [f"    row group {g['index']}: {counted(g['rows'], 'row')}, {g['bytes']} bytes "
                      f"({g['compressed_bytes']} compressed)" for g in file['row_groups']]
    else:
        shown = [f['path'] for f in description['files'][:3]]
        more = f', ... ({count - len(shown)} more)' if count > len(shown) else ''
        lines += ['', f"files: {', '.join(shown)}{more} (--files lists each file and row group)"]
    head = description.get('head')
    if head is not None:
        names = [f['name'] for f in description['fields']]
        lines += ['', f"first {counted(len(head), 'row')}:"]
        lines += _table([tuple(names)] + [tuple(row.get(name, '') for name in names) for row in head]) if head \
            else ['  (no rows)']
    indexes = description['rowgroup_indexes']
    lines += ['', 'row-group indexes: ' + ('none' if not indexes else '')]
    if 'error' in indexes:
        lines[-1] += f"unreadable: {indexes['error']}"
    else:
        lines += [f"  {name}: {i['kind']} on {', '.join(i['columns'])} ({i['values']} values)"
                  for name, i in indexes.items()]
    return '\n'.join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description='Describe a Petastorm dataset or Parquet store: a summary of its rows, files, row '
                               'groups, metadata, schema and row-group indexes, read from metadata and file '
                               'footers only (--head N also reads the first rows).',
        epilog=f'examples: {PROG} file:///tmp/dataset --head 5; {PROG} s3://bucket/dataset --files')
    parser.add_argument('dataset_url', help='URL of the dataset, e.g. file:///tmp/dataset or s3://bucket/dataset')
    parser.add_argument('--files', action='store_true', help='list every file and its row groups')
    parser.add_argument('--head', type=int, default=0, metavar='N',
                        help='also read and print the first N rows, decoded (arrays by dtype and shape)')
    parser.add_argument('--json', action='store_true', help='print one JSON object instead of the report')
    parser.add_argument('--table-version', default=None,
                        help='of a Delta or Iceberg table: the version (Delta), snapshot id, branch or tag (Iceberg) '
                             'or ISO 8601 timestamp to describe (default: the latest)')
    parser.add_argument('--table-format', default='auto', choices=TABLE_FORMATS,
                        help="'auto' (default) recognises Delta and Iceberg tables; 'parquet' lists every file")
    _cli.add_storage_options_argument(parser)
    _cli.add_version_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``petastorm-inspect``."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)

    def work() -> None:
        storage_options = _cli.parse_storage_options(args.storage_options)
        _cli.existing_path(args.dataset_url, 'dataset', storage_options)
        if args.head < 0:
            raise _cli.UsageError(f'--head must be >= 0, got {args.head}')
        version = args.table_version
        if version is not None and version.lstrip('-').isdigit():
            version = int(version)
        description = inspect_dataset(args.dataset_url, storage_options, table_version=version,
                                      table_format=args.table_format)
        if args.head:
            description['head'] = [{name: describe_value(value) for name, value in row.items()}
                                   for row in head_rows(args.dataset_url, args.head, storage_options,
                                                        table_version=version, table_format=args.table_format)]
        try:
            print(json.dumps(description, indent=2) if args.json else format_description(description, args.files))
            sys.stdout.flush()
        except BrokenPipeError:  # `petastorm-inspect URL | head`: the reader went away, which is fine
            sys.stdout = open(os.devnull, 'w')  # noqa: SIM115 - keeps the interpreter's final flush quiet

    _cli.run(PROG, work)


if __name__ == '__main__':
    main()
