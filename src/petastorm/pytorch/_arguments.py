"""torch's ``DataLoader`` arguments that our loaders do not take, and what to use instead.

Our loaders are ``torch.utils.data.DataLoader`` instances, so torch's arguments are what users try first. The
reader does the parallel reading, choosing and shuffling, so most of them have an equivalent elsewhere; given
with a value other than torch's default, each raises :class:`LoaderArgumentError` naming it. torch's defaults
are accepted and change nothing (code, and trainers that re-create a loader from its attributes, may pass them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from petastorm.errors import PetastormError

__all__ = ['LoaderArgumentError', 'check_callable', 'check_torch_arguments']


class LoaderArgumentError(PetastormError, TypeError):
    """An argument of ``torch.utils.data.DataLoader`` that a petastorm loader does not take (a ``TypeError``)."""


_SHUFFLE = ("shuffle the reader's order (make_reader(..., shuffle_row_groups=True, shuffle_rows=True, seed=...)) "
            'and give the loader shuffling_queue_capacity=N, a buffer of N rows drawn at random')
_CHOOSE = ("choose rows with the reader (predicate=, filters=, cur_shard=/shard_count=; for DDP "
           "cur_shard='auto' with shard_mode='rows', see docs/distributed.md) and order them by shuffling: "
           + _SHUFFLE)

# argument: (torch's default, what to use instead)
_TORCH_ONLY: dict[str, tuple[Any, str]] = {
    'num_workers': (0, "the reader reads in parallel: make_reader(url, reader_pool_type='thread' or 'process', "
                       'workers_count=N); the loader runs in the calling process'),
    'shuffle': (False, _SHUFFLE),
    'sampler': (None, _CHOOSE),
    'batch_sampler': (None, _CHOOSE),
    'prefetch_factor': (None, "the reader reads ahead on its own: results_queue_size= of make_reader bounds it"),
    'persistent_workers': (False, "the reader's workers live as long as the reader: iterate the loader again for "
                                  'the next pass'),
    'worker_init_fn': (None, "the reader's workers run petastorm's reading code; change rows with "
                             'make_reader(..., transform_spec=TransformSpec(func))'),
    'multiprocessing_context': (None, "reader_pool_type='process' starts its workers as fresh interpreters"),
    'generator': (None, "seed the reader (make_reader(..., seed=...)); the loader's shuffling follows that seed"),
    'timeout': (0, 'no equivalent: a worker error reaches the loader with its traceback'),
    'pin_memory_device': ('', 'pin_memory=True pins batches for the accelerator that is available'),
    'in_order': (True, "batches come in the reader's order (seeded, the same for every pool kind)"),
    'dataset': (None, 'a petastorm loader reads a reader: pass make_reader(...) or make_batch_reader(...) as its '
                      'first argument'),
}
_COLLATE = ('it makes tensors of whole columns; pass transform_fn= (a column to a tensor), or use '
            'petastorm.pytorch.DataLoader, which takes a collate_fn')
# Arguments of torch's DataLoader that some of our loaders take and others do not.
_BY_LOADER: dict[str, dict[str, tuple[Any, str]]] = {
    'BatchedDataLoader': {'collate_fn': (None, _COLLATE)},
    'InMemBatchedDataLoader': {
        'collate_fn': (None, _COLLATE),
        'pin_memory': (False, 'use BatchedDataLoader(..., pin_memory=True), or pin the batches yourself'),
        'shuffling_queue_capacity': (0, 'it keeps the whole dataset in memory: shuffle=True draws a new order '
                                        'of all rows every epoch'),
    },
}


def check_torch_arguments(loader: str, arguments: Mapping[str, Any]) -> None:
    """Refuse keyword arguments ``loader`` does not take, naming what to use instead.

    Args:
        loader: the loader's class name, for the message.
        arguments: the keyword arguments beyond the loader's own.

    Raises:
        LoaderArgumentError: an argument of torch's DataLoader with a value other than torch's default (the
            message names our equivalent), or an argument torch does not have either.
    """
    table = {**_TORCH_ONLY, **_BY_LOADER.get(loader, {})}
    for name, value in arguments.items():
        entry = table.get(name)
        if entry is None:
            raise LoaderArgumentError(f'{loader}() got an unexpected keyword argument {name!r}')
        default, instead = entry
        if _is_default(value, default, name):
            continue
        raise LoaderArgumentError(f'{loader}() does not take torch\'s {name}={value!r}: {instead}')


def _is_default(value: Any, default: Any, name: str = '') -> bool:
    if _made_by_torch(name, value):
        return True
    if default is None or isinstance(default, bool):
        return value is default or (isinstance(default, bool) and value is None and not default)
    if isinstance(default, (int, float)):  # 0 or 0.0 alike, but not False
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == default
    return type(value) is type(default) and value == default


def _made_by_torch(name: str, value: Any) -> bool:
    """What torch's ``DataLoader`` stores for a loader given torch's defaults: trainers that re-create a loader
    from its attributes pass these back (its collate function, and the samplers of an iterable dataset)."""
    import torch.utils.data
    from torch.utils.data.dataloader import _InfiniteConstantSampler

    if name == 'collate_fn':
        return value is torch.utils.data.default_collate
    if name == 'sampler':
        return isinstance(value, _InfiniteConstantSampler)
    if name == 'batch_sampler':
        return isinstance(value, torch.utils.data.BatchSampler) and isinstance(value.sampler,
                                                                               _InfiniteConstantSampler)
    return False


def check_callable(loader: str, name: str, value: Any, optional: bool) -> Callable | None:
    """``value`` when it is callable (or None, when ``optional``).

    torch's third positional argument is ``shuffle``; ours is a function, so ``Loader(reader, 64, True)`` is
    caught here instead of failing at the first batch.

    Raises:
        LoaderArgumentError: ``value`` is not callable.
    """
    if value is None and optional:
        return None
    if not callable(value):
        third = name in ('collate_fn', 'transform_fn')  # our third positional argument
        raise LoaderArgumentError(f'{loader}: {name} must be a function, got {value!r}' + (
            f" (torch's third positional argument is shuffle, ours is {name}: to shuffle, pass "
            f'shuffling_queue_capacity=N and shuffle the reader)' if third else ''))
    return value
