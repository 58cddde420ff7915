"""Reader options: every argument of ``make_reader``/``make_batch_reader`` checked once into a frozen object.

Internals receive :class:`ReaderOptions`, never the raw keyword arguments.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from petastorm.cache import check_cache_arguments
from petastorm.distributed import SHARD_MODES, resolve_shard
from petastorm.plan import REMAINDER_POLICIES
from petastorm.pools import POOL_KINDS
from petastorm.predicates import PredicateBase
from petastorm.transform import TransformSpec

NULL_CACHE = 'null'
LOCAL_DISK_CACHE = 'local-disk'


@dataclass(frozen=True)
class ReaderOptions:
    """Validated reader options (see :func:`petastorm.reader.make_reader` for their meaning)."""

    dataset_url_or_urls: str | tuple[str, ...]
    batched_output: bool
    schema_fields: Any
    reader_pool_type: str
    workers_count: int
    results_queue_size: int
    seed: int | None
    shuffle_rows: bool
    shuffle_row_groups: bool
    shuffle_row_drop_partitions: int
    predicate: PredicateBase | None
    rowgroup_selector: Any
    num_epochs: int | None
    cur_shard: int | None
    shard_count: int | None
    cache_type: str
    cache_location: str | None
    cache_size_limit: int | None
    cache_row_size_estimate: int | None
    cache_extra_settings: dict | None
    hdfs_driver: str
    transform_spec: TransformSpec | None
    filters: Any
    storage_options: dict | None
    filesystem: Any
    convert_early_to_numpy: bool
    shard_mode: str = 'row_groups'
    shard_remainder: str = 'pad'
    #: where ``cur_shard='auto'`` found the rank (``'torch.distributed'``, an environment variable) or None.
    shard_source: str | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return int(value)


def validate_options(*, dataset_url_or_urls: Any, batched_output: bool,
                     schema_fields: Any = None, reader_pool_type: str = 'thread', workers_count: int = 10,
                     results_queue_size: int = 50, seed: int | None = None, shuffle_rows: bool = False,
                     shuffle_row_groups: bool = True, shuffle_row_drop_partitions: int = 1,
                     predicate: Any = None, rowgroup_selector: Any = None, num_epochs: int | None = 1,
                     cur_shard: int | None = None, shard_count: int | None = None, shard_seed: int | None = None,
                     cache_type: str | None = NULL_CACHE, cache_location: str | None = None,
                     cache_size_limit: int | None = None, cache_row_size_estimate: int | None = None,
                     cache_extra_settings: dict | None = None, hdfs_driver: str = 'libhdfs3',
                     transform_spec: Any = None, filters: Any = None, storage_options: dict | None = None,
                     zmq_copy_buffers: bool = True, filesystem: Any = None, convert_early_to_numpy: bool = False,
                     pyarrow_serialize: bool = False, shard_mode: str = 'row_groups',
                     shard_remainder: str = 'pad') -> ReaderOptions:
    """Check every reader argument and return them as one frozen :class:`ReaderOptions`.

    Raises:
        ValueError: an argument has a wrong type or value; the message names it and what is expected.
    """
    if isinstance(dataset_url_or_urls, (list, tuple)):
        urls: str | tuple[str, ...] = tuple(dataset_url_or_urls)
    else:
        urls = dataset_url_or_urls
    if reader_pool_type not in POOL_KINDS:
        raise ValueError(f'Unknown reader_pool_type: {reader_pool_type!r}; expected one of {", ".join(POOL_KINDS)}')
    workers_count = _check_positive_int('workers_count', workers_count)
    results_queue_size = _check_positive_int('results_queue_size', results_queue_size)
    if seed is not None and not _is_int(seed):
        raise ValueError(f'seed must be an int or None, got {seed!r}')
    if not _is_int(shuffle_row_drop_partitions) or shuffle_row_drop_partitions < 1:
        raise ValueError(f'shuffle_row_drop_partitions must be an integer >= 1, got {shuffle_row_drop_partitions!r}')
    if predicate is not None and not isinstance(predicate, PredicateBase):
        raise ValueError('predicate parameter is expected to be derived from PredicateBase')
    if num_epochs is not None and (not _is_int(num_epochs) or num_epochs < 1):
        # The opening words are the original's.
        raise ValueError(f'iterations must be positive integer or None: num_epochs is the number of passes over '
                         f'the data (an int >= 1), or None to read forever; got num_epochs={num_epochs!r}')
    if shard_mode not in SHARD_MODES:
        raise ValueError(f'shard_mode must be one of {SHARD_MODES}, got {shard_mode!r}')
    if shard_remainder not in REMAINDER_POLICIES:
        raise ValueError(f'shard_remainder must be one of {REMAINDER_POLICIES}, got {shard_remainder!r}')
    cur_shard, shard_count, shard_source = resolve_shard(cur_shard, shard_count)
    if cur_shard is not None or shard_count is not None:
        if not (_is_int(cur_shard) and _is_int(shard_count) and shard_count):
            # The opening words are the original's.
            raise ValueError('partition and num_partitions must be ints and both specified to use partitioning: '
                             'shard_count is the number of shards (an int >= 1) and cur_shard the shard this '
                             'reader reads (an int in [0, shard_count)), or leave both None to read everything; '
                             f'got cur_shard={cur_shard!r}, shard_count={shard_count!r}')
        if shard_count < 1 or not 0 <= cur_shard < shard_count:
            raise ValueError(f'cur_shard must be in [0, shard_count); got cur_shard={cur_shard}, '
                             f'shard_count={shard_count}')
    if shard_mode == 'rows' and (shard_count or 1) > 1 and seed is None and (shuffle_row_groups or shuffle_rows):
        # Each shard takes its share of one global order; unseeded shards would each draw their own order, and
        # their shares would overlap and miss rows without any error.
        raise ValueError(f"shard_mode='rows' splits one shuffled order of the rows among shard_count={shard_count} "
                         f'shards, so every shard must draw the same order: pass the same seed= to the reader of '
                         f'every shard (or shuffle_row_groups=False and shuffle_rows=False)')
    if shard_seed:
        warnings.warn('shard_seed was deprecated and will be removed in future versions. Use seed to apply '
                      'randomization effects on sharding row groups.', UserWarning, stacklevel=3)
    if pyarrow_serialize:
        warnings.warn('pyarrow_serializer was deprecated and will be removed in future versions. The argument no '
                      'longer has any effect.', DeprecationWarning, stacklevel=3)
    if zmq_copy_buffers is not True:
        warnings.warn('zmq_copy_buffers no longer has any effect: the process pool moves column buffers through '
                      'shared memory.', DeprecationWarning, stacklevel=3)
    cache_type = check_cache_arguments(cache_type, cache_location, cache_size_limit, cache_row_size_estimate,
                                       cache_extra_settings)
    if rowgroup_selector is not None:
        from petastorm.selectors import RowGroupSelectorBase

        if not isinstance(rowgroup_selector, RowGroupSelectorBase):
            raise ValueError(f'rowgroup_selector must be derived from RowGroupSelectorBase, got {rowgroup_selector!r}')
    if transform_spec is not None and not isinstance(transform_spec, TransformSpec):
        raise ValueError(f'transform_spec must be a TransformSpec, got {type(transform_spec).__name__}')
    if hdfs_driver not in ('libhdfs3', 'libhdfs'):
        raise ValueError(f"hdfs_driver must be 'libhdfs3' or 'libhdfs', got {hdfs_driver!r}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise ValueError(f'storage_options must be a dict, got {type(storage_options).__name__}')
    if filters is not None and not isinstance(filters, (Sequence,)) and not _is_expression(filters):
        raise ValueError(f'filters must be a list of (column, op, value) tuples, a list of such lists, or a '
                         f'pyarrow.compute.Expression; got {filters!r}')
    return ReaderOptions(
        dataset_url_or_urls=urls, batched_output=batched_output, schema_fields=schema_fields,
        reader_pool_type=reader_pool_type, workers_count=workers_count, results_queue_size=results_queue_size,
        seed=None if seed is None else int(seed), shuffle_rows=bool(shuffle_rows),
        shuffle_row_groups=bool(shuffle_row_groups), shuffle_row_drop_partitions=int(shuffle_row_drop_partitions),
        predicate=predicate, rowgroup_selector=rowgroup_selector, num_epochs=num_epochs, cur_shard=cur_shard,
        shard_count=shard_count, cache_type=cache_type, cache_location=cache_location,
        cache_size_limit=cache_size_limit, cache_row_size_estimate=cache_row_size_estimate,
        cache_extra_settings=cache_extra_settings, hdfs_driver=hdfs_driver, transform_spec=transform_spec,
        filters=filters, storage_options=storage_options, filesystem=filesystem,
        convert_early_to_numpy=bool(convert_early_to_numpy), shard_mode=shard_mode,
        shard_remainder=shard_remainder, shard_source=shard_source)


def _is_expression(value: Any) -> bool:
    import pyarrow.compute as pc

    return isinstance(value, pc.Expression)


PoolKind = Literal['dummy', 'thread', 'process']
