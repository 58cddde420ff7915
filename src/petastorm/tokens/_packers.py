"""Packers: documents in, rows of ``seq_len`` tokens out, with what a saved position needs to know of them.

Every packer takes the documents of one source as the reader delivers them (:meth:`push`), packs them only as far
as rows are asked for (:meth:`fill`, :meth:`pull`), and says what it holds in a view taken in constant time
(:meth:`snapshot`, a :class:`PackerView` sharing the arrays, which later packing leaves as they are): the documents
not wholly delivered, the ranges left of those partly delivered (:meth:`PackerView.partial`), and the rows it has
packed or begun but not handed out (:meth:`PackerView.listed`), exactly enough to rebuild them (:meth:`restore`).
A position taken every step keeps only a :meth:`mark` (a few references) and makes the view of it when it is read.

* :class:`ConcatPacker` (``'concat'``): the documents' tokens one after the other, cut every ``seq_len`` tokens;
  no padding but in the last row of a pass. A row is a copy of whole runs of tokens, however many documents they
  span, and its segments are found with ``searchsorted``: no Python per document.
* :class:`SinglePacker` (``'none'``): one document per row, padded; a longer document is split over several rows,
  cut (``long_documents='truncate'``, counted and warned about) or refused (``'error'``).
* :class:`~petastorm.tokens._first_fit.FirstFitPacker` (``'first_fit'``), in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from petastorm._warnings import warn_user
from petastorm.tokens._documents import Docs, TokenColumnError
from petastorm.tokens._options import PackSpec
from petastorm.tokens._queue import PieceQueue, QueueMark, Ranges
from petastorm.tokens._rows import ArrayPool, RowBlock, slice_rows

__all__ = ['CUT_AHEAD_TOKENS', 'ConcatPacker', 'Packer', 'PackerView', 'QueueView', 'SinglePacker']

#: Tokens of rows :class:`ConcatPacker` cuts ahead at once (their batch arrays are made together). A cut's three
#: int64 arrays (1 MiB each) stay in the CPU's caches while they are written and filled again: a pass of 30M
#: tokens ran about 12% faster than with cuts twice as large, and about 4% faster than with cuts half as large.
CUT_AHEAD_TOKENS = 1 << 17


class Packer(Protocol):
    """What the feed of a source asks of its packer."""

    queue: PieceQueue

    def push(self, docs: Docs) -> None:
        """Take the documents of one batch of the reader."""
        ...

    def fill(self, rows: int) -> bool:
        """Pack what was pushed until ``rows`` rows are ready; False when more documents are needed."""
        ...

    def finish(self) -> None:
        """No more documents come this pass: what is left becomes rows."""
        ...

    def pull(self, rows: int) -> RowBlock | None:
        """Up to ``rows`` ready rows (None when none is ready)."""
        ...

    def pending(self) -> bool:
        """Something was pushed and not pulled yet."""
        ...

    def mark(self) -> Any:
        """What it holds now, in as few references as can be taken (later packing leaves them as they are)."""
        ...

    def view(self, mark: Any) -> PackerView:
        """What it held at ``mark``, as a position needs it."""
        ...

    def snapshot(self) -> PackerView:
        """What it holds now, as a position needs it (later packing leaves the view as it is)."""
        ...

    def restore(self, listed: dict[str, Any], tokens: Callable[[int], np.ndarray]) -> None:
        """Rebuild :meth:`listed` rows, with each document's tokens from ``tokens``."""
        ...

    def reset(self) -> None:
        """Drop everything (a new pass)."""
        ...


class PackerView(Protocol):
    """What a packer held when a position was taken (:meth:`Packer.snapshot`)."""

    queue: PieceQueue  # frozen

    def packed_rows(self) -> np.ndarray:
        """The documents of rows packed or begun and not handed out (beside the queue's; repeats allowed)."""
        ...

    def partial(self, into: Ranges) -> None:
        """Add to ``into`` the ranges left of documents waiting in the queue that are not whole."""
        ...

    def listed(self) -> dict[str, Any]:
        """The rows packed or begun and not handed out, as plain lists (a saved position keeps them)."""
        ...


class QueueView:
    """The view of a packer that holds nothing but its queue."""

    def __init__(self, queue: PieceQueue) -> None:
        self.queue = queue

    def packed_rows(self) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def partial(self, into: Ranges) -> None:
        self.queue.partial(into)

    def listed(self) -> dict[str, Any]:
        return {}


class _QueuePacker:
    """What the packers that cut rows straight from the queue share."""

    def __init__(self, pack: PackSpec, source: int) -> None:
        self.pack = pack
        self.source = source
        self.queue = PieceQueue()
        self._finished = False

    def push(self, docs: Docs) -> None:
        self.queue.push(docs)

    def finish(self) -> None:
        self._finished = True

    def pending(self) -> bool:
        return self.queue.tokens > 0

    def mark(self) -> QueueMark:
        return self.queue.mark()

    def view(self, mark: QueueMark) -> PackerView:
        return QueueView(PieceQueue.at(mark))

    def snapshot(self) -> PackerView:
        return self.view(self.mark())

    def restore(self, listed: dict[str, Any], tokens: Callable[[int], np.ndarray]) -> None:
        """Nothing to rebuild: the queue's partial documents come back as pieces of the saved ranges."""

    def reset(self) -> None:
        self.queue.clear()
        self._finished = False


class ConcatPacker(_QueuePacker):
    """``packing='concat'``: rows of exactly ``seq_len`` tokens cut from the documents one after the other.

    Rows are cut ahead, :data:`CUT_AHEAD_TOKENS` at a time, and their arrays made at once by ``prepare`` (set by
    the stream); :meth:`pull` hands out views of them. The queue gives up a row's tokens only when the row is
    pulled, so what it holds is what a saved position names, as if each row were cut when pulled.
    """

    def __init__(self, pack: PackSpec, source: int) -> None:
        super().__init__(pack, source)
        self.prepare: Callable[..., RowBlock] | None = None  # called with the block and pool=
        self._pool = ArrayPool()
        self._cut: RowBlock | None = None
        self._next = 0  # the first row of the cut not pulled

    def reset(self) -> None:
        super().reset()
        self._cut = None

    def _ready(self) -> int:
        length = self.pack.seq_len
        rows, rest = divmod(self.queue.tokens, length)
        return rows + int(bool(self._finished and rest))

    def fill(self, rows: int) -> bool:
        return self._ready() >= rows

    def pull(self, rows: int) -> RowBlock | None:
        count = min(rows, self._ready())
        if not count:
            return None
        cut = self._cut
        if cut is None or len(cut) - self._next < count:
            ahead = max(count, CUT_AHEAD_TOKENS // self.pack.seq_len)
            self._cut = cut = None  # its arrays go back to the pool once the batches cut from them are dropped
            cut = self._cut = self._cut_rows(min(ahead, self._ready()))
            self._next = 0
        block = slice_rows(cut, self._next, self._next + count)
        self._next += count
        self.queue.skip(int(block.lengths.sum()))
        return block

    def _cut_rows(self, count: int) -> RowBlock:
        """The next ``count`` rows of the queue (left in it)."""
        length = self.pack.seq_len
        tokens = self._pool.array('input_ids', (count, length))
        out = tokens.reshape(-1)
        filled, (positions, docs, starts) = self.queue.peek(out)
        if filled < len(out):
            out[filled:] = self.pack.pad_id
        # Every row starts a segment: a document going on from the row before continues as a segment of its own.
        row_starts = np.arange(0, count * length, length, dtype=np.int64)
        within = positions.searchsorted(row_starts, side='right') - 1
        missing = positions[within] != row_starts
        if missing.any():
            extra = within[missing]
            starts = np.concatenate((starts, starts[extra] + row_starts[missing] - positions[extra]))
            docs = np.concatenate((docs, docs[extra]))
            positions = np.concatenate((positions, row_starts[missing]))
            order = np.argsort(positions, kind='stable')
            positions, docs, starts = positions[order], docs[order], starts[order]
        lengths = np.minimum(length, filled - row_starts)
        block = RowBlock(tokens, lengths, positions // length, positions % length, docs, starts,
                         np.full(count, self.source, dtype=np.int64))
        return block if self.prepare is None else self.prepare(block, pool=self._pool)


class SinglePacker(_QueuePacker):
    """``packing='none'``: one document per row, padded; long documents as ``long_documents`` says."""

    def __init__(self, pack: PackSpec, source: int, where: str) -> None:
        super().__init__(pack, source)
        self.where = where
        self._rows = 0  # rows the queue makes
        self.truncated_tokens = 0
        self.truncated_documents = 0

    def push(self, docs: Docs) -> None:
        length = self.pack.seq_len
        lengths = docs.lengths
        long = np.flatnonzero(lengths > length)
        if len(long) and self.pack.long_documents == 'error':
            raise TokenColumnError(
                f'{self.where}: a document has {int(lengths[long[0]])} tokens, more than seq_len={length}, and '
                f"packing='none' was given long_documents='error'; pass long_documents='split' (several rows) or "
                f"'truncate', a larger seq_len, or packing='concat' or 'first_fit'")
        if len(long) and self.pack.long_documents == 'truncate':
            docs = self._truncated(docs, long)
            lengths = docs.lengths
        self._rows += int(np.sum(-(-lengths // length)))
        super().push(docs)

    def _truncated(self, docs: Docs, long: np.ndarray) -> Docs:
        length = self.pack.seq_len
        kept = np.minimum(docs.lengths, length)
        dropped = int(docs.lengths[long].sum()) - length * len(long)
        if not self.truncated_documents:
            warn_user(f"{self.where}: documents longer than seq_len={length} are cut to their first {length} tokens "
                      f"(long_documents='truncate'); the loader's stats()['tokens_truncated'] counts the tokens "
                      f"left out")
        self.truncated_tokens += dropped
        self.truncated_documents += len(long)
        bounds = np.concatenate(([0], np.cumsum(kept))).astype(np.int64)
        gather = np.repeat(docs.bounds[:-1] - bounds[:-1], kept) + np.arange(bounds[-1])
        whole = docs.whole.copy()
        whole[long] = False
        return Docs(docs.values[gather], bounds, docs.rows, docs.starts, whole)

    def fill(self, rows: int) -> bool:
        return self._rows >= rows

    def pull(self, rows: int) -> RowBlock | None:
        count = min(rows, self._rows)
        if not count:
            return None
        length = self.pack.seq_len
        out = np.full((count, length), self.pack.pad_id, dtype=np.int64)
        lengths = np.empty(count, dtype=np.int64)
        docs = np.empty(count, dtype=np.int64)
        starts = np.empty(count, dtype=np.int64)
        for row in range(count):
            filled, (_, doc, start) = self.queue.take(out[row], limit_to_piece=True)
            lengths[row], docs[row], starts[row] = filled, doc[0], start[0]
        self._rows -= count
        zeros = np.zeros(count, dtype=np.int64)
        return RowBlock(out, lengths, np.arange(count, dtype=np.int64), zeros, docs, starts,
                        np.full(count, self.source, dtype=np.int64))

    def reset(self) -> None:
        super().reset()
        self._rows = 0
