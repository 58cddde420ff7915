"""A converter's cached files as a PyTorch ``DataLoader`` or a TensorFlow ``tf.data.Dataset``.

Both open a ``make_batch_reader`` over the converter's files (``num_epochs=None`` reads forever, as in
Petastorm; ``workers_count=None`` means 4 workers), hold an in-use marker in the cache directory while open, and
stop and join the reader when the ``with`` block ends. torch and tensorflow are imported only when asked for.

In a distributed job (TorchDistributor, torchrun, Horovod) each process passes ``cur_shard='auto'`` (and
``shard_mode='rows'`` for equal shares); a process that has a rank but reads every row gets a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._optional import import_optional
from petastorm.plan import AUTO, detect_rank_and_world_size
from petastorm.spark import cache_dir, in_use
from petastorm.unischema import arrow_type_of_field

__all__ = [
    'DEFAULT_TF_BATCH_SIZE', 'DEFAULT_WORKERS_COUNT', 'check_rank_and_size_consistent_with_horovod',
    'horovod_rank_and_size', 'open_reader', 'shared_order_kwargs', 'tf_dataset', 'torch_dataloader',
    'warn_if_every_rank_reads_everything',
]

logger = logging.getLogger(__name__)

DEFAULT_WORKERS_COUNT = 4
DEFAULT_TF_BATCH_SIZE = 32

#: The variables through which MPI launchers (Horovod, Open MPI, MPICH) tell a process its rank: the converter
#: checks only these pairs of :data:`petastorm.plan.RANK_ENVIRONMENT`, as Petastorm did (torchrun's RANK
#: and SLURM's are left to ``cur_shard='auto'``).
_RANK_SIZE_VARIABLES = (('HOROVOD_RANK', 'HOROVOD_SIZE'), ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
                        ('PMI_RANK', 'PMI_SIZE'))


def horovod_rank_and_size() -> tuple[int | None, int | None]:
    """``(rank, size)`` from the first launcher whose variables are both set, else ``(None, None)``."""
    for rank_variable, size_variable in _RANK_SIZE_VARIABLES:
        rank, size = os.environ.get(rank_variable), os.environ.get(size_variable)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return None, None


def check_rank_and_size_consistent_with_horovod(reader_kwargs: dict) -> bool:
    """Warn (and return False) when ``cur_shard``/``shard_count`` differ from the launcher's rank and size.

    Every training process of a distributed job should read its own shard; a mismatch usually means that all of
    them read the same data.
    """
    rank, size = horovod_rank_and_size()
    if rank is None:
        return True
    shard, count = reader_kwargs.get('cur_shard'), reader_kwargs.get('shard_count')
    if shard == AUTO:
        return True  # the reader takes the rank from the launcher itself
    if shard != rank or count != size:
        logger.warning('this process has rank %d of %d in a distributed launch, but the reader gets cur_shard=%r, '
                       'shard_count=%r: pass cur_shard=%d, shard_count=%d so that each process reads its own shard',
                       rank, size, shard, count, rank, size)
        return False
    return True


def warn_if_every_rank_reads_everything(reader_kwargs: dict) -> None:
    """Warn when a process of a torchrun-style job (TorchDistributor sets ``RANK``/``WORLD_SIZE``) reads unsharded."""
    if reader_kwargs.get('cur_shard') is not None or reader_kwargs.get('shard_count') is not None:
        return
    if horovod_rank_and_size()[0] is not None:
        return  # check_rank_and_size_consistent_with_horovod has warned already
    try:
        rank, size, source = detect_rank_and_world_size()
    except ValueError:
        return  # not a distributed job, or one we cannot read: nothing to say
    if size > 1:
        logger.warning("this process has rank %d of %d (from %s) but the loader reads every row of the converter: "
                       "pass cur_shard='auto' (with shard_mode='rows' for equal shares) so that each process reads "
                       'its own share', rank, size, source)


def shared_order_kwargs(converter: Any, reader_kwargs: dict) -> dict:
    """The reader arguments, with a seed every rank agrees on when ``shard_mode='rows'`` was asked without one.

    Row shares split one global order that every rank computes by itself, so the order must not depend on the
    process: an unseeded shuffle would give each rank a different order and overlapping shares. The seed comes
    from the cache directory's name, which is the same in every process holding this converter and new for every
    conversion.
    """
    if reader_kwargs.get('shard_mode') != 'rows' or reader_kwargs.get('seed') is not None:
        return reader_kwargs
    digest = hashlib.sha256(converter.cache_dir_url.encode('utf-8')).digest()
    return dict(reader_kwargs, seed=int.from_bytes(digest[:8], 'little') >> 1)


@contextlib.contextmanager
def open_reader(converter: Any, num_epochs: int | None, workers_count: int | None, reader_kwargs: dict,
                wait_timeout_secs: float) -> Iterator[Any]:
    """A ``make_batch_reader`` over the converter's files, marked in use, stopped and joined on exit."""
    from petastorm.reader import make_batch_reader

    check_rank_and_size_consistent_with_horovod(reader_kwargs)
    warn_if_every_rank_reads_everything(reader_kwargs)
    cache_dir.wait_files_available(converter.file_urls, wait_timeout_secs)
    kwargs = dict(shared_order_kwargs(converter, reader_kwargs), num_epochs=num_epochs,
                  workers_count=DEFAULT_WORKERS_COUNT if workers_count is None else workers_count)
    # Only copies made by make_spark_converter are deleted at exit; a caller's own dataset gets no marker files.
    marker = in_use.reading(converter.cache_dir_url) if converter.is_cached_copy else contextlib.nullcontext()
    with marker:
        reader = make_batch_reader(list(converter.file_urls), **kwargs)
        try:
            yield reader
        finally:
            reader.stop()
            reader.join()


def _has_non_tensor_fields(reader: Any) -> bool:
    """Whether some column holds strings, bytes or Decimals, which only the row-collating loader handles.

    Leaves of structs, maps and lists count too.
    """
    for field in reader.schema.fields.values():
        if field.numpy_dtype is dict:
            if _has_text_leaf(arrow_type_of_field(field)):
                return True
            continue
        try:
            kind = np.dtype(field.numpy_dtype).kind
        except TypeError:
            return True
        if kind in 'OSUV':
            return True
    return False


def _has_text_leaf(arrow_type: pa.DataType) -> bool:
    if pa.types.is_struct(arrow_type):
        return any(_has_text_leaf(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if pa.types.is_map(arrow_type):
        return _has_text_leaf(arrow_type.key_type) or _has_text_leaf(arrow_type.item_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return _has_text_leaf(arrow_type.value_type)
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_binary(arrow_type)
            or pa.types.is_large_binary(arrow_type) or pa.types.is_decimal(arrow_type))


@contextlib.contextmanager
def torch_dataloader(converter: Any, batch_size: int, num_epochs: int | None, workers_count: int | None,
                     shuffling_queue_capacity: int, data_loader_fn: Callable | None, reader_kwargs: dict,
                     wait_timeout_secs: float) -> Iterator[Any]:
    """See :meth:`petastorm.spark.SparkDatasetConverter.make_torch_dataloader`."""
    import_optional('torch', 'SparkDatasetConverter.make_torch_dataloader')
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    # Arguments of the loader, not of the reader: every loader takes them.
    loader_kwargs = {name: reader_kwargs.pop(name) for name in _LOADER_ARGUMENTS if name in reader_kwargs}
    with open_reader(converter, num_epochs, workers_count, reader_kwargs, wait_timeout_secs) as reader:
        if data_loader_fn is None:
            data_loader_fn = BatchedDataLoader
            if _has_non_tensor_fields(reader):
                logger.info('the DataFrame has string or decimal columns: using petastorm.pytorch.DataLoader, '
                            'which collates them as lists, instead of the faster BatchedDataLoader')
                data_loader_fn = DataLoader
        yield data_loader_fn(reader=reader, batch_size=batch_size, shuffling_queue_capacity=shuffling_queue_capacity,
                             **loader_kwargs)


_LOADER_ARGUMENTS = ('drop_last', 'bool_dtype')


@contextlib.contextmanager
def tf_dataset(converter: Any, batch_size: int | None, prefetch: int | None, num_epochs: int | None,
               workers_count: int | None, shuffling_queue_capacity: int | None, reader_kwargs: dict,
               wait_timeout_secs: float) -> Iterator[Any]:
    """See :meth:`petastorm.spark.SparkDatasetConverter.make_tf_dataset`."""
    tf = import_optional('tensorflow', 'SparkDatasetConverter.make_tf_dataset')
    from petastorm.tf_utils import make_petastorm_dataset

    with open_reader(converter, num_epochs, workers_count, reader_kwargs, wait_timeout_secs) as reader:
        # A tf.compat.v1.data dataset; unbatch/shuffle/batch/prefetch keep its TF1 methods (make_one_shot_iterator).
        dataset = make_petastorm_dataset(reader).unbatch()
        if shuffling_queue_capacity:
            dataset = dataset.shuffle(shuffling_queue_capacity)
        dataset = dataset.batch(DEFAULT_TF_BATCH_SIZE if batch_size is None else batch_size)
        yield dataset.prefetch(tf.data.AUTOTUNE if prefetch is None else prefetch)
