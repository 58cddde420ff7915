"""``petastorm-inspect``: describe a dataset without reading its data.

Shows the schema (fields, numpy dtypes, shapes, codecs, nullability), the data files, their row groups (rows,
uncompressed and compressed bytes), the total row count, which metadata the dataset carries (our versioned JSON,
Petastorm's legacy pickle, or none: the schema is then inferred from Parquet) and its row-group indexes. Only the
Parquet footers and ``_common_metadata`` are read. For a Delta or Iceberg table: the version described (the latest,
or ``--table-version``), its features, the files of that version with the rows the version deleted from each, and
its delete files.

Example::

    petastorm-inspect file:///tmp/hello_world_dataset
    petastorm-inspect s3://bucket/dataset --json | jq .total_rows
    petastorm-inspect s3://bucket/dataset --storage-options '{"endpoint_url": "http://127.0.0.1:9000"}'
    petastorm-inspect file:///tmp/delta_table --table-version 3
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm.errors import PetastormMetadataError
from petastorm.etl.dataset_metadata import infer_or_load_unischema
from petastorm.metadata import keys
from petastorm.metadata.store import ParquetStore
from petastorm.tables import TABLE_FORMATS, TableStore
from petastorm.tables import open_dataset as open_table_or_store
from petastorm.tools import _cli
from petastorm.unischema import UnischemaField

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
    from petastorm.etl.rowgroup_indexing import INDEXES_JSON_KEY, get_row_group_indexes

    if INDEXES_JSON_KEY not in store.metadata_kv and keys.ROWGROUPS_INDEX_KEY not in store.metadata_kv:
        return {}
    try:
        indexes = get_row_group_indexes(store)
    except (ValueError, PetastormMetadataError) as err:
        return {'error': _cli.one_line(err)}
    return {name: {'kind': type(indexer).__name__, 'columns': sorted(indexer.column_names),
                   'values': len(indexer.indexed_values)} for name, indexer in indexes.items()}


def _describe_table(store: TableStore) -> dict[str, Any]:
    version = store.version
    return {'format': version.format, 'version': version.version, 'timestamp_ms': version.timestamp_ms,
            'features': list(store.features), 'live_rows': sum(p.num_rows for p in store.pieces),
            'deleted_rows': store.deleted_rows, 'delete_files': list(store.delete_files)}


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
    store = open_table_or_store(dataset_url, storage_options=storage_options, filesystem=filesystem,
                                table_format=table_format, table_version=table_version)
    if isinstance(store, TableStore) and not store.files:
        schema = infer_or_load_unischema(store)
        return {'url': str(store.url), 'metadata': _metadata_kind(store), 'metadata_file': None,
                'schema_name': schema._name, 'fields': [_describe_field(f) for f in schema.fields.values()],
                'partition_columns': store.partition_names, 'total_rows': 0, 'total_bytes': 0, 'num_row_groups': 0,
                'files': [], 'rowgroup_indexes': {}, 'table': _describe_table(store)}
    if not store.files:
        raise PetastormMetadataError(f'{dataset_url} holds no Parquet data files')
    try:
        with ThreadPoolExecutor(max_workers=min(_MAX_FOOTER_READERS, len(store.files))) as pool:
            files = list(pool.map(lambda path: _describe_file(store, path), store.files))
    except PetastormMetadataError as err:
        raise PetastormMetadataError(f'{dataset_url} is not a Parquet dataset: {err}') from err
    schema = infer_or_load_unischema(store)
    table = None
    if isinstance(store, TableStore):
        table = _describe_table(store)
        for file in files:  # the rows of a table's file that the version deleted
            file['deleted_rows'] = store.table_files[posixpath.join(str(store.root), file['path'])].deleted_rows
    return {
        'url': str(store.url),
        'metadata': _metadata_kind(store),
        'metadata_file': None if store.metadata_path is None else (
            store.metadata_path if table is not None else store.relpath(store.metadata_path)),
        'schema_name': schema._name,
        'fields': [_describe_field(f) for f in schema.fields.values()],
        'partition_columns': store.partition_names,
        'total_rows': sum(f['rows'] for f in files),
        'total_bytes': sum(f['bytes'] for f in files),
        'num_row_groups': sum(len(f['row_groups']) for f in files),
        'files': files,
        'rowgroup_indexes': _describe_indexes(store),
        **({} if table is None else {'table': table}),
    }


def _shape(shape: list[int | None]) -> str:
    return '(' + ', '.join('None' if d is None else str(d) for d in shape) + (',)' if len(shape) == 1 else ')')


def format_description(description: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [f"dataset:  {description['url']}",
             f"metadata: {description['metadata']}"
             + (f" ({description['metadata_file']})" if description['metadata_file'] else ' (schema inferred)'),
             f"rows:     {description['total_rows']} in {description['num_row_groups']} row groups, "
             f"{len(description['files'])} files, {description['total_bytes']} bytes",
             '', f"schema {description['schema_name']}:"]
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
    lines += ['', 'files:']
    for file in description['files']:
        deleted = f" ({file['deleted_rows']} deleted)" if file.get('deleted_rows') else ''
        lines.append(f"  {file['path']}: {file['bytes']} bytes, {file['rows']} rows{deleted}, "
                     f"{len(file['row_groups'])} row groups")
        lines += [f"    row group {g['index']}: {g['rows']} rows, {g['bytes']} bytes "
                  f"({g['compressed_bytes']} compressed)" for g in file['row_groups']]
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
        prog=PROG, description='Describe a Petastorm dataset or Parquet store: schema, files, row groups, '
                               'metadata and row-group indexes. Reads only metadata and file footers.',
        epilog=f'example: {PROG} file:///tmp/dataset --json')
    parser.add_argument('dataset_url', help='URL of the dataset, e.g. file:///tmp/dataset or s3://bucket/dataset')
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
        version = args.table_version
        if version is not None and version.lstrip('-').isdigit():
            version = int(version)
        description = inspect_dataset(args.dataset_url, storage_options, table_version=version,
                                      table_format=args.table_format)
        try:
            print(json.dumps(description, indent=2) if args.json else format_description(description))
            sys.stdout.flush()
        except BrokenPipeError:  # `petastorm-inspect URL | head`: the reader went away, which is fine
            sys.stdout = open(os.devnull, 'w')  # noqa: SIM115 - keeps the interpreter's final flush quiet

    _cli.run(PROG, work)


if __name__ == '__main__':
    main()
