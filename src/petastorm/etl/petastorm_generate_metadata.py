"""Add or repair the Petastorm metadata of an existing Parquet store (``petastorm-generate-metadata.py``).

The schema is the one already stored in the dataset (our JSON, or the pickle written by Petastorm) unless a
Unischema is named explicitly; the row-group map is rebuilt from the file footers. A plain Parquet store (no
stored schema, none named: what Spark, DuckDB, Polars or Hugging Face write) gets a ``_metadata`` summary of every
file's row groups instead, its schema the files' own, as ``make_batch_reader`` infers it: readers then plan it
from two requests, whatever its file count, instead of one or two per file. Keys that are still valid
(row-group indexes, Spark's schema) are kept. Nothing here needs Spark: the footers are read in parallel
threads, so the command works without a JVM and takes seconds for thousands of files.

Example::

    petastorm-generate-metadata.py hdfs://namenode:8020/path/to/dataset
    petastorm-generate-metadata.py file:///tmp/ds --unischema_class my_project.schemas.MySchema
    petastorm-generate-metadata.py --dataset_url s3://bucket/ds --storage-options @s3-credentials.json
    petastorm-generate-metadata.py s3://bucket/plain-parquet   # a plain store: writes its _metadata summary
"""

from __future__ import annotations

import argparse
import logging
import os
import posixpath
import pydoc
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import counted
from petastorm._progress import ProgressMeter, check_progress_argument
from petastorm.errors import PetastormMetadataError, PetastormMetadataGenerationError
from petastorm.etl.dataset_metadata import get_schema, open_dataset
from petastorm.etl.materialize import write_petastorm_metadata
from petastorm.fs import resolve_url
from petastorm.metadata.write import write_summary
from petastorm.store import keys
from petastorm.store.listing import list_data_files
from petastorm.store.pieces import partition_keys_of
from petastorm.unischema import Unischema

__all__ = ['generate_petastorm_metadata', 'main']

logger = logging.getLogger(__name__)

PROG = 'petastorm-generate-metadata.py'
_FOOTER_THREADS = 16


def _locate(dotted_name: str) -> Any:
    """``pydoc.locate``, turning an error raised while importing the module into a ValueError."""
    try:
        return pydoc.locate(dotted_name)
    except pydoc.ErrorDuringImport as err:
        raise ValueError(f'unischema class {dotted_name!r}: importing {err.filename} failed with '
                         f'{type(err.value).__name__}: {err.value}') from err


def load_unischema(dotted_name: str) -> Unischema:
    """The Unischema instance at ``module.attribute`` (e.g. ``'examples.mnist.schema.MnistSchema'``).

    A module in the current directory is found too, as ``python -m`` would find it: an installed command's
    ``sys.path`` starts with the directory of the command, not the current one.

    Raises:
        ValueError: nothing importable has that name, it is not a Unischema, or importing its module failed.
    """
    found = _locate(dotted_name)
    if found is None:
        here = os.getcwd()
        if here not in sys.path and '' not in sys.path:
            sys.path.append(here)
            try:
                found = _locate(dotted_name)
            finally:
                sys.path.remove(here)
    if found is None:
        raise ValueError(f'unischema class {dotted_name!r} was not found: give the full dotted path '
                         f'module.attribute of a Unischema instance, importable from this Python. For a module '
                         f'outside the current directory, put its directory on the path (PYTHONPATH=. from the '
                         f'directory holding it, or PYTHONPATH=/path/to/dir)')
    if not isinstance(found, Unischema):
        raise ValueError(f'{dotted_name!r} is a {type(found).__name__}, not a Unischema instance')
    return found


def _read_footers(filesystem: pafs.FileSystem, paths: list[str], progress: bool | None = None,
                  description: str = 'reading footers') -> dict[str, pq.FileMetaData]:
    """Every file's Parquet footer, read in parallel threads, with progress shown for long runs."""

    def read(path: str) -> pq.FileMetaData:
        try:
            with filesystem.open_input_file(path) as f:
                return pq.read_metadata(f)
        except (OSError, pa.ArrowException) as err:
            raise PetastormMetadataGenerationError(f'{path} is not a readable Parquet file: {err}') from err

    footers: dict[str, pq.FileMetaData] = {}
    with ThreadPoolExecutor(max_workers=min(_FOOTER_THREADS, max(1, len(paths))),
                            thread_name_prefix='petastorm-footers') as pool, \
            ProgressMeter(description, len(paths), 'files', progress, logger) as meter:
        futures = {pool.submit(read, path): path for path in paths}
        for future in as_completed(futures):
            footers[futures[future]] = future.result()
            meter.update()
    return footers


def _check_fields_are_columns(schema: Unischema, root: str, footers: dict[str, pq.FileMetaData],
                              dataset_url: str) -> None:
    """Refuse a schema naming fields that are neither columns of every file nor hive partition directories."""
    for path in sorted(footers):
        columns = footers[path].schema.to_arrow_schema().names
        partitions = [name for name, _ in partition_keys_of(posixpath.relpath(path, root))]
        missing = [name for name in schema.fields if name not in columns and name not in partitions]
        if missing:
            raise PetastormMetadataGenerationError(
                f'schema {schema._name} does not match {dataset_url}: its fields {missing} are not columns of '
                f'{posixpath.relpath(path, root)} (columns: {", ".join(columns)}); nothing was written. Name the '
                f'Unischema the data was written with (--unischema_class, unischema_class=...).')


def _stored_schema(dataset_url: str, storage_options: dict | None, filesystem: Any) -> Unischema | None:
    """The schema stored in the dataset, or None for a plain Parquet store (no metadata names a schema)."""
    store = open_dataset(dataset_url, storage_options=storage_options, filesystem=filesystem)
    if keys.SCHEMA_JSON_KEY not in store.metadata_kv and keys.UNISCHEMA_KEY not in store.metadata_kv:
        return None
    try:
        return get_schema(store)
    except PetastormMetadataError as err:
        raise PetastormMetadataError(
            f'{dataset_url} has no stored schema to reuse ({err}). Name the dataset\'s Unischema with '
            f'--unischema_class module.attribute (unischema_class=... in Python).') from err


def generate_petastorm_metadata(spark: Any, dataset_url: str, unischema_class: str | None = None,
                                use_summary_metadata: bool = False, hdfs_driver: str = 'libhdfs3',
                                storage_options: dict | None = None, filesystem: Any = None, *,
                                progress: bool | None = None) -> None:
    """Write (or rewrite) the Petastorm metadata of the Parquet store at ``dataset_url``.

    Before anything is written, every field of the schema must be a column of every data file (or a hive partition
    directory): a schema that does not describe the files is refused, instead of writing metadata that readers
    would fail on.

    Args:
        spark: accepted for compatibility and may be None: the footers are read on this machine, with threads.
        dataset_url: the dataset directory.
        unischema_class: dotted path of a Unischema instance to store; when None the schema already stored in
            the dataset (ours or Petastorm's) is reused, and a plain Parquet store without one gets only its
            ``_metadata`` summary (its files' schema is their own).
        use_summary_metadata: also write a Parquet ``_metadata`` summary of every row group (a plain store's is
            always written).
        hdfs_driver: accepted for compatibility; the filesystem is chosen from the URL.
        storage_options: options of the filesystem behind the URL (credentials, endpoint...).
        filesystem: a ready ``pyarrow.fs`` or fsspec filesystem to use instead of resolving the URL.
        progress: show the footers read: None (default) draws a ``tqdm`` bar when it is installed and stderr is
            a terminal, else logs a line every few seconds; True always shows it; False never.

    Raises:
        ValueError: ``unischema_class`` does not name a Unischema, the URL is malformed, or ``progress`` is not
            None, True or False.
        PetastormMetadataError: no ``unischema_class``, and the schema stored in the dataset is unreadable.
        PetastormMetadataGenerationError: the directory holds no Parquet data files, one is unreadable, or a
            field of the schema is not a column of the files.
        FileNotFoundError: nothing exists at ``dataset_url``.
    """
    progress = check_progress_argument(progress)
    schema = (load_unischema(unischema_class) if unischema_class
              else _stored_schema(dataset_url, storage_options, filesystem))
    fs, root = resolve_url(dataset_url, storage_options, filesystem, hdfs_driver=hdfs_driver)
    paths = list_data_files(fs, root, dataset_url)
    if not paths:
        raise PetastormMetadataGenerationError(f'{dataset_url} holds no Parquet data files to describe')
    logger.info('reading the footers of %s of %s', counted(len(paths), 'file'), dataset_url)
    footers = _read_footers(fs, paths, progress, f'reading the footers of {dataset_url}')
    by_name = {posixpath.relpath(path, root): footer for path, footer in sorted(footers.items())}
    if schema is None:
        logger.info('%s is plain Parquet: writing the _metadata summary of its %s', dataset_url,
                    counted(len(paths), 'file'))
        write_summary(fs, root, by_name)
        return
    _check_fields_are_columns(schema, root, footers, dataset_url)
    row_groups = {name: [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
                  for name, footer in by_name.items()}
    if use_summary_metadata:
        logger.info('writing the _metadata summary of %s', counted(len(paths), 'file'))
        write_summary(fs, root, by_name)
    write_petastorm_metadata(fs, root, schema, dataset_url, row_groups)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description='Add or regenerate the Petastorm metadata (_common_metadata) of an existing Parquet store.\n'
                    'The schema already stored in the dataset is reused unless --unischema_class names one;\n'
                    'a plain Parquet store (no stored schema) gets a _metadata summary of its row groups.\n'
                    'No Spark job is needed: file footers are read in parallel threads. Progress goes to stderr.',
        epilog=f'examples:\n  {PROG} file:///tmp/hello_world_dataset\n'
               f'  {PROG} --dataset_url hdfs://namenode:8020/path/to/dataset '
               f'--unischema_class examples.hello_world.generate_hello_world_dataset.HelloWorldSchema\n'
               f'  spark-submit $(which {PROG}) --dataset_url hdfs:///path/to/dataset',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('dataset_url_positional', nargs='?', metavar='DATASET_URL',
                        help='URL of the dataset directory (or give it with --dataset_url)')
    parser.add_argument('--dataset_url', '--dataset-url', dest='dataset_url',
                        help='URL of the dataset directory, e.g. hdfs:///path/to/dataset or file:///tmp/dataset')
    parser.add_argument('--unischema_class', '--unischema-class', dest='unischema_class',
                        help='fully qualified module.attribute of the Unischema to store; default: the schema '
                             'already stored in the dataset')
    parser.add_argument('--use-summary-metadata', action='store_true',
                        help='also write a Parquet _metadata summary file listing every row group')
    parser.add_argument('--master', help='accepted for compatibility; no Spark job is needed')
    parser.add_argument('--spark-driver-memory', default='4g', help='accepted for compatibility; not used')
    parser.add_argument('--hdfs-driver', default='libhdfs3', help='accepted for compatibility; not used')
    from petastorm import cli as _cli

    _cli.add_storage_options_argument(parser)
    _cli.add_version_argument(parser)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed arguments, with the dataset URL from the positional argument or ``--dataset_url``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.dataset_url is None and args.dataset_url_positional is None:
        parser.error('the dataset URL is required: give it as the argument DATASET_URL or with --dataset_url')
    if args.dataset_url is not None and args.dataset_url_positional is not None and \
            args.dataset_url != args.dataset_url_positional:
        parser.error(f'two different dataset URLs: {args.dataset_url_positional} and --dataset_url '
                     f'{args.dataset_url}; give one')
    args.dataset_url = args.dataset_url or args.dataset_url_positional
    return args


def _main(argv: Sequence[str]) -> None:
    """Run the tool in this process on ``argv`` (without the program name).

    It raises what :func:`generate_petastorm_metadata` raises; :func:`main` is the command line (exit codes,
    one-line errors).
    """
    from petastorm import cli as _cli

    args = _parse(argv)
    generate_petastorm_metadata(None, args.dataset_url, args.unischema_class, args.use_summary_metadata,
                                args.hdfs_driver, storage_options=_cli.parse_storage_options(args.storage_options))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``petastorm-generate-metadata.py``."""
    from petastorm import cli as _cli

    args = _parse(argv)

    def work() -> None:
        storage_options = _cli.parse_storage_options(args.storage_options)
        _cli.existing_directory(args.dataset_url, 'dataset', storage_options)
        if args.unischema_class:
            try:
                load_unischema(args.unischema_class)
            except ValueError as err:
                raise _cli.UsageError(str(err)) from err
        generate_petastorm_metadata(None, args.dataset_url, args.unischema_class, args.use_summary_metadata,
                                    args.hdfs_driver, storage_options=storage_options)

    with _cli.progress_logging():
        _cli.run(PROG, work)


if __name__ == '__main__':
    main(sys.argv[1:])
