"""The reader's part of a source's position, made once per batch of documents read instead of once per step.

A reader's position changes only when it delivers a batch of documents; between two such batches (tens of
training steps) the documents the loader holds only shrink, as rows are handed out. :class:`HeldPosition` keeps
the reader's position with every document held when it was made (``state_holding``) as a :class:`Held`, which
says at each later step which of those documents were delivered since (a slice of the packer's queue as it was,
and a few numpy calls): a restored loader reads them again with the others and drops them. Documents are named by
runs ``[first, stop)`` of consecutive numbers, as the readers number consecutive rows, so the saved list stays
short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ['Held', 'HeldPosition', 'id_runs', 'in_runs', 'merged_runs']


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


@dataclass(frozen=True)
class Held:
    """A reader's position made while it held ``queue`` (the packer's queue, in order) and ``others``."""

    reader: Any
    queue: np.ndarray
    others: np.ndarray

    def delivered_since(self, waiting: int, others: np.ndarray) -> np.ndarray:
        """Runs of the documents held then that were delivered since: the queue's first pieces then, less what
        is still held.

        Args:
            waiting: the queue's pieces now.
            others: the other documents held now (repeats allowed).
        """
        queue = self.queue
        gone = queue[:len(queue) - waiting]
        if waiting and len(gone) and gone[-1] == queue[len(queue) - waiting]:
            gone = gone[:-1]  # the first piece waiting is of the same document (its pieces are together)
        if len(self.others):
            gone = np.concatenate((gone, self.others))
        if len(gone) > 1 and not (int(gone[-1]) - int(gone[0]) == len(gone) - 1 or (gone[1:] > gone[:-1]).all()):
            gone = np.unique(gone)
        if len(others) and len(gone):
            gone = gone[~np.isin(gone, others)]
        return id_runs(gone)


class HeldPosition:
    """The reader's position of the latest batch of documents read, made again only when another was read.

    The documents held are those of the packer's queue (many, in the order read; between two reads the queue
    only gives up its first pieces) and a few others (packed rows not handed out). What was delivered since is
    then the queue's first pieces then, minus what is still held elsewhere (:meth:`Held.delivered_since`): a slice,
    not a search.
    """

    def __init__(self) -> None:
        self._reads = -1
        self._held = Held(None, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))

    def reset(self) -> None:
        """Forget the position (the reader moved in another way: a restore, a new pass)."""
        self._reads = -1

    def current(self, reads: int, waiting: int, queue: Callable[[], np.ndarray], others: Callable[[], np.ndarray],
                state_holding: Callable[[np.ndarray], Any]) -> Held:
        """The position for now: the one kept while the reader delivered nothing more, else made again.

        Args:
            reads: how many batches the reader delivered so far.
            waiting: the queue's pieces now.
            queue: the documents of the queue's pieces, in order (called when the position is made).
            others: the other documents held now (called when the position is made).
            state_holding: the reader's ``state_holding``.
        """
        if reads != self._reads or waiting > len(self._held.queue):
            held_queue, held_others = queue(), others()
            held_others = np.unique(held_others) if len(held_others) else held_others
            self._held = Held(state_holding(_union(held_queue, held_others)), held_queue, held_others)
            self._reads = reads
        return self._held
