"""The reader's part of a source's position, taken once per batch of documents read instead of once per step.

A reader's position changes only when it delivers a batch of documents; between two such batches (tens of
training steps) the documents the loader holds only shrink, as rows are handed out. A source keeps the reader's
position with every document held when it was taken (``state_holding_later``: made only when a saved position is
read, as a checkpoint does) as a :class:`Held` until its reader delivers another batch; the :class:`Held`
says at each later step which of those documents were delivered since (a slice of the packer's queue as it was,
and a few numpy calls): a restored loader reads them again with the others and drops them. Documents are named by
runs ``[first, stop)`` of consecutive numbers, as the readers number consecutive rows, so the saved list stays
short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ['Held', 'id_runs', 'in_runs', 'later_of', 'merged_runs']


def id_runs(ids: np.ndarray) -> np.ndarray:
    """Sorted unique ids as an ``(n, 2)`` int64 array of runs ``[first, stop)`` of consecutive ids."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        return np.empty((0, 2), dtype=np.int64)
    if int(ids[-1]) - int(ids[0]) == len(ids) - 1:  # consecutive (ids are sorted and unique): one run
        return np.array([[ids[0], ids[-1] + 1]], dtype=np.int64)
    breaks = np.flatnonzero(ids[1:] != ids[:-1] + 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(ids)]))
    return np.column_stack((ids[starts], ids[stops - 1] + 1))


def merged_runs(*parts: Any) -> np.ndarray:
    """The union of runs (arrays or lists of ``[first, stop)``), sorted and joined."""
    runs = [np.asarray(part, dtype=np.int64).reshape(-1, 2) for part in parts if len(part)]
    if not runs:
        return np.empty((0, 2), dtype=np.int64)
    if len(runs) == 1 and (len(runs[0]) == 1 or (runs[0][1:, 0] > runs[0][:-1, 1]).all()):
        return runs[0]  # sorted and apart already (what id_runs makes)
    table = np.concatenate(runs)
    table = table[np.argsort(table[:, 0], kind='stable')]
    reach = np.maximum.accumulate(table[:, 1])
    begins = np.concatenate(([True], table[1:, 0] > reach[:-1]))  # a run begins past every run before it
    first = np.flatnonzero(begins)
    last = np.concatenate((first[1:], [len(table)])) - 1
    return np.column_stack((table[first, 0], reach[last]))


def in_runs(ids: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """Which ids fall in one of the (sorted, disjoint) runs."""
    if not len(runs) or not len(ids):
        return np.zeros(len(ids), dtype=bool)
    index = np.searchsorted(runs[:, 0], ids, side='right') - 1
    clipped = np.maximum(index, 0)
    return (index >= 0) & (ids < runs[clipped, 1])


def _union(queue: np.ndarray, others: np.ndarray) -> np.ndarray:
    """The sorted unique documents of both (the queue's alone when they are in order already, as read in order)."""
    if not len(others) and (len(queue) < 2 or bool((queue[1:] > queue[:-1]).all())):
        return queue
    return np.union1d(queue, others)


class _Documents:
    """The documents held when a :class:`Held` was taken, made when first asked for (from views of then)."""

    __slots__ = ('_made', '_views')

    def __init__(self, queue: Callable[[], np.ndarray], others: Callable[[], np.ndarray]) -> None:
        self._views = (queue, others)
        self._made: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        """The queue's documents in order, and the sorted unique others."""
        if self._made is None:
            queue, others = self._views[0](), self._views[1]()
            self._made = (queue, np.unique(others) if len(others) else others)
        return self._made

    def rows(self) -> np.ndarray:
        """Every document held, sorted and unique."""
        return _union(*self())


class Held:
    """A reader's position taken while it held the documents of the packer's queue (in order) and a few others.

    Taking it costs a lock and a few attribute reads: the reader's position (its ``state_holding_later``) and the
    documents held are made the first time a saved position reads them, from views that later reading leaves as
    they are.

    Args:
        pieces: the queue's pieces when it was taken.
        queue: gives the documents of the queue's pieces, in order.
        others: gives the other documents held then (repeats allowed).
        state_holding_later: the reader's ``state_holding_later`` (or :func:`later_of` of its ``state_holding``).
    """

    def __init__(self, pieces: int, queue: Callable[[], np.ndarray], others: Callable[[], np.ndarray],
                 state_holding_later: Callable[[Callable[[], np.ndarray]], Callable[[], Any]]) -> None:
        self.pieces = pieces
        self._documents = _Documents(queue, others)
        self._reader: Any = None
        self._reader_later = state_holding_later(self._documents.rows)  # not a method of self: no cycle to collect

    @property
    def reader(self) -> Any:
        """The reader's position with every document held counted as not delivered."""
        if self._reader is None:
            self._reader = self._reader_later()
        return self._reader

    def delivered_since(self, waiting: int, others: np.ndarray) -> np.ndarray:
        """Runs of the documents held then that were delivered since: the queue's first pieces then, less what
        is still held.

        Args:
            waiting: the queue's pieces now.
            others: the other documents held now (repeats allowed).
        """
        queue, held_others = self._documents()
        gone = queue[:len(queue) - waiting]
        if waiting and len(gone) and gone[-1] == queue[len(queue) - waiting]:
            gone = gone[:-1]  # the first piece waiting is of the same document (its pieces are together)
        if len(held_others):
            gone = np.concatenate((gone, held_others))
        if len(gone) > 1 and not (int(gone[-1]) - int(gone[0]) == len(gone) - 1 or (gone[1:] > gone[:-1]).all()):
            gone = np.unique(gone)
        if len(others) and len(gone):
            gone = gone[~np.isin(gone, others)]
        return id_runs(gone)


def later_of(positions: Any) -> Callable[[Callable[[], np.ndarray]], Callable[[], Any]]:
    """A source's ``state_holding_later``, or one made of its ``state_holding`` (paying at once)."""
    later = getattr(positions, 'state_holding_later', None)
    if later is not None:
        return later  # type: ignore[no-any-return]

    def at_once(held_rows: Callable[[], np.ndarray]) -> Callable[[], Any]:
        state = positions.state_holding(held_rows())
        return lambda: state

    return at_once
