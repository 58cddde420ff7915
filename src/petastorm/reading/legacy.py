"""Petastorm's direct construction ``Reader(filesystem, dataset_path, ..., reader_pool=ThreadPool(10))``.

Petastorm 0.5 and later recommend ``make_reader`` / ``make_batch_reader``; code from before still builds a
:class:`~petastorm.reader.Reader` itself with a filesystem, a path and a pool object. :func:`legacy_reader_options`
turns those arguments into the :class:`~petastorm.reading.options.ReaderOptions` the factories make: the pool object
(from :mod:`petastorm.workers_pool`) gives ``reader_pool_type`` and ``workers_count``, the filesystem and the path
give the URL.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from petastorm.reading.options import ReaderOptions, validate_options

__all__ = ['legacy_reader_options', 'reader_options']

# Petastorm's default pool: ThreadPool(10).
_DEFAULT_POOL = ('thread', 10, 50)
_ROW_WORKER, _BATCH_WORKER = 'PyDictReaderWorker', 'ArrowReaderWorker'


def reader_options(options: Any, *legacy_args: Any, **legacy_kwargs: Any) -> ReaderOptions:
    """The options of ``Reader(...)``: those the factories checked, or Petastorm's arguments turned into them.

    Raises:
        TypeError: checked options and other arguments too.
    """
    if not isinstance(options, ReaderOptions):  # Petastorm's Reader(pyarrow_filesystem, dataset_path, ...)
        return legacy_reader_options(options, *legacy_args, **legacy_kwargs)
    if legacy_args or legacy_kwargs:
        raise TypeError(f'Reader(options) takes no other arguments, got {len(legacy_args)} more positional '
                        f'and {sorted(legacy_kwargs)}')
    return options


def legacy_reader_options(pyarrow_filesystem: Any, dataset_path: Any, schema_fields: Any = None,
                          seed: int | None = None, shuffle_rows: bool = False, shuffle_row_groups: bool = True,
                          shuffle_row_drop_partitions: int = 1, predicate: Any = None, rowgroup_selector: Any = None,
                          reader_pool: Any = None, num_epochs: int | None = 1, cur_shard: int | None = None,
                          shard_count: int | None = None, cache: Any = None, worker_class: Any = None,
                          transform_spec: Any = None, is_batched_reader: bool = False, filters: Any = None,
                          shard_seed: int | None = None, convert_early_to_numpy: bool = False) -> ReaderOptions:
    """The reader options of Petastorm's ``Reader(...)`` arguments (its signature, its defaults).

    Args:
        pyarrow_filesystem: a ``pyarrow.fs`` or fsspec filesystem, or None to resolve ``dataset_path`` (a URL).
        dataset_path: the dataset's path on that filesystem or its URL (or a list of file paths or URLs).
        reader_pool: a pool of :mod:`petastorm.workers_pool` (``ThreadPool(n)``, ``ProcessPool(n)``,
            ``DummyPool()``); None is Petastorm's ``ThreadPool(10)``.
        cache: None or a ``NullCache``; use ``make_reader(cache_type='local-disk', ...)`` for a disk cache.
        worker_class: None, or Petastorm's ``PyDictReaderWorker`` (rows) / ``ArrowReaderWorker`` (batches).
        is_batched_reader: yield batches (as ``make_batch_reader``) instead of rows.
        schema_fields: as for :func:`petastorm.reader.make_reader`, as are the arguments below.
        seed: see above.
        shuffle_rows: see above.
        shuffle_row_groups: see above.
        shuffle_row_drop_partitions: see above.
        predicate: see above.
        rowgroup_selector: see above.
        num_epochs: see above.
        cur_shard: see above.
        shard_count: see above.
        transform_spec: see above.
        filters: see above.
        shard_seed: see above.
        convert_early_to_numpy: see above.

    Raises:
        ValueError: a pool, cache or worker class this construction cannot take (the message names the
            ``make_reader`` arguments to use).
    """
    kind, workers_count, results_queue_size = _pool_settings(reader_pool)
    batched = _batched(worker_class, is_batched_reader)
    if cache is not None and type(cache).__name__ != 'NullCache':
        raise ValueError(f'Reader(cache={type(cache).__name__}(...)) is not supported: pass cache_type=\'local-disk\', '
                         f'cache_location=..., cache_size_limit=..., cache_row_size_estimate=... to make_reader or '
                         f'make_batch_reader instead')
    urls = [_url_of(p, pyarrow_filesystem) for p in dataset_path] if isinstance(dataset_path, (list, tuple)) else \
        _url_of(dataset_path, pyarrow_filesystem)
    return validate_options(
        dataset_url_or_urls=urls, batched_output=batched, schema_fields=schema_fields, reader_pool_type=kind,
        workers_count=workers_count, results_queue_size=results_queue_size, seed=seed, shuffle_rows=shuffle_rows,
        shuffle_row_groups=shuffle_row_groups, shuffle_row_drop_partitions=shuffle_row_drop_partitions,
        predicate=predicate, rowgroup_selector=rowgroup_selector, num_epochs=num_epochs, cur_shard=cur_shard,
        shard_count=shard_count, shard_seed=shard_seed, transform_spec=transform_spec, filters=filters,
        filesystem=pyarrow_filesystem, convert_early_to_numpy=convert_early_to_numpy)


def _pool_settings(reader_pool: Any) -> tuple[str, int, int]:
    """``(reader_pool_type, workers_count, results_queue_size)`` a legacy pool object stands for."""
    if reader_pool is None:
        return _DEFAULT_POOL
    from petastorm.workers_pool._protocol import LegacyPool

    if not isinstance(reader_pool, LegacyPool):
        raise ValueError(f'reader_pool must be a pool of petastorm.workers_pool (ThreadPool(n), ProcessPool(n), '
                         f'DummyPool()), got {type(reader_pool).__name__}; make_reader(reader_pool_type=..., '
                         f'workers_count=...) chooses the pool by name')
    queue_size = getattr(reader_pool, '_results_queue_size', _DEFAULT_POOL[2])
    return type(reader_pool).kind, reader_pool.workers_count, queue_size  # type: ignore[attr-defined]


def _batched(worker_class: Any, is_batched_reader: bool) -> bool:
    name = getattr(worker_class, '__name__', None) if worker_class is not None else None
    if name not in (None, _ROW_WORKER, _BATCH_WORKER):
        raise ValueError(f'worker_class={name or worker_class!r} is not supported: readers run petastorm\'s own '
                         f'reading code; pass is_batched_reader=True for batches, or a TransformSpec to change rows')
    return bool(is_batched_reader) or name == _BATCH_WORKER


def _url_of(path: Any, filesystem: Any) -> Any:
    """A URL for a path on ``filesystem`` (a path with a scheme is one already)."""
    if not isinstance(path, str) or urlparse(path).scheme:
        return path  # a URL, or something validation names in its error
    scheme = _scheme_of(filesystem)
    if scheme == 'file':
        return 'file://' + os.path.abspath(path)
    return f'{scheme}://{path}' if path.startswith('/') or scheme not in ('hdfs', 'viewfs') else f'{scheme}:///{path}'


def _scheme_of(filesystem: Any) -> str:
    if filesystem is None:
        return 'file'  # Petastorm resolved a bare path as local
    type_name = getattr(filesystem, 'type_name', None)  # pyarrow.fs: 'local', 's3', 'gcs', 'hdfs', 'py::...'
    if type_name == 'local':
        return 'file'
    if isinstance(type_name, str) and '::' not in type_name:
        return type_name
    protocol = getattr(filesystem, 'protocol', None)  # fsspec
    if isinstance(protocol, (tuple, list)):
        protocol = protocol[0]
    if isinstance(protocol, str):
        return 'file' if protocol in ('file', 'local') else protocol
    return 'file'
