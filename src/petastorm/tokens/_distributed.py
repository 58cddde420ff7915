"""What a token loader asks of ``torch.distributed`` or JAX: the same number of steps on every rank, every rank's
position.

Each rank packs its own share of documents, and shares of equal documents hold unequal tokens, so ranks would
run out at different steps (a rank with one batch more waits forever in the gradient all-reduce). A step agreement
makes them agree, every step, whether all of them have a batch (:func:`agreed`): :class:`StepAgreement`, an
all-reduce of one integer (``MIN``) over a gloo group, a few tens of microseconds per step beside the training
step; :class:`JaxStepAgreement`, for the processes of a JAX run, gathers one integer of every process
(``multihost_utils.process_allgather``). The first step some rank cannot fill ends the pass on every rank; the rows
the others still held are left out of that pass.

:func:`every_rank` gathers every rank's position into the one a rank-0 checkpoint keeps (as the torch loaders of
:mod:`petastorm.pytorch` do), so that any rank, or a run on another number of ranks, continues from it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

__all__ = ['Agreement', 'JaxStepAgreement', 'StepAgreement', 'agreed', 'distributed_world', 'every_rank', 'jax_world']


class Agreement(Protocol):
    """What every rank asks at each step."""

    def all_have(self, mine: bool) -> bool:
        """True when every rank has a batch for this step (``mine``: this rank has)."""
        ...


def agreed(batches: Iterator[Any], agreement: Agreement, end_pass: Callable[[], None]) -> Iterator[Any]:
    """The batches while every rank has one; at the first step another rank has none, ``end_pass()`` and stop."""
    for batch in batches:
        if not agreement.all_have(True):
            end_pass()  # another rank has no batch for this step: every rank ends the pass here
            return
        yield batch
    agreement.all_have(False)


def distributed_world() -> int | None:
    """The world size of an initialized ``torch.distributed`` run (None when there is none)."""
    torch = sys.modules.get('torch')
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return int(dist.get_world_size())


class StepAgreement:
    """Every rank learns, each step, whether every rank has a batch (see the module's documentation).

    Made on every rank at once (it may create a process group, a collective call).
    """

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        # Collectives on CPU tensors need gloo; a NCCL run gets a gloo group of its own for this.
        self._group = None if dist.get_backend() == 'gloo' else dist.new_group(backend='gloo')

    def all_have(self, mine: bool) -> bool:
        """True when every rank has a batch for this step (``mine``: this rank has)."""
        import torch

        flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
        self._dist.all_reduce(flag, op=self._dist.ReduceOp.MIN, group=self._group)
        return bool(flag.item())


def jax_world() -> int | None:
    """The processes of a JAX run after ``jax.distributed.initialize()`` (None before, or without JAX imported)."""
    jax: Any = sys.modules.get('jax')
    initialized = getattr(getattr(jax, 'distributed', None), 'is_initialized', None)
    if jax is None or not callable(initialized) or not initialized():
        return None
    return int(jax.process_count())


class JaxStepAgreement:
    """Every JAX process learns, each step, whether every process has a batch (see the module's documentation)."""

    def all_have(self, mine: bool) -> bool:
        """True when every process has a batch for this step (``mine``: this process has)."""
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array([1 if mine else 0], dtype=np.int32))
        return bool(np.min(flags))


def every_rank(state: dict[str, Any], format_name: str, version: int) -> dict[str, Any]:
    """``{'format', 'version', 'ranks': [every rank's position]}`` gathered with ``all_gather_object``."""
    import torch.distributed as dist

    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return {'format': format_name, 'version': version, 'ranks': sorted(states, key=lambda one: int(one['shard']))}
