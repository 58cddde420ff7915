"""``petastorm-tensor-columns``: rewrite ``NdarrayCodec`` columns of a dataset as Arrow tensor columns.

The named fields (stored as ``.npy`` or ``.npz`` blobs) become :class:`~petastorm.codecs.ArrowTensorCodec`
columns, which pyarrow, Hugging Face ``datasets``, DuckDB, Polars and Ray read as tensors or nested lists. Every
other column is copied as stored; every file keeps its row groups (so row-group indexes stay valid). Petastorm
0.13.1 cannot read the converted fields: keep a copy for old readers if they still need it.

Example::

    petastorm-tensor-columns file:///data/mnist --columns image                      # in place
    petastorm-tensor-columns file:///data/mnist --columns image --output-url file:///data/mnist_tensors

In place, every converted file is written to a staging directory first and moved over its original only when
all files converted, then the metadata is rewritten; with ``--output-url`` the source is never changed.
"""

from __future__ import annotations

import argparse
import functools
import logging
import posixpath
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm import cli as _cli
from petastorm._compat import refuse_unreadable_null_lists
from petastorm.codecs import ArrowTensorCodec, CompressedNdarrayCodec, NdarrayCodec
from petastorm.errors import CodecError, SchemaError
from petastorm.fs import resolve_location, resolve_url
from petastorm.metadata.schemas import stored_schema
from petastorm.metadata.write import update_common_metadata, write_dataset_metadata
from petastorm.store import keys
from petastorm.store.listing import COMMON_METADATA, SUMMARY_METADATA
from petastorm.store.opening import open_store
from petastorm.unischema import Unischema, UnischemaField, arrow_type_of_field

__all__ = ['PROG', 'convert_to_tensor_columns', 'main', 'tensor_schema']

PROG = 'petastorm-tensor-columns'
logger = logging.getLogger(__name__)

# Keys that describe the schema or the files: rewritten from the converted dataset, never carried over.
_REWRITTEN_KEYS = (keys.SCHEMA_JSON_KEY, keys.UNISCHEMA_KEY, keys.ROW_GROUPS_JSON_KEY, keys.ROW_GROUPS_PER_FILE_KEY)


def tensor_schema(schema: Unischema, columns: Sequence[str]) -> Unischema:
    """``schema`` with the named ``NdarrayCodec`` / ``CompressedNdarrayCodec`` fields stored by ``ArrowTensorCodec``.

    Raises:
        SchemaError: a name is not a field, a field is not stored by an ndarray codec, or its dtype or shape
            cannot be a tensor (the message names the field and what was expected).
    """
    if not columns:
        raise SchemaError('no columns to convert were given')
    fields = []
    for name in columns:
        if name not in schema.fields:
            raise SchemaError(f'{name!r} is not a field of the dataset; its fields are {list(schema.fields)}')
        if not isinstance(schema.fields[name].codec, (NdarrayCodec, CompressedNdarrayCodec)):
            raise SchemaError(f'field {name!r} is stored with {schema.fields[name].codec or "no codec"}; only '
                              f'NdarrayCodec and CompressedNdarrayCodec fields can be converted')
    for field in schema.fields.values():
        if field.name in columns:
            field = UnischemaField(field.name, field.numpy_dtype, field.shape, ArrowTensorCodec(), field.nullable)
            arrow_type_of_field(field)  # refuses a non-numeric dtype or a 0-d shape, naming the field
        fields.append(field)
    return Unischema(schema._name, fields)


def _convert_row_group(table: pa.Table, old: Unischema, new: Unischema, columns: Sequence[str],
                       where: str) -> pa.Table:
    for name in columns:
        index = table.schema.get_field_index(name)
        if index < 0:
            raise CodecError(f'{where} has no column {name!r}')
        decoded = old.fields[name].codec.decode_column(old.fields[name], table.column(name))
        # Rows of a stacked column are views of it; an object column holds each row's array or None.
        values: list[np.ndarray | None] = list(decoded)
        field = new.fields[name]
        array = field.codec.encode_column(field, values)
        table = table.set_column(index, pa.field(name, array.type, nullable=bool(field.nullable)), array)
    return table


def _convert_file(fs: pafs.FileSystem, source: str, target: str, old: Unischema, new: Unischema,
                  columns: Sequence[str], compression: str) -> list[int]:
    """Convert one Parquet file row group by row group; the rows of each row group written."""
    rows = []
    with fs.open_input_file(source) as f:
        parquet = pq.ParquetFile(f)
        writer = None
        try:
            for index in range(parquet.num_row_groups):
                table = _convert_row_group(parquet.read_row_group(index), old, new, columns,
                                           f'{source} (row group {index})')
                refuse_unreadable_null_lists(table, f'{source} (row group {index})')
                if writer is None:
                    writer = pq.ParquetWriter(fs.open_output_stream(target), table.schema, compression=compression)
                writer.write_table(table, row_group_size=max(1, table.num_rows))
                rows.append(table.num_rows)
        finally:
            if writer is not None:
                writer.close()
    return rows


def convert_to_tensor_columns(dataset_url: str, columns: Sequence[str], *, output_url: str | None = None,
                              compression: str = 'snappy', storage_options: dict | None = None) -> Unischema:
    """Rewrite the named ndarray-codec fields of a dataset as Arrow tensor columns.

    Args:
        dataset_url: the dataset (a directory with Petastorm metadata).
        columns: names of ``NdarrayCodec`` or ``CompressedNdarrayCodec`` fields with a numeric dtype.
        output_url: write the converted dataset there (an empty or new directory); default: in place.
        compression: Parquet compression of the rewritten files.
        storage_options: fsspec options for remote URLs.

    Returns:
        The schema of the converted dataset.

    Raises:
        SchemaError: see :func:`tensor_schema`.
        PetastormMetadataError: the dataset has no Petastorm schema.
    """
    store = open_store(resolve_location(dataset_url, storage_options))
    if store.root is None or store.metadata_path is None or store.subset:
        raise SchemaError(f'{dataset_url} is not a dataset directory with Petastorm metadata')
    old = stored_schema(store)
    new = tensor_schema(old, list(columns))
    target_root = _target_root(store, dataset_url, output_url, storage_options)
    row_groups = _convert_files(store, target_root, old, new, list(columns), compression)
    _write_metadata(store, target_root, new, row_groups)
    return new


def _target_root(store: Any, dataset_url: str, output_url: str | None, storage_options: dict | None) -> str:
    """Where the converted dataset goes: the dataset itself, or ``output_url`` (emptied) on the same filesystem."""
    if output_url is None:
        return store.root
    fs = store.filesystem
    target_fs, target_root = resolve_url(output_url, storage_options)
    if target_fs.type_name != fs.type_name:
        raise SchemaError(f'--output-url {output_url} must be on the same filesystem as {dataset_url}')
    if target_root.rstrip('/') == store.root.rstrip('/'):
        raise SchemaError(f'--output-url {output_url} is the dataset itself; leave it out to convert in place')
    if fs.get_file_info(target_root).type == pafs.FileType.Directory:
        fs.delete_dir(target_root)  # the caller checked that replacing it was asked for
    return target_root


def _convert_files(store: Any, target_root: str, old: Unischema, new: Unischema, columns: list[str],
                   compression: str) -> dict[str, list[int]]:
    """Every data file converted into a staging directory, then moved to ``target_root``; their row group sizes."""
    fs = store.filesystem
    staging = posixpath.join(target_root, f'_petastorm_staging-{uuid.uuid4().hex}')
    fs.create_dir(staging, recursive=True)
    row_groups = {}
    try:
        for path in store.files:
            relative = store.relpath(path)
            staged = posixpath.join(staging, relative)
            fs.create_dir(posixpath.dirname(staged), recursive=True)
            row_groups[relative] = _convert_file(fs, path, staged, old, new, columns, compression)
            logger.info('converted %s', relative)
        for relative in row_groups:
            final = posixpath.join(target_root, relative)
            fs.create_dir(posixpath.dirname(final), recursive=True)
            fs.move(posixpath.join(staging, relative), final)
    finally:
        if fs.get_file_info(staging).type == pafs.FileType.Directory:
            fs.delete_dir(staging)
    return row_groups


def _write_metadata(store: Any, target_root: str, new: Unischema, row_groups: dict[str, list[int]]) -> None:
    """The converted dataset's metadata: the new schema, the row groups, the user's other key-value entries."""
    fs = store.filesystem
    kept = {k: v for k, v in store.metadata_kv.items() if k not in _REWRITTEN_KEYS and not k.startswith(b'ARROW:')}
    for name in (COMMON_METADATA, SUMMARY_METADATA):  # their Arrow schema still shows the blob columns
        path = posixpath.join(target_root, name)
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)
    if kept:
        update_common_metadata(fs, target_root, kept)
    write_dataset_metadata(fs, target_root, new, row_groups, legacy_metadata=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description='Rewrite NdarrayCodec columns of a Petastorm dataset as '
                                     'Arrow fixed_shape_tensor / variable_shape_tensor columns (ArrowTensorCodec).')
    _cli.add_version_argument(parser)
    _cli.add_storage_options_argument(parser)
    parser.add_argument('dataset_url', help='the dataset directory URL (file:///..., s3://..., hdfs://...)')
    parser.add_argument('--columns', nargs='+', required=True, metavar='FIELD',
                        help='names of the NdarrayCodec / CompressedNdarrayCodec fields to convert')
    parser.add_argument('--output-url', default=None,
                        help='write the converted dataset there instead of converting in place')
    parser.add_argument('--overwrite-output', action='store_true', help='replace what is at --output-url')
    parser.add_argument('--compression', default='snappy', help='Parquet compression of the rewritten files')
    return parser


def _convert_as_asked(args: argparse.Namespace) -> None:
    """The tool's work: check the URLs before anything is written, convert, print the converted fields."""
    storage_options = _cli.parse_storage_options(args.storage_options)
    _cli.existing_directory(args.dataset_url, 'dataset', storage_options)
    if args.output_url is not None:
        _cli.check_target(args.output_url, args.overwrite_output, storage_options)
    try:
        with _cli.progress_logging():
            schema = convert_to_tensor_columns(args.dataset_url, args.columns, output_url=args.output_url,
                                               compression=args.compression, storage_options=storage_options)
    except SchemaError as err:  # a column that cannot be converted: found before any file is written
        raise _cli.UsageError(str(err)) from err
    print(f'converted {", ".join(args.columns)}: {_describe(schema, args.columns)}')


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``petastorm-tensor-columns``."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    _cli.run(PROG, functools.partial(_convert_as_asked, args))


def _describe(schema: Unischema, columns: Sequence[str]) -> Any:
    return '; '.join(f'{name} {np.dtype(schema.fields[name].numpy_dtype).name}{tuple(schema.fields[name].shape)}'
                     for name in columns)


if __name__ == '__main__':
    main()
