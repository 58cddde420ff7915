"""Worker functions and contexts for tests/execution/test_pools.py.

They live in their own light module because spawned worker processes import them by name.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# How many times a CountingContext was unpickled in this process (checked by the worker function).
_UNPICKLED = [0]


@dataclass(frozen=True)
class Ctx:
    """A typical frozen context."""

    offset: int = 0
    delay: float = 0.0
    fail_at: int = -1


def jittered_square(ctx: Ctx, item: int) -> int:
    """item**2 + offset, after an item-dependent pause so that completion order differs from submission order."""
    time.sleep(((item * 7919) % 5) * 0.001)
    return item * item + ctx.offset


def expected_square(ctx: Ctx, item: int) -> int:
    """What jittered_square returns, without the pause."""
    return item * item + ctx.offset


def slow_identity(ctx: Ctx, item: Any) -> Any:
    """Return the item after ctx.delay seconds."""
    time.sleep(ctx.delay)
    return item


def fail_on_item(ctx: Ctx, item: int) -> int:
    """Raise ValueError for item ctx.fail_at."""
    if item == ctx.fail_at:
        raise ValueError(f'item {item} is bad')
    time.sleep(0.002)
    return item


class UnpicklableError(Exception):
    """An exception whose constructor signature breaks unpickling."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f'code {code}: {detail}')


def raise_unpicklable(ctx: Ctx, item: int) -> int:
    """Always raise UnpicklableError."""
    raise UnpicklableError(item, 'cannot be rebuilt')


def mixed_columns(ctx: Ctx, item: int) -> dict[str, Any]:
    """A dict result mixing big and small plain arrays, object arrays, strings, None and scalars."""
    rng = np.random.default_rng(item)
    structured = np.zeros(3, dtype=[('a', '<i4'), ('b', '<f8', (2,))])
    structured['a'] = [item, 2, 3]
    return {
        'image': rng.integers(0, 256, size=(8, 128, 256, 3), dtype=np.uint8),
        'matrix': rng.standard_normal((300, 200)),
        'strided': np.arange(200_000, dtype=np.int64)[::2],
        'fortran': np.asfortranarray(rng.standard_normal((100, 70)).astype(np.float32)),
        'big_endian': np.arange(50_000, dtype='>i4'),
        'small': np.array([item], dtype=np.int64),
        'empty': np.zeros((0, 3), dtype=np.float32),
        'strings': np.array(['a', 'bc' * item], dtype='<U20'),
        'objects': np.array([b'x', None, {'k': item}], dtype=object),
        'structured': structured,
        'none': None,
        'scalar': item * 1.5,
    }


def unpicklable_result(ctx: Ctx, item: int) -> dict[str, Any]:
    """A dict result with a big array (so it goes through shared memory) and a value pickle refuses."""
    return {'big': np.zeros(100_000), 'fn': lambda: item}


def result_only_the_worker_can_load(ctx: Ctx, item: int) -> dict[str, Any]:
    """A result holding an instance of a class that exists only in the worker process."""
    module = types.ModuleType('petastorm_test_worker_only')
    exec('class Thing:\n    pass\n', module.__dict__)
    sys.modules[module.__name__] = module
    return {'big': np.zeros(100_000), 'thing': module.Thing()}


def non_dict_result(ctx: Ctx, item: int) -> Any:
    """Results that are not dicts: alternately a tuple, a big lone array, a string and None."""
    kind = item % 4
    if kind == 0:
        return (item, 'x', [1, 2])
    if kind == 1:
        return np.full((200, 1000), item, dtype=np.float64)
    if kind == 2:
        return f'item-{item}'
    return None


def big_uint8(ctx: Ctx, item: int) -> dict[str, np.ndarray]:
    """A result of about 600 kB."""
    time.sleep(ctx.delay)
    return {'data': np.full((600, 1000), item % 256, dtype=np.uint8)}


def varying_uint8(ctx: Ctx, item: int) -> dict[str, np.ndarray]:
    """Results of 100 kB to 2.5 MB (so that slots of several sizes are created and reused) filled with the item."""
    rows = 100 + (item * 37) % 2400
    return {'data': np.full((rows, 1000), item % 256, dtype=np.uint8), 'item': np.array(item)}


def worker_pid(ctx: Ctx, item: int) -> int:
    """The pid of the process running the function."""
    time.sleep(ctx.delay)
    return os.getpid()


class CountingContext:
    """A context that counts how often it is unpickled in each process."""

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        _UNPICKLED[0] += 1


def unpickle_count(ctx: CountingContext, item: int) -> tuple[int, int]:
    """(pid, number of context unpicklings in this process)."""
    time.sleep(0.002)
    return os.getpid(), _UNPICKLED[0]


def png_decoder(ctx: Ctx, item: int) -> str:
    """The library the automatic image backend choice picks for PNG in the process running the function."""
    from petastorm.codecs._image_backends import image_backends

    return image_backends().describe()['png decode']


def raise_timeout(ctx: Ctx, item: int) -> int:
    """Raise the builtin TimeoutError (what a storage read that timed out raises) for item ctx.fail_at."""
    if item == ctx.fail_at:
        raise TimeoutError(f'reading item {item} timed out')
    return item


@dataclass(frozen=True)
class Columns:
    """A frozen result type that implements petastorm.pools.base.ArrayCarrier: named columns plus small fields."""

    columns: Mapping[str, np.ndarray]
    item: int
    note: str = ''

    def carried_arrays(self) -> Mapping[str, np.ndarray]:
        """The columns."""
        return self.columns

    def with_carried_arrays(self, arrays: Mapping[str, np.ndarray]) -> Columns:
        """A copy holding ``arrays`` as its columns."""
        return dataclasses.replace(self, columns=dict(arrays))


def columns_result(ctx: Ctx, item: int) -> Columns:
    """Big plain columns (shared memory material) between small, empty and object columns."""
    rng = np.random.default_rng(item)
    return Columns({
        'small': np.array([item], dtype=np.int64),
        'image': rng.integers(0, 256, size=(4, 64, 128, 3), dtype=np.uint8),
        'objects': np.array([b'x', None, item], dtype=object),
        'matrix': rng.standard_normal((200, 100)),
        'empty': np.zeros((0, 2)),
    }, item, f'item {item}')


def small_columns_result(ctx: Ctx, item: int) -> Columns:
    """A carrier too small to be worth shared memory (it is pickled whole)."""
    return Columns({'ids': np.arange(item, item + 10), 'names': np.array(['a', 'b'] * item, dtype=object)}, item)


def big_columns(ctx: Ctx, item: int) -> Columns:
    """A carrier of about 600 kB (what big_uint8 returns as a dict)."""
    time.sleep(ctx.delay)
    return Columns({'data': np.full((600, 1000), item % 256, dtype=np.uint8)}, item)


class CarrierThatCannotRebuild(Columns):
    """A carrier whose with_carried_arrays fails (the process pool calls it in the worker and in the parent)."""

    def with_carried_arrays(self, arrays: Mapping[str, np.ndarray]) -> Columns:
        """Always fails."""
        raise ValueError('this carrier cannot be rebuilt')


def carrier_that_cannot_rebuild(ctx: Ctx, item: int) -> Columns:
    """A big carrier whose with_carried_arrays raises."""
    return CarrierThatCannotRebuild({'big': np.zeros(100_000), 'objects': np.array([None], dtype=object)}, item)
