"""A ``torchdata.nodes`` source node over a petastorm loader: batches with an exact state, to compose.

``ReaderNode`` is a ``torchdata.nodes.BaseNode``: ``next()`` gives the loader's next batch, ``get_state()`` its
position (the reader's, with the rows waiting in the loader's buffers counted as not delivered) and
``reset(state)`` continues from one. Nodes built on it (``ParallelMapper``, ``Prefetcher``, ``Batcher``,
``MultiNodeWeightedSampler``) keep their own states on top, and ``torchdata.nodes.Loader`` saves them all::

    from torchdata.nodes import Loader, MultiNodeWeightedSampler, ParallelMapper, Prefetcher

    mix = MultiNodeWeightedSampler({'a': ReaderNode(make_batch_reader(url_a, num_epochs=None), batch_size=64),
                                    'b': ReaderNode(make_batch_reader(url_b, num_epochs=None), batch_size=64)},
                                   weights={'a': 0.7, 'b': 0.3}, seed=0)
    loader = Loader(Prefetcher(ParallelMapper(mix, augment, num_workers=2), prefetch_factor=4))

Importing this module imports torch and torchdata (``pip install 'neo-petastorm[torchdata]'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from petastorm._optional import import_optional

__all__ = ['ReaderNode']

_nodes = import_optional('torchdata.nodes', 'torchdata')
_BaseNode: Any = _nodes.BaseNode


class ReaderNode(_BaseNode):
    """Batches of a petastorm torch loader as a ``torchdata.nodes`` source node.

    ``reset()`` (which ``torchdata.nodes.Loader`` calls at every epoch) starts the reader's next pass, or continues
    an endless reader (``num_epochs=None``); ``reset(state)`` continues from a ``get_state()``. The state is this
    process's own (no collective): in a distributed run, save every rank's.

    Args:
        loader: a :class:`petastorm.pytorch.DataLoader` or :class:`petastorm.pytorch.BatchedDataLoader`, or a
            reader (from ``make_reader``/``make_batch_reader``), which is then read by a ``DataLoader`` made with
            ``**loader_args`` (``batch_size=...``, ``shuffling_queue_capacity=...``).
        **loader_args: the ``DataLoader`` arguments when ``loader`` is a reader.
    """

    def __init__(self, loader: Any, **loader_args: Any) -> None:
        super().__init__()
        from petastorm.pytorch import DataLoader, LoaderBase

        if not isinstance(loader, LoaderBase):
            loader = DataLoader(loader, **loader_args)
        elif loader_args:
            raise TypeError(f'ReaderNode takes loader arguments only with a reader, got a loader and {loader_args}')
        self.loader = loader
        self._stream = loader._stream()
        self._batches: Iterator[Any] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start the next pass, or continue from ``initial_state``."""
        super().reset(initial_state)
        if initial_state is not None:
            self._stream.load_state_dict(initial_state)
        self._batches = iter(self._stream)

    def next(self) -> Any:
        """The next batch (``StopIteration`` at the end of a pass)."""
        assert self._batches is not None, 'reset() first'
        return next(self._batches)

    def get_state(self) -> dict[str, Any]:
        """The loader's position (see :meth:`petastorm.pytorch.DataLoader.state_dict`), without any collective."""
        return self._stream.state_dict()

    def close(self) -> None:
        """Stop and join the reader."""
        self.loader.__exit__(None, None, None)
