"""Reader options: every argument of ``make_reader``/``make_batch_reader``, declared once and checked once.

:class:`ReaderOptions` is the one list of the readers' arguments, with their defaults (Petastorm's) and types;
the signatures of :func:`~petastorm.reader.make_reader` and :func:`~petastorm.reader.make_batch_reader` repeat
them for users and type checkers, and a test holds the three together. :func:`validate_options` checks raw
arguments into a frozen, normalized ``ReaderOptions``; internals receive that object, never keyword arguments.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from petastorm._checks import check_positive_int, is_integer
from petastorm._warnings import warn_user
from petastorm.cache import LOCAL_DISK_CACHE, LOCAL_DISK_DECODED_CACHE, NULL_CACHE, CacheType, check_cache_arguments
from petastorm.plan import REMAINDER_POLICIES, SHARD_MODES, Remainder, ShardMode, ShardSpec, resolve_shard
from petastorm.pools import POOL_KINDS
from petastorm.predicates import PredicateBase
from petastorm.reading.categories import check_categorical_codes
from petastorm.selectors import RowGroupSelectorBase
from petastorm.store.formats import TABLE_FORMATS, TableFormat
from petastorm.transform import TransformSpec

__all__ = ['LOCAL_DISK_CACHE', 'LOCAL_DISK_DECODED_CACHE', 'NULL_CACHE', 'TABLE_VERSION_CHANGES', 'CacheType',
           'HdfsDriver', 'PoolType', 'ReaderOptions', 'TableVersionChange', 'reader_arguments', 'validate_options']

#: ``reader_pool_type``: inline reference, threads, or worker processes.
PoolType = Literal['thread', 'process', 'dummy']
#: ``hdfs_driver``.
HdfsDriver = Literal['libhdfs3', 'libhdfs']
#: ``table_version_change``: what restoring a position saved on another version of a table does.
TableVersionChange = Literal['refuse', 'restart_epoch']
TABLE_VERSION_CHANGES: tuple[str, ...] = ('refuse', 'restart_epoch')

# Field metadata: the value is not a reader argument, validation derives it.
_DERIVED = {'argument': False}
# Field metadata: an argument of make_reader that make_batch_reader does not take.
_ROW_READER_ONLY = {'batch_reader': False}


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """The arguments of a reader (see :func:`petastorm.reader.make_reader` for their meaning), in signature order.

    ``dataset_url_or_urls`` is ``make_reader``'s ``dataset_url``; ``batched_output`` and ``shard_source`` are not
    arguments: the first says which factory made the reader, validation fills in the second.
    """

    dataset_url_or_urls: str | tuple[str, ...]
    batched_output: bool = field(metadata=_DERIVED)
    schema_fields: Any = None
    reader_pool_type: PoolType = 'thread'
    workers_count: int = 10
    pyarrow_serialize: bool = field(default=False, metadata=_ROW_READER_ONLY)
    results_queue_size: int = 50
    seed: int | None = None
    shuffle_rows: bool = False
    shuffle_row_groups: bool = True
    shuffle_row_drop_partitions: int = 1
    predicate: PredicateBase | None = None
    rowgroup_selector: RowGroupSelectorBase | None = None
    num_epochs: int | None = 1
    cur_shard: int | None = None
    shard_count: int | None = None
    shard_seed: int | None = None
    cache_type: CacheType = 'null'
    cache_location: str | None = None
    cache_size_limit: int | None = None
    cache_row_size_estimate: int | None = None
    cache_extra_settings: dict[str, Any] | None = None
    hdfs_driver: HdfsDriver = 'libhdfs3'
    transform_spec: TransformSpec | None = None
    filters: Any = None
    storage_options: dict[str, Any] | None = None
    zmq_copy_buffers: bool = True
    filesystem: Any = None
    convert_early_to_numpy: bool = False
    shard_mode: ShardMode = 'row_groups'
    shard_remainder: Remainder = 'pad'
    table_version: Any = None
    table_format: TableFormat = 'auto'
    table_version_change: TableVersionChange = 'refuse'
    count_rows: bool = False
    plan_file: str | None = None
    categorical_codes: Any = False
    split: str | None = None
    #: where ``cur_shard='auto'`` found the rank (``'torch.distributed'``, an environment variable) or None.
    shard_source: str | None = field(default=None, metadata=_DERIVED)

    @property
    def shard(self) -> ShardSpec:
        """This reader's shard and how shards split the data."""
        return ShardSpec(self.cur_shard or 0, self.shard_count or 1, self.shard_mode, self.shard_remainder,
                         self.shard_source)


def reader_arguments(batched: bool) -> list[dataclasses.Field[Any]]:
    """The fields of :class:`ReaderOptions` that are arguments of ``make_batch_reader`` or ``make_reader``.

    Args:
        batched: ``make_batch_reader``'s (True) or ``make_reader``'s (False).

    Returns:
        The fields in signature order (the first is the dataset URL).
    """
    return [f for f in dataclasses.fields(ReaderOptions) if f.metadata.get('argument', True)
            and (not batched or f.metadata.get('batch_reader', True))]


def validate_options(**arguments: Any) -> ReaderOptions:
    """Check reader arguments and return them as one frozen, normalized :class:`ReaderOptions`.

    Args:
        **arguments: ``dataset_url_or_urls``, ``batched_output`` and any reader arguments (by name; the others
            take their defaults).

    Raises:
        TypeError: an argument name that readers do not take.
        ValueError: an argument has a wrong type or value; the message names it and what is expected.
    """
    raw = ReaderOptions(**arguments)
    return _validated(raw)


def _validated(raw: ReaderOptions) -> ReaderOptions:
    urls = raw.dataset_url_or_urls
    if isinstance(urls, (list, tuple)):
        urls = tuple(urls)
    if raw.reader_pool_type not in POOL_KINDS:
        raise ValueError(f'Unknown reader_pool_type: {raw.reader_pool_type!r}; expected one of '
                         f'{", ".join(POOL_KINDS)}')
    workers_count = check_positive_int('workers_count', raw.workers_count)
    results_queue_size = check_positive_int('results_queue_size', raw.results_queue_size)
    _check_order(raw)
    cur_shard, shard_count, shard_source = _check_shards(raw)
    _warn_about_deprecated(raw)
    cache_type = check_cache_arguments(raw.cache_type, raw.cache_location, raw.cache_size_limit,
                                       raw.cache_row_size_estimate, raw.cache_extra_settings)
    _check_row_hooks(raw)
    if raw.hdfs_driver not in ('libhdfs3', 'libhdfs'):
        raise ValueError(f"hdfs_driver must be 'libhdfs3' or 'libhdfs', got {raw.hdfs_driver!r}")
    if not isinstance(raw.count_rows, bool):
        raise ValueError(f'count_rows must be True or False, got {raw.count_rows!r}')
    if raw.plan_file is not None and not isinstance(raw.plan_file, (str, os.PathLike)):
        raise ValueError(f'plan_file must be a path (a str), got {type(raw.plan_file).__name__}')
    if raw.split is not None and (not isinstance(raw.split, str) or not raw.split):
        raise ValueError(f"split must be a split's name ('train', 'validation', 'test', ...) or None, got "
                         f'{raw.split!r}')
    if raw.storage_options is not None and not isinstance(raw.storage_options, dict):
        raise ValueError(f'storage_options must be a dict, got {type(raw.storage_options).__name__}')
    _check_table_options(raw)
    return dataclasses.replace(
        raw, categorical_codes=check_categorical_codes(raw.categorical_codes),
        dataset_url_or_urls=urls, workers_count=workers_count, results_queue_size=results_queue_size,
        seed=None if raw.seed is None else int(raw.seed), shuffle_rows=bool(raw.shuffle_rows),
        shuffle_row_groups=bool(raw.shuffle_row_groups),
        shuffle_row_drop_partitions=int(raw.shuffle_row_drop_partitions), cur_shard=cur_shard,
        shard_count=shard_count, cache_type=cache_type, convert_early_to_numpy=bool(raw.convert_early_to_numpy),
        shard_source=shard_source, plan_file=None if raw.plan_file is None else os.fspath(raw.plan_file))


def _check_table_options(raw: ReaderOptions) -> None:
    """``table_format``, ``table_version`` and ``table_version_change`` (see :mod:`petastorm.tables`)."""
    import datetime

    if raw.table_format not in TABLE_FORMATS:
        raise ValueError(f'table_format must be one of {TABLE_FORMATS}, got {raw.table_format!r}')
    version = raw.table_version
    if version is not None and (isinstance(version, bool) or not isinstance(
            version, (numbers.Integral, str, datetime.date))):
        raise ValueError(f'table_version must be None (the latest), a version number (Delta) or snapshot id '
                         f'(Iceberg), a datetime or ISO 8601 timestamp, or an Iceberg branch or tag name; got '
                         f'{version!r}')
    if raw.table_version_change not in TABLE_VERSION_CHANGES:
        raise ValueError(f'table_version_change must be one of {TABLE_VERSION_CHANGES}, got '
                         f'{raw.table_version_change!r}')


def _check_order(raw: ReaderOptions) -> None:
    if raw.seed is not None and not is_integer(raw.seed):
        raise ValueError(f'seed must be an int or None, got {raw.seed!r}')
    partitions = raw.shuffle_row_drop_partitions
    if not is_integer(partitions) or partitions < 1:
        raise ValueError(f'shuffle_row_drop_partitions must be an integer >= 1, got {partitions!r}')
    num_epochs = raw.num_epochs
    if num_epochs is not None and (not is_integer(num_epochs) or num_epochs < 1):
        # The words in parentheses are the original's (code matches them); what to do comes first.
        raise ValueError(f'num_epochs must be the number of passes over the data (an int >= 1), or None to read '
                         f'forever; got num_epochs={num_epochs!r} (iterations must be positive integer or None)')


def _check_shards(raw: ReaderOptions) -> tuple[int | None, int | None, str | None]:
    """``(cur_shard, shard_count, shard_source)`` with ``'auto'`` resolved, once checked."""
    if raw.shard_mode not in SHARD_MODES:
        raise ValueError(f'shard_mode must be one of {SHARD_MODES}, got {raw.shard_mode!r}')
    if raw.shard_remainder not in REMAINDER_POLICIES:
        raise ValueError(f'shard_remainder must be one of {REMAINDER_POLICIES}, got {raw.shard_remainder!r}')
    cur_shard, shard_count, shard_source = resolve_shard(raw.cur_shard, raw.shard_count)
    if cur_shard is not None or shard_count is not None:
        if not (is_integer(cur_shard) and is_integer(shard_count) and shard_count):
            # The words in parentheses are the original's (code matches them); what to do comes first.
            raise ValueError('shard_count is the number of shards (an int >= 1) and cur_shard the shard this '
                             'reader reads (an int in [0, shard_count)): give both, or leave both None to read '
                             f'everything; got cur_shard={cur_shard!r}, shard_count={shard_count!r} (partition and '
                             'num_partitions must be ints and both specified to use partitioning)')
        if shard_count < 1 or not 0 <= cur_shard < shard_count:
            raise ValueError(f'cur_shard must be in [0, shard_count); got cur_shard={cur_shard}, '
                             f'shard_count={shard_count}')
    shuffled = raw.shuffle_row_groups or raw.shuffle_rows
    if raw.shard_mode == 'rows' and (shard_count or 1) > 1 and raw.seed is None and shuffled:
        # Each shard takes its share of one global order; unseeded shards would each draw their own order, and
        # their shares would overlap and miss rows without any error.
        raise ValueError(f"shard_mode='rows' splits one shuffled order of the rows among shard_count={shard_count} "
                         f'shards, so every shard must draw the same order: pass the same seed= to the reader of '
                         f'every shard (or shuffle_row_groups=False and shuffle_rows=False)')
    return cur_shard, shard_count, shard_source


def _warn_about_deprecated(raw: ReaderOptions) -> None:
    if raw.shard_seed:
        warn_user('shard_seed was deprecated and will be removed in future versions. Use seed to apply '
                  'randomization effects on sharding row groups.')
    if raw.pyarrow_serialize:
        warn_user('pyarrow_serializer was deprecated and will be removed in future versions. The argument no '
                  'longer has any effect.', DeprecationWarning)
    if raw.zmq_copy_buffers is not True:
        warn_user('zmq_copy_buffers no longer has any effect: the process pool moves column buffers through '
                  'shared memory.', DeprecationWarning)


def _check_row_hooks(raw: ReaderOptions) -> None:
    """The user objects that choose and change rows: predicate, row-group selector, transform, filters."""
    if raw.predicate is not None and not isinstance(raw.predicate, PredicateBase):
        raise ValueError('predicate parameter is expected to be derived from PredicateBase')
    if raw.rowgroup_selector is not None and not isinstance(raw.rowgroup_selector, RowGroupSelectorBase):
        raise ValueError(f'rowgroup_selector must be derived from RowGroupSelectorBase, got '
                         f'{raw.rowgroup_selector!r}')
    if raw.transform_spec is not None and not isinstance(raw.transform_spec, TransformSpec):
        raise ValueError(f'transform_spec must be a TransformSpec, got {type(raw.transform_spec).__name__}')
    filters = raw.filters
    if filters is not None and not isinstance(filters, Sequence) and not _is_expression(filters):
        raise ValueError(f'filters must be a list of (column, op, value) tuples, a list of such lists, or a '
                         f'pyarrow.compute.Expression; got {filters!r}')


def _is_expression(value: Any) -> bool:
    import pyarrow.compute as pc

    return isinstance(value, pc.Expression)

