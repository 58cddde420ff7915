"""``make_reader`` and ``make_batch_reader``: read a dataset as rows or as column batches.

A :class:`Reader` is built in steps: options are validated into one frozen object, the URL is resolved to a
filesystem, the store's schema and row groups are loaded, a pure plan decides which row ranges this shard reads
in which order for every epoch, and a worker pool reads, decodes and transforms whole row groups. Rows are cut
from the decoded columns only at the very end, for ``make_reader``.

Memory: at most ``max(workers_count, min(results_queue_size, 2 * workers_count))`` work items are in flight
(being read or waiting to be consumed), and fewer when their decoded size (the row groups being read counted
twice: raw and decoded) would pass a byte budget of 128 MiB per CPU (256 MiB to 1 GiB, see
:func:`petastorm.pools.default_max_bytes_in_flight`), so peak memory is about that budget plus one row group
being consumed.
"""

from __future__ import annotations

from typing import Any, Literal

from petastorm.fs import normalize_dir_url
from petastorm.plan import Remainder, ShardMode
from petastorm.predicates import PredicateBase
from petastorm.reading.options import (
    LOCAL_DISK_CACHE,
    NULL_CACHE,
    CacheType,
    HdfsDriver,
    PoolType,
    TableVersionChange,
    validate_options,
)
from petastorm.reading.reader import Reader
from petastorm.selectors import RowGroupSelectorBase
from petastorm.store.formats import TableFormat, is_iceberg_table
from petastorm.transform import TransformSpec

__all__ = ['LOCAL_DISK_CACHE', 'NULL_CACHE', 'Reader', 'make_batch_reader', 'make_reader',
           'normalize_dataset_url_or_urls']


def normalize_dataset_url_or_urls(dataset_url_or_urls: Any, filesystem: Any = None) -> Any:
    """Check a URL or a non-empty list of URLs and strip one trailing ``/`` from each (a pyiceberg table passes).

    Absolute local paths become ``file://`` URLs; with a ``filesystem`` a path without a scheme is a path on it.
    """
    if is_iceberg_table(dataset_url_or_urls):
        return dataset_url_or_urls
    if isinstance(dataset_url_or_urls, list):
        if not dataset_url_or_urls:
            raise ValueError('dataset url list must be non-empty.')
        return [normalize_dir_url(url, filesystem) for url in dataset_url_or_urls]
    return normalize_dir_url(dataset_url_or_urls, filesystem)


def make_reader(dataset_url: str | list[str], schema_fields: Any = None, reader_pool_type: PoolType = 'thread',
                workers_count: int = 10, pyarrow_serialize: bool = False, results_queue_size: int = 50,
                seed: int | None = None, shuffle_rows: bool = False, shuffle_row_groups: bool = True,
                shuffle_row_drop_partitions: int = 1, predicate: PredicateBase | None = None,
                rowgroup_selector: RowGroupSelectorBase | None = None,
                num_epochs: int | None = 1, cur_shard: int | Literal['auto'] | None = None,
                shard_count: int | Literal['auto'] | None = None, shard_seed: int | None = None,
                cache_type: CacheType = 'null', cache_location: str | None = None,
                cache_size_limit: int | None = None, cache_row_size_estimate: int | None = None,
                cache_extra_settings: dict[str, Any] | None = None, hdfs_driver: HdfsDriver = 'libhdfs3',
                transform_spec: TransformSpec | None = None, filters: Any = None,
                storage_options: dict[str, Any] | None = None, zmq_copy_buffers: bool = True,
                filesystem: Any = None, convert_early_to_numpy: bool = False,
                shard_mode: ShardMode = 'row_groups', shard_remainder: Remainder = 'pad',
                table_version: Any = None, table_format: TableFormat = 'auto',
                table_version_change: TableVersionChange = 'refuse',
                count_rows: bool = False, plan_file: str | None = None, categorical_codes: Any = False,
                split: str | None = None) -> Reader:
    """A reader that yields one namedtuple per row of a Petastorm dataset, every field decoded.

    Args:
        dataset_url: dataset directory URL (``file:///...``, ``s3://...``, ``hdfs://...``, any fsspec URL); a
            Delta or Iceberg table's directory (or Iceberg metadata file) URL, or a ``pyiceberg`` table object,
            reads the table (see ``table_version``).
        schema_fields: fields to read: ``UnischemaField`` s and/or regular expressions matching whole names.
        reader_pool_type: ``'thread'``, ``'process'`` or ``'dummy'`` (inline, the reference behaviour).
        workers_count: threads or processes reading and decoding row groups.
        pyarrow_serialize: deprecated, no effect.
        results_queue_size: upper bound on decoded row groups waiting for the consumer (see module doc).
        seed: makes the whole order (row groups, drop partitions, row shuffles) reproducible, identical for every
            pool kind and worker count. Row groups are re-shuffled every epoch from ``(seed, epoch)``.
        shuffle_rows: shuffle rows inside each row group (or drop partition).
        shuffle_row_groups: shuffle the order of row groups every epoch. A shuffle of every row group needs them all
            known: with False, a plain store without a ``_metadata`` summary delivers its first batch while the
            footers of its later files are still read (docs/storage.md, "Planning at scale").
        shuffle_row_drop_partitions: split every row group into this many disjoint row ranges read separately.
        predicate: a :class:`~petastorm.predicates.PredicateBase`; its fields are read and decoded first.
        rowgroup_selector: a row-group selector (needs row-group indexes in the metadata).
        num_epochs: passes over the data; ``None`` means forever.
        cur_shard: this reader's shard (with ``shard_count``): row group ``i`` goes to shard ``i % shard_count``;
            with fewer row groups than shards, rows are split into equal contiguous ranges. ``'auto'``: the rank
            from ``torch.distributed`` (if initialized) or the launcher's environment (``RANK``, Horovod, MPI,
            SLURM), read once here; see :func:`petastorm.plan.detect_rank_and_world_size`.
        shard_count: number of shards (``'auto'``: the world size, found as for ``cur_shard``).
        shard_seed: deprecated; use ``seed``.
        cache_type: ``'null'`` (default), ``'local-disk'``: keep the raw row-group columns read from the files
            in a local directory, for later epochs, or ``'local-disk-decoded'``: keep them with their images and
            arrays decoded, so later epochs skip the decoding too (see :mod:`petastorm.cache`). The cache is
            removed when the reader exits, as in Petastorm; pass ``cache_extra_settings={'cleanup': False}`` to
            keep it for later readers.
        cache_location: the cache directory (``'local-disk'``).
        cache_size_limit: the cache's size limit in bytes (None: no limit, entries are never evicted).
        cache_row_size_estimate: the expected size of one entry in bytes (checked against the limit).
        cache_extra_settings: more settings of :class:`~petastorm.local_disk_cache.LocalDiskCache`, e.g.
            ``{'cleanup': False}``.
        hdfs_driver: ``'libhdfs3'`` or ``'libhdfs'`` (for ``hdfs://`` URLs).
        transform_spec: a :class:`~petastorm.transform.TransformSpec` applied to each decoded row in the workers.
        filters: pyarrow DNF filters (``[('col', '>', 3)]``) applied to rows and used to skip row groups.
        storage_options: fsspec options (credentials, endpoint) for remote URLs.
        zmq_copy_buffers: deprecated, no effect.
        filesystem: a ready pyarrow or fsspec filesystem, instead of resolving the URL.
        convert_early_to_numpy: accepted for compatibility; decoding always happens in the workers.
        shard_mode: ``'row_groups'`` (default, Petastorm's sharding by whole row groups) or ``'rows'``: every
            epoch's global seeded order of rows is split into equal consecutive shares, so that every shard
            reads exactly the same number of rows per epoch (see ``docs/distributed.md``).
        shard_remainder: with ``shard_mode='rows'``, what happens to the fewer than ``shard_count`` rows left
            over: ``'pad'`` (default) repeats the first rows of the epoch's order, ``'drop_last'`` skips them,
            ``'spread'`` gives them to the first shards (one each: shares differ by one row, every row is read once).
        table_version: for a Delta or Iceberg table (see ``docs/tables.md``), the version to read: None (default)
            the latest; an int, the Delta version number or the Iceberg snapshot id; a ``datetime`` (naive ones are
            UTC) or an ISO 8601 string, the version current at that time; a string naming an Iceberg branch or tag.
            The version read is in :meth:`Reader.state_dict`, so a run resumes on the same rows.
        table_format: ``'auto'`` (default): a directory holding ``_delta_log`` is read as a Delta table, one
            holding ``metadata/*.metadata.json`` (or the URL of such a file, or a ``pyiceberg`` table passed as
            the URL) as an Iceberg table, anything else as Parquet; ``'delta'`` or ``'iceberg'`` insist on that
            format; ``'parquet'`` reads every Parquet file under the directory as plain files, even in a table.
        table_version_change: what :meth:`Reader.load_state_dict` does with a position saved on another version
            of the table: ``'refuse'`` (default) raises, naming both versions; ``'restart_epoch'`` reads the
            saved epoch again from its start, on this reader's version.
        count_rows: with a ``predicate`` or ``filters`` on stored columns, count the rows they keep when the reader
            is made, by reading only the columns they need (one pass over them, in threads), so that ``len()`` of
            the reader and of the torch loaders is known (progress bars, learning-rate schedules). Without it the
            count is known only when the footers' statistics decide every row group (``filters`` that keep or
            drop whole row groups) or the filters are on partition columns. Predicates must judge each row on
            its own (as the built-in ones do). Only this shard's row groups are counted, and the reader keeps one
            byte per row of those a filter cuts. Not for NGrams or ``make_batch_reader`` transform functions,
            whose output rows only reading tells.
        plan_file: a local file where the plan of a plain Parquet store (what its footers tell: the rows of every
            row group, the files' schema) is kept: written by the first reader, read by the next ones instead of
            every footer, as long as the store's listing (file names, sizes, modification times) is the one it
            was made from; a changed store is planned again and the file rewritten. See ``docs/storage.md``
            (planning at scale): the ranks of a ``torch.distributed`` job share one plan without it.
        categorical_codes: deliver categorical columns as int64 codes (for an embedding layer or a loss) instead
            of their values (the default, False, as Petastorm). ``True``: every categorical column (pandas or
            Polars ``Categorical``, Polars ``Enum``, Arrow dictionaries); a list of field names: those fields (also
            plain string or integer columns); a dict ``{field: categories}``: those fields with the categories
            given (a list, whose order is the codes'; ``None``: from the data). Each such field becomes an int64
            field whose :class:`~petastorm.codecs.CategoryCodec` holds the categories
            (``reader.schema.fields['color'].codec.categories``, as a Hugging Face ``ClassLabel`` holds its names),
            one list for the whole store whatever each file's dictionary. Categories not given are read from the
            column of every row group when the reader is made: the stored dictionary when every row group has the
            same one (pandas' and Polars ``Enum``'s categories, in their order), else the distinct values sorted.
            A value that is not a category is an error; nulls stay nulls. See ``docs/types.md``.
        split: of a directory holding several splits (a Hugging Face dataset repository, downloaded or on any
            store), read only this one: ``'train'``, ``'validation'``, ``'test'`` (or any split name of the Hub's
            ``<split>-00000-of-00002.parquet`` files), found in file and directory names as ``datasets`` finds
            them (``data/train-00000-of-00002.parquet``, ``train/...``; ``val``, ``dev`` name the validation split,
            ``eval`` the test split). None (default): every Parquet file under the directory, as Petastorm reads a
            directory, with a warning naming the splits when the file names say there are several. A split no
            file is of is an error naming the splits there are. See ``docs/storage.md``.

    Returns:
        A :class:`Reader`: an iterator and context manager.
    """
    return Reader(validate_options(
        dataset_url_or_urls=normalize_dataset_url_or_urls(dataset_url, filesystem), batched_output=False,
        schema_fields=schema_fields, reader_pool_type=reader_pool_type, workers_count=workers_count,
        pyarrow_serialize=pyarrow_serialize, results_queue_size=results_queue_size, seed=seed,
        shuffle_rows=shuffle_rows, shuffle_row_groups=shuffle_row_groups,
        shuffle_row_drop_partitions=shuffle_row_drop_partitions,
        predicate=predicate, rowgroup_selector=rowgroup_selector, num_epochs=num_epochs, cur_shard=cur_shard,
        shard_count=shard_count, shard_seed=shard_seed, cache_type=cache_type, cache_location=cache_location,
        cache_size_limit=cache_size_limit, cache_row_size_estimate=cache_row_size_estimate,
        cache_extra_settings=cache_extra_settings, hdfs_driver=hdfs_driver, transform_spec=transform_spec,
        filters=filters, storage_options=storage_options, zmq_copy_buffers=zmq_copy_buffers, filesystem=filesystem,
        convert_early_to_numpy=convert_early_to_numpy, shard_mode=shard_mode, shard_remainder=shard_remainder,
        table_version=table_version, table_format=table_format, table_version_change=table_version_change,
        count_rows=count_rows, plan_file=plan_file, categorical_codes=categorical_codes,
        split=split))


def make_batch_reader(dataset_url_or_urls: str | list[str], schema_fields: Any = None,
                      reader_pool_type: PoolType = 'thread', workers_count: int = 10, results_queue_size: int = 50,
                      seed: int | None = None, shuffle_rows: bool = False, shuffle_row_groups: bool = True,
                      shuffle_row_drop_partitions: int = 1, predicate: PredicateBase | None = None,
                      rowgroup_selector: RowGroupSelectorBase | None = None,
                      num_epochs: int | None = 1, cur_shard: int | Literal['auto'] | None = None,
                      shard_count: int | Literal['auto'] | None = None, shard_seed: int | None = None,
                      cache_type: CacheType = 'null', cache_location: str | None = None,
                      cache_size_limit: int | None = None, cache_row_size_estimate: int | None = None,
                      cache_extra_settings: dict[str, Any] | None = None, hdfs_driver: HdfsDriver = 'libhdfs3',
                      transform_spec: TransformSpec | None = None, filters: Any = None,
                      storage_options: dict[str, Any] | None = None, zmq_copy_buffers: bool = True,
                      filesystem: Any = None, convert_early_to_numpy: bool = False,
                      shard_mode: ShardMode = 'row_groups', shard_remainder: Remainder = 'pad',
                      table_version: Any = None, table_format: TableFormat = 'auto',
                      table_version_change: TableVersionChange = 'refuse',
                      count_rows: bool = False, plan_file: str | None = None, categorical_codes: Any = False,
                split: str | None = None) -> Reader:
    """A reader that yields one namedtuple of numpy column arrays per row group (or drop partition).

    Reads any Parquet store: with Petastorm metadata (codec columns are decoded) or without (the schema is
    inferred from the Parquet schema), a directory or a list of file URLs. The arguments are those of
    :func:`make_reader`, except that a ``TransformSpec`` function receives and returns a pandas DataFrame, and a
    predicate without a vectorized ``evaluate`` receives a DataFrame and returns a boolean Series: an ``in_lambda``
    function gets one pandas Series per field, so it must work element by element (``(x > 5) & (x < 10)``, not
    ``5 < x < 10``).
    """
    return Reader(validate_options(
        dataset_url_or_urls=normalize_dataset_url_or_urls(dataset_url_or_urls, filesystem), batched_output=True,
        schema_fields=schema_fields, reader_pool_type=reader_pool_type, workers_count=workers_count,
        results_queue_size=results_queue_size, seed=seed, shuffle_rows=shuffle_rows,
        shuffle_row_groups=shuffle_row_groups, shuffle_row_drop_partitions=shuffle_row_drop_partitions,
        predicate=predicate, rowgroup_selector=rowgroup_selector, num_epochs=num_epochs, cur_shard=cur_shard,
        shard_count=shard_count, shard_seed=shard_seed, cache_type=cache_type, cache_location=cache_location,
        cache_size_limit=cache_size_limit, cache_row_size_estimate=cache_row_size_estimate,
        cache_extra_settings=cache_extra_settings, hdfs_driver=hdfs_driver, transform_spec=transform_spec,
        filters=filters, storage_options=storage_options, zmq_copy_buffers=zmq_copy_buffers, filesystem=filesystem,
        convert_early_to_numpy=convert_early_to_numpy, shard_mode=shard_mode, shard_remainder=shard_remainder,
        table_version=table_version, table_format=table_format, table_version_change=table_version_change,
        count_rows=count_rows, plan_file=plan_file, categorical_codes=categorical_codes,
        split=split))
