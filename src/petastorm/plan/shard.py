"""Which shard a reader is: :class:`ShardSpec`, and where ``cur_shard='auto'`` finds the rank.

A shard spec is a plain value. :meth:`ShardSpec.from_env` is the one place planning looks at the process it runs
in (``torch.distributed``, when some other code initialized it, or the launcher's environment variables); a
reader calls it once, while its options are checked, and hands the value down.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from petastorm.plan.runs import Remainder

__all__ = [
    'AUTO', 'RANK_ENVIRONMENT', 'SHARD_MODES', 'ShardMode', 'ShardSpec', 'detect_rank_and_world_size', 'resolve_shard',
]

AUTO = 'auto'
#: How shards split the data: whole row groups (Petastorm's rule) or equal shares of every epoch's rows.
ShardMode = Literal['row_groups', 'rows']
SHARD_MODES: tuple[str, ...] = ('row_groups', 'rows')

#: (rank variable, world size variable) of the launchers we know, most specific first.
RANK_ENVIRONMENT = (
    ('RANK', 'WORLD_SIZE'),  # torchrun, torch.distributed.launch
    ('HOROVOD_RANK', 'HOROVOD_SIZE'),  # horovodrun
    ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),  # Open MPI
    ('PMI_RANK', 'PMI_SIZE'),  # MPICH, Intel MPI
    ('SLURM_PROCID', 'SLURM_NTASKS'),  # srun
)


def detect_rank_and_world_size(environ: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """This process's rank and the world size, and where they were found.

    ``torch.distributed`` wins when it is imported and initialized (torch is never imported here for this), then
    JAX's multi-process runtime when ``jax.distributed.initialize()`` was called (``jax.process_index()`` of
    ``jax.process_count()``); otherwise the first pair of :data:`RANK_ENVIRONMENT` variables that is set.

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        ``(rank, world_size, source)``; source is ``'torch.distributed'``, ``'jax'`` or the rank variable's name.

    Raises:
        ValueError: nothing was found, or the values are not integers with ``0 <= rank < world_size``.
    """
    # Looked up, never imported: a process that did not import torch cannot have initialized it.
    distributed = sys.modules.get('torch.distributed')
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank()), int(distributed.get_world_size()), 'torch.distributed'
    jax: Any = sys.modules.get('jax')
    initialized = getattr(getattr(jax, 'distributed', None), 'is_initialized', None)
    if jax is not None and callable(initialized) and initialized():
        return int(jax.process_index()), int(jax.process_count()), 'jax'
    environ = os.environ if environ is None else environ
    for rank_name, size_name in RANK_ENVIRONMENT:
        if rank_name in environ and size_name in environ:
            try:
                rank, size = int(environ[rank_name]), int(environ[size_name])
            except ValueError as err:
                raise ValueError(f'{rank_name}={environ[rank_name]!r} and {size_name}={environ[size_name]!r} must '
                                 f'be integers') from err
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f'{rank_name}={rank} and {size_name}={size} do not name a rank of the world: '
                                 f'expected 0 <= {rank_name} < {size_name}')
            return rank, size, rank_name
    names = ', '.join(f'{r}/{s}' for r, s in RANK_ENVIRONMENT)
    raise ValueError(f"cur_shard='auto' needs torch.distributed initialized (init_process_group) or one of the "
                     f'environment variable pairs {names}; none was found. Pass cur_shard and shard_count '
                     f'explicitly instead.')


@dataclass(frozen=True)
class ShardSpec:
    """This reader's shard and how the data is split between shards.

    Attributes:
        shard: this shard, ``0 <= shard < count``.
        count: number of shards (1: no sharding).
        mode: ``'row_groups'`` or ``'rows'`` (see :mod:`petastorm.plan`).
        remainder: with ``'rows'``, what happens to the rows that do not split evenly.
        source: where the rank was found for ``cur_shard='auto'`` (None when given explicitly).
    """

    shard: int = 0
    count: int = 1
    mode: ShardMode = 'row_groups'
    remainder: Remainder = 'pad'
    source: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **settings: Any) -> ShardSpec:
        """The shard of this process, found as :func:`detect_rank_and_world_size` says.

        Args:
            environ: the environment to read (default ``os.environ``).
            **settings: ``mode`` and ``remainder``.
        """
        rank, size, source = detect_rank_and_world_size(environ)
        return cls(rank, size, source=source, **settings)

    @property
    def sharded(self) -> bool:
        """True when the data is split between more than one shard."""
        return self.count > 1

    @property
    def row_group_shard(self) -> tuple[int | None, int | None]:
        """``(cur_shard, shard_count)`` for splitting row groups: ``(None, None)`` when rows are split instead."""
        if self.mode == 'rows' or not self.sharded:
            return None, None
        return self.shard, self.count


def resolve_shard(cur_shard: Any, shard_count: Any,
                  environ: Mapping[str, str] | None = None) -> tuple[Any, Any, str | None]:
    """Replace ``'auto'`` in ``cur_shard``/``shard_count`` with the detected rank/world size.

    Returns:
        ``(cur_shard, shard_count, source)``; source is None when nothing was detected.

    Raises:
        ValueError: nothing to detect from, or an explicit ``shard_count`` that disagrees with the world size.
    """
    if cur_shard != AUTO and shard_count != AUTO:
        return cur_shard, shard_count, None
    found = ShardSpec.from_env(environ)
    if cur_shard == AUTO:
        if shard_count not in (None, AUTO) and shard_count != found.count:
            raise ValueError(f"cur_shard='auto' found world size {found.count} (from {found.source}) but "
                             f'shard_count={shard_count!r}; pass shard_count=\'auto\' or None')
        return found.shard, found.count, found.source
    return cur_shard, found.count, found.source
