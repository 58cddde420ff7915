"""The documents a packer has received and not packed yet, in the order the reader delivered them.

A :class:`PieceQueue` holds :class:`~petastorm.tokens._documents.Docs` as they came (a batch of the reader each)
and a position in the first of them: the piece being read and how many of its tokens were taken. Packers take
tokens from its front (:meth:`PieceQueue.take`, a copy of whole runs of tokens, however many documents they span)
or whole pieces (:meth:`PieceQueue.pop_piece`). What it holds is also what a saved position must say about it: the
documents it holds (:meth:`PieceQueue.held_rows`) and, of those not whole, the ranges left
(:meth:`PieceQueue.partial`), asked of a copy made later from a :meth:`PieceQueue.mark` taken with the position:
the queue's batches are a tuple and its set of partial batches a frozenset, replaced when they change, so the mark
is a handful of references.
"""

from __future__ import annotations

import numpy as np

from petastorm.tokens._documents import Docs

__all__ = ['PieceQueue', 'QueueMark', 'Ranges', 'add_range']

#: What is left of documents: ``{document: [(start, stop), ...]}`` ranges of its tokens, ascending.
Ranges = dict[int, list[tuple[int, int]]]

#: What :meth:`PieceQueue.mark` keeps: the batches, the partial ones, piece, offset, tokens and pieces.
QueueMark = tuple[tuple[Docs, ...], frozenset[int], int, int, int, int]


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
        # Replaced, never changed, when a batch comes or goes: a mark taken before keeps the old ones.
        self._chunks: tuple[Docs, ...] = ()
        self._partial_chunks: frozenset[int] = frozenset()  # ids of chunks holding pieces that are not whole
        self._piece = 0  # the first piece of the first chunk not wholly taken
        self._offset = 0  # tokens of the first chunk taken (into its values)
        self.tokens = 0  # tokens waiting
        self.pieces = 0  # pieces waiting (the one being read included)

    def push(self, docs: Docs) -> None:
        """Append the pieces of a batch."""
        if len(docs):
            self._chunks = (*self._chunks, docs)
            if not docs.whole.all():
                self._partial_chunks = self._partial_chunks | {id(docs)}
            self.tokens += int(docs.bounds[-1])
            self.pieces += len(docs)

    def mark(self) -> QueueMark:
        """What the queue holds now, in a few references that later takes and pushes leave as they are."""
        return self._chunks, self._partial_chunks, self._piece, self._offset, self.tokens, self.pieces

    @classmethod
    def at(cls, mark: QueueMark) -> PieceQueue:
        """A queue holding what it held at ``mark`` (the documents' arrays are shared, not copied)."""
        copy = cls.__new__(cls)
        copy._chunks, copy._partial_chunks, copy._piece, copy._offset, copy.tokens, copy.pieces = mark
        return copy

    def frozen(self) -> PieceQueue:
        """A copy that later takes and pushes leave as it is (the documents' arrays are shared, not copied)."""
        return PieceQueue.at(self.mark())

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
            done, self._chunks = self._chunks[0], self._chunks[1:]
            if id(done) in self._partial_chunks:
                self._partial_chunks = self._partial_chunks - {id(done)}
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
        parts = [self._chunks[0].rows[self._piece:]] + [docs.rows for docs in self._chunks[1:]]
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
