"""``packing='first_fit'``: whole documents placed into a bounded window of open rows, padding the rest.

A document goes into the first open row, taking the rows fullest first, that has room for it: first fit over the
rows in order of fill, which is best fit. Taken in arrival order instead (plain first fit), the open rows fill
worse: on documents of log-normal lengths (median 600 tokens, sigma 1) into rows of 2048 tokens with 64 open rows,
plain first fit pads 2.9% of the tokens and this order 0.7% (``benchmarks/tokens_bench.py`` measures it). When no
open row has room and the window is full, the fullest row is closed (it wastes the least) and the document opens a
new one. A row whose last token is filled closes at once. A document longer than ``seq_len`` gives rows of
``seq_len`` tokens of its own, and its last part is placed like a document.

The window is ``pack_window`` rows: a document waits at most until that many other rows were closed. Placement is
a numpy reduction over the window per document; the rows are copied when they close.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from petastorm.tokens._documents import Docs
from petastorm.tokens._options import PackSpec
from petastorm.tokens._queue import PieceQueue, QueueMark, Ranges
from petastorm.tokens._rows import RowBlock, Segment, block_of_rows

__all__ = ['FirstFitPacker', 'FirstFitView']


class FirstFitPacker:
    """Whole documents into the fullest open row with room (see the module's documentation)."""

    def __init__(self, pack: PackSpec, source: int) -> None:
        self.pack = pack
        self.source = source
        self.queue = PieceQueue()
        self._finished = False
        self.reset()

    def reset(self) -> None:
        """Drop everything (a new pass)."""
        window = self.pack.window
        self.queue.clear()
        self._finished = False
        self._free = np.full(window, self.pack.seq_len, dtype=np.int64)
        self._open = np.zeros(window, dtype=bool)
        self._rows: list[list[Segment]] = [[] for _ in range(window)]
        self._flats: list[list[int]] = [[] for _ in range(window)]  # each open row's segments as a state keeps them
        self._ready: deque[tuple[list[Segment], list[int]]] = deque()

    def push(self, docs: Docs) -> None:
        """Take the documents of one batch of the reader (placed when rows are asked for)."""
        self.queue.push(docs)

    def fill(self, rows: int) -> bool:
        """Place queued documents until ``rows`` rows are closed; False when the queue ran out first."""
        while len(self._ready) < rows:
            piece = self.queue.pop_piece()
            if piece is None:
                if self._finished:
                    self._close_all()
                return len(self._ready) >= rows
            self._place_document(*piece)
        return True

    def finish(self) -> None:
        """No more documents this pass: the open rows close when the queue is empty."""
        self._finished = True

    def pending(self) -> bool:
        """Something was pushed and not pulled yet."""
        return self.queue.tokens > 0 or bool(self._ready) or bool(self._open.any())

    def _place_document(self, doc: int, start: int, values: np.ndarray) -> None:
        length = self.pack.seq_len
        full, rest = divmod(len(values), length)
        for index in range(full):
            first = start + index * length
            self._ready.append(([(doc, first, values[index * length:(index + 1) * length])], [doc, first, length]))
        if rest:
            self._place(doc, start + full * length, values[full * length:])

    def _place(self, doc: int, start: int, values: np.ndarray) -> None:
        size = len(values)
        fits = self._open & (self._free >= size)
        if fits.any():
            slot = int(np.argmin(np.where(fits, self._free, self.pack.seq_len + 1)))
        elif not self._open.all():
            slot = int(np.argmin(self._open))
            self._open[slot] = True
        else:
            slot = int(np.argmin(self._free))
            self._close(slot)
            self._open[slot] = True
        self._rows[slot].append((doc, start, values))
        self._flats[slot] = [*self._flats[slot], doc, start, size]  # a new list: a snapshot may hold the old
        self._free[slot] -= size
        if not self._free[slot]:
            self._close(slot)

    def _close(self, slot: int) -> None:
        self._ready.append((self._rows[slot], self._flats[slot]))
        self._rows[slot] = []
        self._flats[slot] = []
        self._free[slot] = self.pack.seq_len
        self._open[slot] = False

    def _close_all(self) -> None:
        for slot in np.flatnonzero(self._open).tolist():
            self._close(slot)

    def pull(self, rows: int) -> RowBlock | None:
        """Up to ``rows`` closed rows, oldest first."""
        count = min(rows, len(self._ready))
        if not count:
            return None
        taken = [self._ready.popleft()[0] for _ in range(count)]
        return block_of_rows(taken, self.pack.seq_len, self.pack.pad_id, self.source)

    # -- what a saved position keeps -----------------------------------------------------------------------------

    def mark(self) -> tuple[QueueMark, list[list[int]], list[list[int]], np.ndarray]:
        """The rows held now (closed and open), as a position keeps them; the lists are shared (a row's list is
        replaced, never changed, when a document is placed in it)."""
        return self.queue.mark(), [flat for _, flat in self._ready], self._flats.copy(), self._open.copy()

    def view(self, mark: tuple[QueueMark, list[list[int]], list[list[int]], np.ndarray]) -> FirstFitView:
        """What :meth:`mark` held, as a position asks it."""
        return FirstFitView(PieceQueue.at(mark[0]), *mark[1:])

    def snapshot(self) -> FirstFitView:
        """The rows held now (see :meth:`mark`)."""
        return self.view(self.mark())

    def restore(self, listed: dict[str, Any], tokens: Callable[[int], np.ndarray]) -> None:
        """Rebuild the rows of :meth:`listed` (on a packer just :meth:`reset`)."""
        for row in listed.get('rows', ()):
            self._ready.append((_segments(row, tokens), [int(number) for number in row]))
        for entry in listed.get('open', ()):
            slot, segments = int(entry[0]), _segments(entry[1:], tokens)
            self._rows[slot] = segments
            self._flats[slot] = [int(number) for number in entry[1:]]
            self._open[slot] = True
            self._free[slot] = self.pack.seq_len - sum(len(values) for _, _, values in segments)


class FirstFitView:
    """What a :class:`FirstFitPacker` held when a position was taken (a
    :class:`~petastorm.tokens._packers.PackerView`)."""

    def __init__(self, queue: PieceQueue, ready: list[list[int]], flats: list[list[int]], is_open: np.ndarray) -> None:
        self.queue = queue
        self._ready = ready
        self._flats = flats
        self._is_open = is_open

    @property
    def _open(self) -> list[tuple[int, list[int]]]:
        return [(slot, self._flats[slot]) for slot in np.flatnonzero(self._is_open).tolist()]

    def packed_rows(self) -> np.ndarray:
        """Documents in open rows and in closed rows not pulled."""
        flats = self._ready + [flat for _, flat in self._open]
        return np.array([doc for flat in flats for doc in flat[::3]], dtype=np.int64)

    def partial(self, into: Ranges) -> None:
        """Ranges of documents waiting in the queue that are not whole (placed ones are :meth:`listed`)."""
        self.queue.partial(into)

    def listed(self) -> dict[str, Any]:
        """``{'rows': closed rows not pulled, 'open': [slot, segments...] per open row}``, segments flat."""
        return {'rows': [list(flat) for flat in self._ready], 'open': [[slot, *flat] for slot, flat in self._open]}


def _segments(flat: list[int], tokens: Callable[[int], np.ndarray]) -> list[Segment]:
    out = []
    for index in range(0, len(flat), 3):
        doc, start, length = (int(flat[index + k]) for k in range(3))
        out.append((doc, start, tokens(doc)[start:start + length]))
    return out
