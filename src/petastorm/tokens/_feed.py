"""One source of a token loader: a reader's documents through a packer, and their part of a saved position.

A :class:`Feed` reads the documents of one reader (a batch of them at a time, tokenized in the reader's workers
when they are text), hands them to its packer and pulls rows from it. Its part of a saved position
(:meth:`Feed.state`) is:

* ``'reader'``: the reader's position with every document the feed or the loader held counted as not
  delivered (the reader's ``state_holding``), so a restored reader reads them again first; it is made when the
  reader delivers a batch of documents and kept until the next (:mod:`petastorm.tokens._held`), so
* ``'delivered'``: runs ``[first, stop)`` of the documents it holds that were handed out whole since (read again
  only to be dropped);
* ``'remaining'``: for documents read again whose delivery had begun, the ranges of their tokens left
  (``[document, start, stop, start, stop, ...]``); a document read again that is not named there comes whole;
* ``'packer'``: the rows the packer packed or began and did not hand out, as the documents' ranges they hold.

A restore on the same ranks (:meth:`Feed.restore`) waits for the documents of the saved rows to be read again,
rebuilds those rows exactly, then packs the rest as before: the same tokens in the same rows. A restore on another
number of ranks (:meth:`Feed.restore_elsewhere`) only knows which ranges of which documents are left: each rank packs
what its reader gives it, cutting the documents named to those ranges.

A position is taken every step, so taking it (:meth:`Feed.snapshot`) only keeps references: the packer's
:meth:`~petastorm.tokens._packers.Packer.mark` and a :class:`_Frame` of what changes only when the reader delivers
a batch (the reader's position among them), kept from one step to the next until then. The lists are made from
them when the position is read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.errors import PetastormError
from petastorm.reading import ColumnBatch, ColumnSource, PositionSource, positions_of
from petastorm.tokens._documents import Docs, DocumentFields, cut_pieces, documents_of
from petastorm.tokens._first_fit import FirstFitPacker
from petastorm.tokens._held import Held, in_runs, later_of, merged_runs
from petastorm.tokens._options import PackSpec
from petastorm.tokens._packers import ConcatPacker, Packer, PackerView, SinglePacker
from petastorm.tokens._queue import Ranges, add_range
from petastorm.tokens._rows import RowBlock

__all__ = ['Feed', 'RestoreError', 'listed_ranges', 'make_packer', 'ranges_of_entries']


class RestoreError(PetastormError, RuntimeError):
    """A saved position names documents that the reader does not deliver again (another dataset or options)."""


def make_packer(pack: PackSpec, source: int, where: str) -> Packer:
    """The packer ``pack.packing`` names."""
    if pack.packing == 'concat':
        return ConcatPacker(pack, source)
    if pack.packing == 'first_fit':
        return FirstFitPacker(pack, source)
    return SinglePacker(pack, source, where)


def ranges_of_entries(entries: Any, into: Ranges | None = None) -> Ranges:
    """``[[document, start, stop, ...], ...]`` (a state's ``'remaining'``) as ranges per document."""
    ranges: Ranges = {} if into is None else into
    for entry in entries or ():
        for index in range(1, len(entry) - 1, 2):
            add_range(ranges, int(entry[0]), int(entry[index]), int(entry[index + 1]))
    return ranges


def _entries(ranges: Ranges) -> list[list[int]]:
    return [[doc, *[bound for span in spans for bound in span]] for doc, spans in sorted(ranges.items())]


def listed_ranges(rows: Any, into: Ranges, skip_source: bool) -> Ranges:
    """Add the ranges the listed rows hold (``[(source,) document, start, length, ...]`` each) to ``into``."""
    for row in rows or ():
        flat = row[1:] if skip_source else row
        for index in range(0, len(flat) - 2, 3):
            add_range(into, int(flat[index]), int(flat[index + 1]), int(flat[index + 1]) + int(flat[index + 2]))
    return into


def _nothing_held() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


def _others(view: PackerView, buffered: Callable[[], np.ndarray], arrived: np.ndarray | None) -> np.ndarray:
    """The documents held beside the queue's: the packer's rows, the loader's buffered rows, a restore's."""
    parts = [view.packed_rows(), np.asarray(buffered(), dtype=np.int64)]
    if arrived is not None:
        parts.append(arrived)
    return np.concatenate(parts) if len(parts[0]) or len(parts[1]) or len(parts) > 2 else parts[0]


@dataclass(frozen=True)
class _Frame:
    """What a source's position holds that changes only when the reader delivers a batch (or on a restore).

    Attributes:
        reads: the reader's batches delivered when it was taken.
        held: the reader's position then, with every document held counted as not delivered.
        carried: the ranges left of documents the reader delivers again (replaced, never changed).
        delivered: runs of documents read again only to be dropped.
        saved_rows: a restore's packer rows not rebuilt yet.
        arrived: the documents a restore read again for its rows, or None.
    """

    reads: int
    held: Held
    carried: Ranges
    delivered: np.ndarray
    saved_rows: dict[str, Any] | None
    arrived: np.ndarray | None


def _positions(source: ColumnSource, where: str) -> PositionSource:
    positions = positions_of(source)
    if positions is None:
        raise TypeError(f'{where}: the token loader needs a reader that names every row it delivers (a '
                        f'make_batch_reader reader); got {type(source).__name__}')
    return positions


class Feed:
    """The documents of one reader, packed into rows (see the module's documentation).

    Args:
        index: the source's number in the loader (rows carry it).
        source: the reader, as a column source.
        fields: the columns of token ids (or the tokenizing transform's), and of prompts or a loss mask.
        pack: how documents become rows.
        where: how the source is named in messages.
    """

    def __init__(self, index: int, source: ColumnSource, fields: DocumentFields, pack: PackSpec, where: str) -> None:
        self.index = index
        self.source = source
        self.positions = _positions(source, where)
        self._state_later = later_of(self.positions)
        self.fields = fields
        self.pack = pack
        self.where = where
        self.packer = make_packer(pack, index, where)
        self._batches: Iterator[ColumnBatch] | None = None
        self._exhausted = False
        self._carried: Ranges = {}  # documents the reader delivers again, of which only these ranges are left
        self._saved_rows: dict[str, Any] | None = None  # the packer's rows of a restore, until rebuilt
        self._wanted: set[int] = set()  # documents whose tokens the restore's rows need
        self._arrived: dict[int, np.ndarray] = {}
        self._reads = 0  # batches of documents read: the reader's position changes with them
        self._frame: _Frame | None = None  # kept from one position to the next while the reader delivers nothing
        self._delivered = np.empty((0, 2), dtype=np.int64)  # runs of documents read again only to be dropped

    # -- passes --------------------------------------------------------------------------------------------------

    def new_pass(self, restart: bool) -> None:
        """Start reading a pass (``restart``: the reader starts its next one, abandoning the current)."""
        if restart:
            self.source.restart()
            self._carried = {}
            self._delivered = np.empty((0, 2), dtype=np.int64)
            self._frame = None
        self.packer.reset()
        self._batches = None
        self._exhausted = False

    def rows(self, count: int) -> RowBlock | None:
        """Up to ``count`` rows (fewer only at the end of the pass; None when nothing is left)."""
        packer = self.packer
        while not packer.fill(count) and self._read_more():
            pass
        return packer.pull(count)

    def has_more(self) -> bool:
        """The pass has a token left to give (reading the next batch of documents if the packer has none)."""
        while not self.packer.pending():
            if not self._read_more():
                return False
        return True

    def _read_more(self) -> bool:
        """Hand the packer the next batch of documents (at the end of the pass, say so); False once it ended."""
        if self._exhausted:
            return False
        docs = self._next_docs()
        if docs is None:
            self._exhausted = True
            self.packer.finish()
        else:
            self.packer.push(docs)
        return True

    def _next_docs(self) -> Docs | None:
        if self._batches is None:
            self._batches = self.source.column_batches()
        for batch in self._batches:
            if batch.row_ids is None:
                raise RuntimeError(f'{self.where}: the reader delivered rows without numbers; the token loader needs '
                                   f'a reader from make_batch_reader without a transform that changes the row count')
            self._reads += 1
            docs = documents_of(batch.columns, batch.row_ids, self.pack, self.fields)
            return self._arrive(docs)
        return None

    def _arrive(self, docs: Docs) -> Docs:
        """The pieces of newly read documents that go to the queue; the tokens a restore waits for are kept."""
        if len(self._delivered):
            dropped = in_runs(docs.rows, self._delivered)
            if dropped.any():
                docs = docs.take(np.flatnonzero(~dropped))
        if self._wanted:
            wanted = np.flatnonzero(np.isin(docs.rows, np.fromiter(self._wanted, np.int64, len(self._wanted))))
            for index in wanted.tolist():
                doc = int(docs.rows[index])
                self._arrived[doc] = docs.tokens(index)
                self._wanted.discard(doc)
            if len(wanted):  # documents packed before the save go to the queue only for what is left of them
                queued = ~np.isin(docs.rows, docs.rows[wanted]) | np.isin(
                    docs.rows, np.fromiter(self._carried, np.int64, len(self._carried)))
                docs = docs.take(np.flatnonzero(queued))
        if self._carried and len(docs):
            mine = {doc: spans for doc in docs.rows.tolist() if (spans := self._carried.get(doc)) is not None}
            if mine:  # a new dict, not a changed one: a position taken before may hold the old
                self._carried = {doc: spans for doc, spans in self._carried.items() if doc not in mine}
                docs = cut_pieces(docs, mine)
        return docs

    # -- positions -----------------------------------------------------------------------------------------------

    @property
    def restoring(self) -> bool:
        """A restore still waits for documents to be read again."""
        return self._saved_rows is not None

    def snapshot(self, buffered: Callable[[], np.ndarray], between: bool = False) -> Callable[[], dict[str, Any]]:
        """This source's part of a position taken now (see the module's documentation), made when called.

        Taking it costs a few attribute reads while the reader delivered no new batch: the packer's mark shares its
        arrays, and everything it names is replaced, not changed, by later reads and packing.

        Args:
            buffered: the documents of this source in rows the loader holds now (its shuffling buffer).
            between: the pass ended: a restore starts the next one, so nothing held is kept.
        """
        if between:
            reader = self._state_later(_nothing_held)
            return lambda: {'reader': reader(), 'remaining': [], 'delivered': [], 'packer': {}}
        packer = self.packer
        mark = packer.mark()
        frame = self._frame
        if frame is None or frame.reads != self._reads or packer.queue.pieces > frame.held.pieces:
            frame = self._frame = self._new_frame(mark, buffered)
        return functools.partial(self._state_of, frame, mark, buffered)

    def _new_frame(self, mark: Any, buffered: Callable[[], np.ndarray]) -> _Frame:
        """The frame of now: the reader's position is taken again (it delivered a batch since the last one)."""
        view = self.packer.view(mark)
        arrived = np.fromiter(self._arrived, np.int64, len(self._arrived)) if self._arrived else None
        held = Held(view.queue.pieces, view.queue.held_rows, functools.partial(_others, view, buffered, arrived),
                    self._state_later)
        return _Frame(self._reads, held, self._carried, self._delivered, self._saved_rows, arrived)

    def _state_of(self, frame: _Frame, mark: Any, buffered: Callable[[], np.ndarray]) -> dict[str, Any]:
        """This source's part of the position taken at ``mark``, made (see the module's documentation)."""
        view = self.packer.view(mark)
        remaining = {doc: list(spans) for doc, spans in frame.carried.items()}
        view.partial(remaining)
        gone = frame.held.delivered_since(view.queue.pieces, _others(view, buffered, frame.arrived))
        return {'reader': frame.held.reader, 'remaining': _entries(remaining),
                'delivered': merged_runs(frame.delivered, gone).tolist(),
                'packer': frame.saved_rows if frame.saved_rows is not None else view.listed()}

    def restore(self, state: dict[str, Any], buffered_docs: set[int], in_progress: bool) -> None:
        """Continue from this source's saved part, on the same rank: the rows it names are rebuilt exactly.

        Args:
            state: what :meth:`state` saved.
            buffered_docs: documents of this source in the loader's saved rows (their tokens are needed too).
            in_progress: the position was saved in the middle of a pass.
        """
        self.source.restart(state['reader'], new_pass=not in_progress)
        self._reset_restore(ranges_of_entries(state.get('remaining')), merged_runs(state.get('delivered', [])))
        packed = dict(state.get('packer') or {})
        self._wanted = set(listed_ranges(packed.get('rows'), {}, False)) | set(
            listed_ranges([row[1:] for row in packed.get('open', ())], {}, False)) | set(buffered_docs)
        self._saved_rows = packed if self._wanted or packed else None
        self._frame = None

    def restore_elsewhere(self, reader_states: list[dict[str, Any]], remaining: Ranges, delivered: np.ndarray,
                          in_progress: bool) -> None:
        """Continue from the saved parts of every rank of another world size: only the ranges left are known."""
        self.source.restart(reader_states, new_pass=not in_progress)
        self._reset_restore(remaining, delivered)

    def _reset_restore(self, carried: Ranges, delivered: np.ndarray) -> None:
        self.packer.reset()
        self._delivered = delivered
        self._frame = None
        self._batches = None
        self._exhausted = False
        self._carried = carried
        self._saved_rows = None
        self._wanted = set()
        self._arrived = {}

    def read_saved(self) -> None:
        """Read until every document the restore's rows need was read again.

        Raises:
            RestoreError: the pass ended first: the position was saved on other data or options.
        """
        while self._wanted:
            docs = self._next_docs()
            if docs is None:
                raise RestoreError(f'{self.where}: the saved position names {len(self._wanted)} documents that the '
                                   f'reader did not deliver again (e.g. {sorted(self._wanted)[:3]}); restore it on '
                                   f'a loader made with the same data and arguments')
            self.packer.push(docs)

    def saved_tokens(self, doc: int) -> np.ndarray:
        """The tokens of a document read again for the restore."""
        return self._arrived[doc]

    def finish_restore(self) -> None:
        """Rebuild the packer's saved rows (after :meth:`read_saved`); the kept tokens are let go."""
        if self._saved_rows is not None:
            self.packer.restore(self._saved_rows, self.saved_tokens)
        self._saved_rows = None
        self._arrived = {}
        self._frame = None
