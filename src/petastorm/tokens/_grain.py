"""The Grain form of a token loader: a ``grain.IterDataset`` of token batches whose iterator saves its position.

Its iterator's ``get_state()`` is the loader's position (plain ints and lists) and ``set_state()`` continues from
one, so Grain's checkpoint handler (``grain.checkpoint.CheckpointHandler``, also through Orbax) saves and restores
it with the rest of a pipeline built on the dataset (``.map``, ``.prefetch``...). Each JAX process reads its own
shard (``cur_shard='auto'``).

Importing this module needs grain (``pip install 'neo-petastorm[jax]'``).
"""

from __future__ import annotations

from typing import Any

from petastorm._optional import import_optional
from petastorm.reader import Reader
from petastorm.tokens._build import stop_readers
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
    """

    def __init__(self, stream: TokenStream, readers: list[Reader]) -> None:
        super().__init__()
        self._stream = stream
        self._readers = readers

    def __iter__(self) -> Any:
        return _TokenIterator(self._stream)

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

    def __init__(self, stream: TokenStream) -> None:
        super().__init__()
        self._stream = stream
        self._batches = iter(stream)

    def __next__(self) -> Any:
        return next(self._batches)

    def get_state(self) -> dict[str, Any]:
        return self._stream.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state)
        self._batches = iter(self._stream)
