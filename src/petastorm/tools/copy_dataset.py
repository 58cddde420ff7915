r"""Copy a Petastorm dataset with Spark, optionally keeping only some fields and rows (``petastorm-copy-dataset.py``).

Example::

    petastorm-copy-dataset.py file:///data/full file:///data/images_only --field-regex 'id' 'image.*' \
        --not-null-fields image1 --partition-count 8 --row-group-size-mb 64 --master 'local[*]'
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from petastorm import cli as _cli
from petastorm._progress import SparkJobProgress, check_progress_argument
from petastorm.etl.materialize import materialize_dataset
from petastorm.fs import resolve_url
from petastorm.metadata.schemas import stored_schema_at
from petastorm.tools.spark_session_cli import add_configure_spark_arguments, configure_spark
from petastorm.unischema import Unischema, match_unischema_fields

__all__ = ['args_parser', 'copy_dataset', 'main']

logger = logging.getLogger(__name__)

PROG = 'petastorm-copy-dataset.py'
# Large input splits: a copy streams whole files, so fewer, bigger Spark partitions keep row groups intact.
_MAX_PARTITION_BYTES = '1010612736'


def _target_schema(schema: Unischema, field_regex: Sequence[str] | None) -> Unischema:
    if not field_regex:
        return schema
    fields = match_unischema_fields(schema, field_regex)
    if not fields:
        raise ValueError(f'Regular expressions ({", ".join(field_regex)}) do not match any fields '
                         f'({", ".join(schema.fields)})')
    return schema.create_schema_view(fields)


def _check_not_null_fields(schema: Unischema, not_null_fields: Sequence[str] | None) -> None:
    unknown = [name for name in not_null_fields or [] if name not in schema.fields]
    if unknown:
        raise ValueError(f'not-null fields {unknown} are not among the copied fields ({", ".join(schema.fields)})')


def copy_dataset(spark: Any, source_url: str, target_url: str, field_regex: Sequence[str] | None,
                 not_null_fields: Sequence[str] | None, overwrite_output: bool, partitions_count: int | None,
                 row_group_size_mb: float | None, hdfs_driver: str = 'libhdfs3',
                 storage_options: dict | None = None, filesystem: Any = None, *,
                 progress: bool | None = None) -> None:
    """Copy the dataset at ``source_url`` to ``target_url`` with Spark, writing fresh Petastorm metadata.

    Args:
        spark: a ``pyspark.sql.SparkSession``, classic or Spark Connect.
        source_url: the dataset to copy (it must have a stored schema).
        target_url: where to write the copy.
        field_regex: keep only fields whose whole name matches one of these regular expressions (all if empty).
        not_null_fields: drop rows where any of these fields is null.
        overwrite_output: replace an existing ``target_url``; otherwise Spark refuses to write over it.
        partitions_count: repartition into this many Spark partitions (so this many files) before writing.
        row_group_size_mb: row-group size of the copy (Spark's default if None).
        hdfs_driver: accepted for compatibility; the filesystem is chosen from the URL.
        storage_options: options of the filesystem behind both URLs (credentials, endpoint...), used where this
            function reads the schema and writes the metadata. Spark reads and writes the data itself, through
            its Hadoop filesystems: an ``s3a://`` URL needs the hadoop-aws jars and ``spark.hadoop.fs.s3a.*``
            settings (see docs/storage.md).
        filesystem: a ready ``pyarrow.fs`` or fsspec filesystem holding both datasets, instead of resolving the URLs.
        progress: show the copy's Spark tasks done: None (default) draws a ``tqdm`` bar when it is installed and
            stderr is a terminal (unless Spark draws its own console progress), else logs a line every few seconds;
            True always shows it; False never.

    Raises:
        ValueError: ``field_regex`` matches no field, a ``not_null_fields`` name is not a copied field, or
            ``progress`` is not None, True or False.
        PetastormMetadataError: the source has no stored schema.
        pyspark.errors.AnalysisException: ``target_url`` exists and ``overwrite_output`` is False.
    """
    progress = check_progress_argument(progress)
    schema = _target_schema(stored_schema_at(source_url, storage_options, filesystem),
                            field_regex)
    _check_not_null_fields(schema, not_null_fields)
    if partitions_count is not None and partitions_count < 1:
        raise ValueError(f'partitions_count must be a positive number of partitions, got {partitions_count!r}')
    logger.info('copying %d fields from %s to %s', len(schema.fields), source_url, target_url)
    target_filesystem = resolve_url(target_url, storage_options, filesystem, hdfs_driver=hdfs_driver)[0]
    with materialize_dataset(spark, target_url, schema, row_group_size_mb,
                             filesystem_factory=lambda: target_filesystem):
        frame = spark.read.parquet(source_url).select(*schema.fields)
        for name in not_null_fields or []:
            frame = frame.filter(frame[name].isNotNull())
        if partitions_count:
            frame = frame.repartition(partitions_count)
        with SparkJobProgress(spark, f'copying to {target_url}', progress, logger):
            frame.write.mode('overwrite' if overwrite_output else 'error').option('compression', 'none') \
                .parquet(target_url)
        logger.info('data written; writing the Petastorm metadata of %s', target_url)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description='Copy a Petastorm dataset with Spark, optionally keeping only some fields and rows. '
                               'Progress goes to stderr.',
        epilog=f'example: {PROG} file:///tmp/source file:///tmp/target --field-regex "id" "image.*" '
               f'--master "local[2]"')
    parser.add_argument('source_url', help='URL of the dataset to copy, e.g. hdfs:///data/source')
    parser.add_argument('target_url', help='URL of the copy, e.g. hdfs:///data/target')
    parser.add_argument('--overwrite-output', action='store_true', help='replace the target if it exists')
    parser.add_argument('--field-regex', type=str, nargs='+', metavar='REGEX',
                        help='copy only fields whose whole name matches one of these regular expressions')
    parser.add_argument('--not-null-fields', type=str, nargs='+', metavar='FIELD',
                        help='copy only rows where all these fields are not null')
    parser.add_argument('--partition-count', type=int, metavar='N',
                        help='repartition the data into N Spark partitions (N files) before writing')
    parser.add_argument('--row-group-size-mb', type=float, metavar='MB',
                        help='row-group size of the copy, in megabytes (e.g. 64 or 0.5)')
    parser.add_argument('--hdfs-driver', type=str, default='libhdfs3',
                        help='accepted for compatibility; the filesystem is chosen from the URL')
    _cli.add_storage_options_argument(parser)
    add_configure_spark_arguments(parser)
    _cli.add_version_argument(parser)
    return parser


def args_parser() -> argparse.ArgumentParser:
    """The command line parser of ``petastorm-copy-dataset.py`` (Petastorm's name for it)."""
    return _parser()


def _spark_copy(args: argparse.Namespace, storage_options: dict | None) -> None:
    """Start a Spark session as the arguments configure it (or join the active one) and copy.

    The session is stopped only if it was started here: a script calling :func:`_main` keeps its own session.
    """
    from pyspark.sql import SparkSession

    already_active = SparkSession.getActiveSession() is not None
    builder = SparkSession.builder.appName('petastorm-copy') \
        .config('spark.sql.files.maxPartitionBytes', _MAX_PARTITION_BYTES)
    if not (getattr(args, 'remote', None) or os.environ.get('SPARK_REMOTE')):
        # copy_dataset shows the copy's tasks itself; a Spark Connect server keeps its own console settings.
        builder = builder.config('spark.ui.showConsoleProgress', 'false')
    try:
        builder = configure_spark(builder, args)
    except ValueError as err:
        raise _cli.UsageError(str(err)) from err
    spark = builder.getOrCreate()
    try:
        copy_dataset(spark, args.source_url, args.target_url, args.field_regex, args.not_null_fields,
                     args.overwrite_output, args.partition_count, args.row_group_size_mb, args.hdfs_driver,
                     storage_options)
    finally:
        if not already_active:
            spark.stop()


def _main(argv: Sequence[str]) -> None:
    """Run the tool in this process on ``argv`` (without the program name).

    It raises what :func:`copy_dataset` raises (e.g. Spark's ``AnalysisException`` for an existing target without
    ``--overwrite``).

    :func:`main` is the command line: it checks the arguments before Spark starts and turns failures into a
    one-line message and an exit code.
    """
    args = _parser().parse_args(argv)
    _spark_copy(args, _cli.parse_storage_options(args.storage_options))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``petastorm-copy-dataset.py``."""
    args = _parser().parse_args(argv)

    def work() -> None:
        storage_options = _cli.parse_storage_options(args.storage_options)
        _cli.existing_directory(args.source_url, 'source dataset', storage_options)
        if args.partition_count is not None and args.partition_count < 1:
            raise _cli.UsageError(f'--partition-count must be at least 1, got {args.partition_count}')
        if args.row_group_size_mb is not None and not args.row_group_size_mb > 0:
            raise _cli.UsageError(f'--row-group-size-mb must be a positive number of megabytes, got '
                                  f'{args.row_group_size_mb:g}')
        _cli.check_target(args.target_url, args.overwrite_output, storage_options)
        # Resolve the fields before paying for a JVM: bad regexes and not-null fields fail in a second.
        schema = stored_schema_at(args.source_url, storage_options)
        try:
            schema = _target_schema(schema, args.field_regex)
            _check_not_null_fields(schema, args.not_null_fields)
        except ValueError as err:
            raise _cli.UsageError(str(err)) from err
        logger.info('starting Spark to copy %d fields', len(schema.fields))
        _spark_copy(args, storage_options)

    with _cli.progress_logging():
        _cli.run(PROG, work)


if __name__ == '__main__':
    main(sys.argv[1:])
