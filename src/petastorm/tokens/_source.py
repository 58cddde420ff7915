"""Documents by their number: a random-access source for Grain (``grain.MapDataset.source``).

:class:`DocumentSource` answers ``len()`` and ``source[i]`` (the ``grain.sources.RandomAccessDataSource``
protocol): record ``i`` is the ``i``-th row of the dataset in file order (row groups in the order the store lists
them), as a dict holding its token ids (``bos_id``/``eos_id`` added) and, for supervised fine-tuning, which of them
count in the loss. Grain then shuffles, shards, packs (``grain.experimental.ConcatThenSplitIterDataset``,
``FirstFitPackIterDataset``) and checkpoints by record numbers, as it does any random-access source.

Parquet is read a row group at a time, so a record is served from its row group read whole (the token column
only; text tokenized there, in one batch) and kept in a small cache of the last row groups read. Reading records
in file order, or shuffled within windows of a few row groups (``grain.experimental.WindowShuffleMapDataset``),
reads every row group once; a global shuffle reads a row group for almost every record, which is what random
access to Parquet costs.

The source is made by the reader's own planning (any store a reader opens: local, the clouds, Delta and Iceberg
tables) and pickles without its cache, so that Grain's worker processes each keep their own.
"""

from __future__ import annotations

import collections
import operator
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from petastorm._describe import describe_urls
from petastorm.plan import ScheduledItem, WorkItem
from petastorm.reading.worker import ReadContext, read_item
from petastorm.tokens._documents import DocumentFields, documents_of, split_loss_mask
from petastorm.tokens._options import PackSpec

__all__ = ['DocumentSource']


class _RowGroupDocs:
    """The documents of one row group: every row's tokens, by the row's place in the row group."""

    def __init__(self, values: np.ndarray, bounds: np.ndarray) -> None:
        self.values = values
        self.bounds = bounds  # row r is values[bounds[r]:bounds[r + 1]] (an empty document: an empty range)

    def tokens(self, row: int) -> np.ndarray:
        return self.values[self.bounds[row]:self.bounds[row + 1]]


class DocumentSource:
    """The documents of a dataset by number, for ``grain.MapDataset.source`` (see the module's documentation);
    made by :func:`petastorm.tokens.make_document_source`.

    ``source[i]`` is a dict: ``input_ids`` (int64, the document's tokens with ``bos_id``/``eos_id``), and with
    ``prompt_field`` or ``loss_mask_field`` also ``loss_mask`` (int32, 1 where the token counts in the loss, 0
    where it is a prompt token or marked 0).

    Args:
        context: what reading a row group needs (the reader's, with the document columns and any tokenizer).
        fields: the columns a document is made of.
        pack: the tokens added around each document.
        url: the dataset, as messages name it.
        cached_row_groups: row groups kept decoded at once.
    """

    def __init__(self, context: ReadContext, fields: DocumentFields, pack: PackSpec, url: Any,
                 cached_row_groups: int) -> None:
        self._context = context
        self._fields = fields
        self._pack = pack
        self._url = url
        self._capacity = cached_row_groups
        sizes = np.fromiter((piece.num_rows for piece in context.pieces), np.int64, len(context.pieces))
        self._starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self._reset_cache()

    def _reset_cache(self) -> None:
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[int, _RowGroupDocs] = collections.OrderedDict()
        self._reading: dict[int, Future[_RowGroupDocs]] = {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, record_key: Any) -> dict[str, np.ndarray]:
        index = self._index(record_key)
        piece = int(np.searchsorted(self._starts, index, side='right')) - 1
        tokens = self._row_group(piece).tokens(index - int(self._starts[piece]))
        if self._fields.prompt is None and self._fields.loss_mask is None:
            return {'input_ids': tokens.astype(np.int64)}
        ids, no_label = split_loss_mask(tokens)
        return {'input_ids': ids.astype(np.int64), 'loss_mask': (~no_label).astype(np.int32)}

    def _index(self, record_key: Any) -> int:
        try:
            index = operator.index(record_key)
        except TypeError:
            raise TypeError(f'a DocumentSource is indexed by a record number (an integer), got '
                            f'{type(record_key).__name__} {record_key!r}') from None
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f'record {record_key} is out of range: {describe_urls(self._url)} has {size} documents')
        return index

    # -- the cache of row groups ------------------------------------------------------------------------------------

    def _row_group(self, piece: int) -> _RowGroupDocs:
        """The documents of row group ``piece``: cached, being read by another thread (waited for), or read now."""
        with self._lock:
            cached = self._cache.get(piece)
            if cached is not None:
                self._cache.move_to_end(piece)
                return cached
            pending = self._reading.get(piece)
            mine = pending is None
            if pending is None:
                pending = self._reading[piece] = Future()
        if not mine:
            return pending.result()
        try:
            docs = self._read(piece)
        except BaseException as err:
            with self._lock:
                del self._reading[piece]
            pending.set_exception(err)
            raise
        with self._lock:
            del self._reading[piece]
            self._cache[piece] = docs
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        pending.set_result(docs)
        return docs

    def _read(self, piece: int) -> _RowGroupDocs:
        """Row group ``piece`` read whole (its documents' columns), tokenized when the documents are text."""
        num_rows = self._context.pieces[piece].num_rows
        batch = read_item(self._context, ScheduledItem(WorkItem(piece, 0, num_rows), 0, 0))
        docs = documents_of(batch.columns, np.arange(batch.num_rows, dtype=np.int64), self._pack, self._fields)
        lengths = np.zeros(num_rows, dtype=np.int64)
        lengths[docs.rows] = docs.lengths  # documents_of leaves out empty documents: they keep no tokens
        bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        return _RowGroupDocs(docs.values, bounds)

    # -- pickling: Grain's worker processes each read into their own cache -----------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ('_lock', '_cache', '_reading'):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_cache()

    def __repr__(self) -> str:
        return (f'DocumentSource({describe_urls(self._url)}, {len(self)} documents in {len(self._starts) - 1} row '
                f'groups, tokens from {self._fields.tokens!r})')
