"""The torch form of a token loader: a ``DataLoader`` of token batches with an exact, elastic position.

Importing this module imports torch (``pip install 'neo-petastorm[torch]'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from petastorm._optional import import_optional
from petastorm.reader import Reader
from petastorm.tokens._build import stop_readers
from petastorm.tokens._distributed import StepAgreement, agreed, distributed_world, every_rank
from petastorm.tokens._state import FORMAT, VERSION
from petastorm.tokens._stream import TokenStream

__all__ = ['TokenLoader']

torch = import_optional('torch', 'petastorm.tokens.make_token_loader')

# torch is imported at run time, so its classes are values to the type checker.
_IterableDataset: Any = torch.utils.data.IterableDataset
_TorchDataLoader: Any = torch.utils.data.DataLoader


class _TokenDataset(_IterableDataset):
    """The dataset torch's DataLoader machinery and trainers see; iteration goes through the loader."""

    def __init__(self, loader: TokenLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        raise TypeError('iterate the petastorm token loader itself, not its .dataset')


def _tensors(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    batch: dict[str, Any] = {name: torch.from_numpy(values) for name, values in arrays.items()
                             if name != 'max_seqlen'}
    if 'max_seqlen' in arrays:
        batch['max_seqlen'] = int(arrays['max_seqlen'])
    return batch


class TokenLoader(_TorchDataLoader):
    """Batches of packed token rows as dicts of torch tensors; made by :func:`~petastorm.tokens.make_token_loader`.

    A batch holds ``input_ids``, ``position_ids`` and (unless ``labels=None``) ``labels``, int64 tensors of
    ``(rows, seq_len)``, plus ``attention_mask``, ``document_ids`` (int64) and ``cu_seqlens`` (int32, with
    ``max_seqlen`` an int) when asked for. Each ``iter()`` is a pass (the readers' next ``num_epochs`` epochs; an
    endless loader, ``num_epochs=None``, continues), or ``steps_per_epoch`` batches of it. ``len()`` is
    ``steps_per_epoch``, or the batches of a pass when one document makes one row (``packing='none'`` with
    ``long_documents='truncate'``, one source, ``batch_size``); otherwise it raises ``TypeError``, as torch does
    for an iterable dataset.

    In a ``torch.distributed`` run whose readers are sharded over the whole world, every rank stops a pass at the
    same step (``equal_steps``), and :meth:`state_dict` holds every rank's position.
    """

    # Accelerate's prepare() hands back a loader carrying this flag as it is: it shards and batches itself.
    _is_accelerate_prepared = True

    def __init__(self, stream: TokenStream, readers: list[Reader], equal_steps: Any = 'auto') -> None:
        super().__init__(_TokenDataset(self), batch_size=None)
        self._stream = stream
        self._readers = readers
        self._equal_steps = equal_steps
        self._agreement: StepAgreement | None = None
        self._agreement_checked = False
        self._world: int | None = None

    @property
    def readers(self) -> list[Reader]:
        """The readers of the sources (stopped when the loader's with-block ends)."""
        return list(self._readers)

    def _sharded_over_world(self) -> bool:
        shard_count = self._stream.shard_count
        if shard_count == 1:  # no world of one rank or more is sharded over (state_dict() asks every step)
            return False
        if self._world is None:  # a world once initialized is kept
            self._world = distributed_world()
        return self._world == shard_count

    def _steps_agreement(self) -> StepAgreement | None:
        if not self._agreement_checked:
            self._agreement_checked = True
            wanted = self._sharded_over_world() if self._equal_steps == 'auto' else bool(self._equal_steps)
            if wanted and distributed_world() is not None:
                self._agreement = StepAgreement()
        return self._agreement

    def __iter__(self) -> Iterator[dict[str, Any]]:
        agreement = self._steps_agreement()
        batches = iter(self._stream)
        if agreement is not None:
            batches = agreed(batches, agreement, self._stream.end_pass)
        return (_tensors(arrays) for arrays in batches)

    def __len__(self) -> int:
        batches = self._stream.num_batches()
        if batches is None:
            raise TypeError("len() of a token loader is steps_per_epoch when given, or known when each document "
                            "makes one row (packing='none', long_documents='truncate', one source, batch_size=); "
                            "packed rows are counted by reading")
        return batches

    def stats(self) -> dict[str, Any]:
        """Counts for logging: ``tokens`` delivered per source (in the order of the URLs), ``padding_tokens``,
        ``tokens_truncated``, ``steps`` of this pass, ``total_steps`` and ``passes_done``.

        A rank's own counts; after a restore on another number of ranks, rank 0 holds the saved ranks' totals.
        """
        return self._stream.stats()

    @property
    def use_stateful_dataloader(self) -> bool:
        """True: Accelerate's ``save_state``/``load_state`` keep the position."""
        return True

    def state_dict(self) -> dict[str, Any]:
        """The position: plain ints and lists (fits JSON and every checkpoint format).

        In a distributed run (``torch.distributed`` initialized, the readers sharded over the world) it holds every
        rank's position, gathered with ``all_gather_object``: call it on every rank at the same step, as Lightning
        and Accelerate do when they save a checkpoint.
        """
        state = self._stream.state_dict()
        if self._sharded_over_world():
            return every_rank(state, FORMAT, VERSION)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the same world size continues every rank's token stream exactly;
        another one (the position of every saved rank) splits what no rank delivered between the new ranks."""
        self._stream.load_state_dict(state)

    def __enter__(self) -> TokenLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        stop_readers(self._readers)

    def __repr__(self) -> str:
        options = self._stream.options
        return (f'<petastorm.tokens.TokenLoader seq_len={options.pack.seq_len}, packing={options.pack.packing!r}, '
                f'rows_per_batch={self._stream.rows_per_batch}, sources={len(self._readers)}>')
