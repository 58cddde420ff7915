"""The documents a packer has received and not packed yet, in the order the reader delivered them.

A :class:`PieceQueue` holds :class:`~petastorm.tokens._documents.Docs` as they came (a batch of the reader each)
and a position in the first of them: the piece being read and how many of its tokens were taken. Packers take
tokens from its front (:meth:`PieceQueue.take`, a copy of whole runs of tokens, however many documents they span)
or whole pieces (:meth:`PieceQueue.pop_piece`). What it holds is also what a saved position must say about it: the
documents it holds (:meth:`PieceQueue.held_rows`) and, of those not whole, the ranges left
(:meth:`PieceQueue.partial`), asked of a :meth:`PieceQueue.frozen` copy when a position is taken.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from petastorm.tokens._documents import Docs

__all__ = ['PieceQueue', 'Ranges', 'add_range']

#: What is left of documents: ``{document: [(start, stop), ...]}`` ranges of its tokens, ascending.
Ranges = dict[int, list[tuple[int, int]]]


def add_range(ranges: Ranges, doc: int, start: int, stop: int) -> None:
    """Add ``[start, stop)`` of ``doc`` to ``ranges`` (kept sorted; touching ranges are joined)."""
    if start >= stop:
        return
    spans = ranges.setdefault(doc, [])
    spans.append((start, stop))
    spans.sort()
    merged = [spans[0]]
    for first, last in spans[1:]:
        if first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    ranges[doc] = merged


class PieceQueue:
    """Pieces of documents waiting to be packed (see the module's documentation)."""

    def __init__(self) -> None:
        self._chunks: deque[Docs] = deque()
        self._partial_chunks: set[int] = set()  # ids of chunks holding pieces that are not whole documents
        self._piece = 0  # the first piece of the first chunk not wholly taken
        self._offset = 0  # tokens of the first chunk taken (into its values)
        self.tokens = 0  # tokens waiting
        self.pieces = 0  # pieces waiting (the one being read included)

    def push(self, docs: Docs) -> None:
        """Append the pieces of a batch."""
        if len(docs):
            self._chunks.append(docs)
            if not docs.whole.all():
                self._partial_chunks.add(id(docs))
            self.tokens += int(docs.bounds[-1])
            self.pieces += len(docs)

    def frozen(self) -> PieceQueue:
        """A copy that later takes and pushes leave as it is (the documents' arrays are shared, not copied)."""
        copy = PieceQueue.__new__(PieceQueue)
        copy.__dict__.update(self.__dict__)
        copy._chunks = self._chunks.copy()
        copy._partial_chunks = self._partial_chunks.copy()
        return copy

    def clear(self) -> None:
        """Drop everything."""
        self.__init__()  # type: ignore[misc]

    def head(self) -> tuple[int, int, int] | None:
        """``(document, start in it, tokens left)`` of the piece at the front, or None when empty."""
        if not self._chunks:
            return None
        docs = self._chunks[0]
        taken = self._offset - int(docs.bounds[self._piece])
        return (int(docs.rows[self._piece]), int(docs.starts[self._piece]) + taken,
                int(docs.bounds[self._piece + 1]) - self._offset)

    def take(self, out: np.ndarray, limit_to_piece: bool = False) -> tuple[int, list[np.ndarray]]:
        """Copy the next tokens into ``out`` and take them off the queue (see :meth:`peek`)."""
        filled, segments = self.peek(out, limit_to_piece)
        self.skip(filled)
        return filled, segments

    def peek(self, out: np.ndarray, limit_to_piece: bool = False) -> tuple[int, list[np.ndarray]]:
        """Copy the next tokens into ``out`` (as many as fit, or up to the end of the front piece), leaving them.

        Returns:
            ``(tokens copied, [positions in out, documents, starts in documents])``: the segments begun in ``out``
            (the first one may continue a piece begun before).
        """
        wanted = len(out)
        filled = 0
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        piece, offset = self._piece, self._offset
        for docs in self._chunks:
            bounds = docs.bounds
            stop = min(int(bounds[-1]), offset + wanted - filled)
            if limit_to_piece:
                stop = min(stop, int(bounds[piece + 1]))
            out[filled:filled + stop - offset] = docs.values[offset:stop]
            last = int(bounds.searchsorted(stop, side='left'))  # pieces starting before stop: [piece, last)
            begins = bounds[piece:last].copy()
            begins[0] = offset
            parts.append((begins + (filled - offset), docs.rows[piece:last],
                          docs.starts[piece:last] + (begins - bounds[piece:last])))
            filled += stop - offset
            piece = offset = 0
            if filled >= wanted or limit_to_piece:
                break
        if len(parts) == 1:
            return filled, list(parts[0])
        if not parts:
            empty = np.empty(0, dtype=np.int64)
            return 0, [empty, empty, empty]
        return filled, [np.concatenate([part[k] for part in parts]) for k in range(3)]

    def skip(self, count: int) -> None:
        """Take ``count`` tokens off the front."""
        self.tokens -= count
        while count:
            docs = self._chunks[0]
            end = int(docs.bounds[-1])
            stop = min(end, self._offset + count)
            count -= stop - self._offset
            self._advance(docs, stop, end)

    def _advance(self, docs: Docs, stop: int, end: int) -> None:
        new_piece = int(docs.bounds.searchsorted(stop, side='right')) - 1
        self.pieces -= new_piece - self._piece
        self._piece, self._offset = new_piece, stop
        if stop == end:
            self._partial_chunks.discard(id(self._chunks.popleft()))
            self._piece = self._offset = 0

    def pop_piece(self) -> tuple[int, int, np.ndarray] | None:
        """The rest of the front piece, whole: ``(document, start in it, its tokens)``, or None when empty."""
        if not self._chunks:
            return None
        docs = self._chunks[0]
        doc, start = int(docs.rows[self._piece]), int(docs.starts[self._piece])
        stop = int(docs.bounds[self._piece + 1])
        start += self._offset - int(docs.bounds[self._piece])
        values = docs.values[self._offset:stop]
        self.tokens -= stop - self._offset
        self._advance(docs, stop, int(docs.bounds[-1]))
        return doc, start, values

    def held_rows(self) -> np.ndarray:
        """The documents of the pieces waiting (with repeats when a document has several pieces)."""
        if not self._chunks:
            return np.empty(0, dtype=np.int64)
        parts = [self._chunks[0].rows[self._piece:]] + [docs.rows for docs in list(self._chunks)[1:]]
        return np.concatenate(parts)

    def partial(self, into: Ranges) -> None:
        """Add the ranges of the waiting pieces that are not whole documents to ``into``."""
        for index, docs in enumerate(self._chunks):
            partial = id(docs) in self._partial_chunks
            if index and not partial:
                continue
            first = self._piece if index == 0 else 0
            pieces = (np.flatnonzero(~docs.whole[first:]) + first).tolist() if partial else []
            if index == 0 and self._offset > docs.bounds[first] and (not pieces or pieces[0] != first):
                pieces.insert(0, first)
            for piece in pieces:
                begin = docs.bounds[piece] if not (index == 0 and piece == first) else self._offset
                start = int(docs.starts[piece] + begin - docs.bounds[piece])
                add_range(into, int(docs.rows[piece]), start,
                          int(docs.starts[piece] + docs.bounds[piece + 1] - docs.bounds[piece]))
