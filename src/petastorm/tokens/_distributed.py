"""What a token loader asks of ``torch.distributed``: the same number of steps on every rank, every rank's position.

Each rank packs its own share of documents, and shares of equal documents hold unequal tokens, so ranks would
run out at different steps (a rank with one batch more waits forever in the gradient all-reduce). A
:class:`StepAgreement` makes them agree, every step, whether all of them have a batch: an all-reduce of one
integer (``MIN``) over a gloo group, a few tens of microseconds per step beside the training step. The first step
some rank cannot fill ends the pass on every rank; the rows the others still held are left out of that pass.

:func:`every_rank` gathers every rank's position into the one a rank-0 checkpoint keeps (as the torch loaders of
:mod:`petastorm.pytorch` do), so that any rank, or a run on another number of ranks, continues from it.
"""

from __future__ import annotations

from typing import Any

__all__ = ['StepAgreement', 'distributed_world', 'every_rank']


def distributed_world() -> int | None:
    """The world size of an initialized ``torch.distributed`` run (None when there is none)."""
    import sys

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


def every_rank(state: dict[str, Any], format_name: str, version: int) -> dict[str, Any]:
    """``{'format', 'version', 'ranks': [every rank's position]}`` gathered with ``all_gather_object``."""
    import torch.distributed as dist

    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return {'format': format_name, 'version': version, 'ranks': sorted(states, key=lambda one: int(one['shard']))}
