"""The Grain form of a token loader: a ``grain.IterDataset`` of token batches whose iterator saves its position.

Its iterator's ``get_state()`` is the loader's position (plain ints and lists) and ``set_state()`` continues from
one, so Grain's checkpoint handler (``grain.checkpoint.CheckpointHandler``, also through Orbax) saves and restores
it with the rest of a pipeline built on the dataset (``.map``, ``.prefetch``...). Each JAX process reads its own
shard (``cur_shard='auto'``), and in a run of several processes sharded over all of them, every process stops a
pass at the same step (``equal_steps``, one gather of an integer per step:
:class:`~petastorm.tokens._distributed.JaxStepAgreement`).

Importing this module needs grain (``pip install 'neo-petastorm[jax]'``).
"""

from __future__ import annotations

from typing import Any

from petastorm._optional import import_optional
from petastorm.reader import Reader
from petastorm.tokens._build import stop_readers
from petastorm.tokens._distributed import Agreement, JaxStepAgreement, agreed, jax_world
from petastorm.tokens._stream import TokenStream

__all__ = ['TokenIterDataset']

grain = import_optional('grain', 'petastorm.tokens.make_token_dataset')
_IterDataset: Any = grain.IterDataset
_DatasetIterator: Any = grain.DatasetIterator


class TokenIterDataset(_IterDataset):
    """Token batches (dicts of numpy arrays) as a ``grain.IterDataset``; made by
    :func:`~petastorm.tokens.make_token_dataset`.

    A batch is what :class:`~petastorm.tokens.TokenLoader` gives, as numpy arrays (``max_seqlen`` a 0-d array).
    Each ``iter()`` starts a pass (an endless dataset, ``num_epochs=None``, continues). Use it as a context manager,
    or call :meth:`close`, to stop the readers.

    After ``jax.distributed.initialize()``, with the readers sharded over every process (``cur_shard='auto'``),
    every process ends a pass at the same step (``equal_steps='auto'``; True asks for it whenever there are several
    processes): iterate it on every process, a step at a time, as a training loop does.
    """

    def __init__(self, stream: TokenStream, readers: list[Reader], equal_steps: Any = 'auto') -> None:
        super().__init__()
        self._stream = stream
        self._readers = readers
        self._equal_steps = equal_steps

    def _agreement(self) -> Agreement | None:
        world = jax_world()
        if world is None or world < 2:
            return None
        wanted = self._stream.shard_count == world if self._equal_steps == 'auto' else bool(self._equal_steps)
        return JaxStepAgreement() if wanted else None

    def __iter__(self) -> Any:
        return _TokenIterator(self._stream, self._agreement())

    def stats(self) -> dict[str, Any]:
        """Counts for logging (see :meth:`petastorm.tokens.TokenLoader.stats`)."""
        return self._stream.stats()

    def close(self) -> None:
        """Stop the readers."""
        stop_readers(self._readers)

    def __enter__(self) -> TokenIterDataset:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __str__(self) -> str:
        options = self._stream.options
        return f'TokenIterDataset(seq_len={options.pack.seq_len}, packing={options.pack.packing!r})'


class _TokenIterator(_DatasetIterator):
    """The iterator of a :class:`TokenIterDataset`: its state is the stream's position."""

    def __init__(self, stream: TokenStream, agreement: Agreement | None) -> None:
        super().__init__()
        self._stream = stream
        self._agreement = agreement
        self._batches = self._pass()

    def _pass(self) -> Any:
        batches = iter(self._stream)
        return batches if self._agreement is None else agreed(batches, self._agreement, self._stream.end_pass)

    def __next__(self) -> Any:
        return next(self._batches)

    def get_state(self) -> dict[str, Any]:
        return self._stream.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state)
        self._batches = self._pass()
