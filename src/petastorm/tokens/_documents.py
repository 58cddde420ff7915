"""Documents as the packers take them: the tokens of many documents in one array, cut by offsets.

A reader's batch holds one document per row: a list column of token ids (Arrow's values and offsets, as
:class:`~petastorm.columns.ListColumn` gives them), a fixed-length array column, or what the tokenizing transform
made of a text column. :func:`documents_of` turns it into :class:`Docs` without a Python object per document: the
token ids of every document one after the other, with ``bos_id``/``eos_id`` inserted around each, and the
document's number (the reader's ``row_ids``) beside it.

A document's *tokens* are that sequence (with ``bos_id``/``eos_id``); a *piece* is a range of them. A saved
position names what is left of a partly delivered document by its pieces, and :func:`cut_pieces` makes them of the
document when it is read again.

**Tokens left out of the loss** (supervised fine-tuning: a prompt before its response, or a ``loss_mask_field``
column of 0/1 per token) travel as the complement of their id (``~id``, a negative number), so that the queue,
every packer and a restore carry them as any other token; :func:`split_loss_mask` turns a block's tokens back into
ids and the mask of tokens without a label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from petastorm.columns import Column, ListColumn, MaskedColumn
from petastorm.errors import SchemaError
from petastorm.tokens._options import PackSpec

__all__ = [
    'Docs',
    'DocumentFields',
    'TokenColumnError',
    'after_prompts',
    'cut_pieces',
    'documents_of',
    'empty_docs',
    'split_loss_mask',
    'without_loss',
]


class TokenColumnError(SchemaError):
    """The token column holds something other than lists of integers (a ``ValueError``)."""


@dataclass(frozen=True)
class Docs:
    """Pieces of documents, their tokens one after the other.

    Attributes:
        values: the tokens of every piece (an integer array).
        bounds: int64, one more than the pieces: piece ``i`` is ``values[bounds[i]:bounds[i + 1]]``.
        rows: int64 per piece: its document's number (the reader's row id).
        starts: int64 per piece: where it starts in its document's tokens.
        whole: bool per piece: the piece is its whole document.
    """

    values: np.ndarray
    bounds: np.ndarray
    rows: np.ndarray
    starts: np.ndarray
    whole: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each piece."""
        return np.diff(self.bounds)

    def tokens(self, index: int) -> np.ndarray:
        """The tokens of piece ``index``."""
        return self.values[self.bounds[index]:self.bounds[index + 1]]

    def take(self, indices: np.ndarray) -> Docs:
        """Pieces ``indices`` (in that order, ascending for a cheap copy)."""
        if len(indices) == len(self) and np.array_equal(indices, np.arange(len(self))):
            return self
        lengths = self.lengths[indices]
        bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        gather = np.repeat(self.bounds[:-1][indices] - bounds[:-1], lengths) + np.arange(bounds[-1])
        return Docs(self.values[gather], bounds, self.rows[indices], self.starts[indices], self.whole[indices])


def empty_docs(dtype: np.dtype | type = np.int64) -> Docs:
    """Docs without pieces."""
    return Docs(np.empty(0, dtype=dtype), np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int64),
                np.empty(0, dtype=np.int64), np.empty(0, dtype=bool))


@dataclass(frozen=True)
class DocumentFields:
    """The columns a document is made of.

    Attributes:
        tokens: the token ids (or the tokenizing transform's column).
        prompt: token ids put before each row's ``tokens`` and left out of the loss (pre-tokenized prompts).
        loss_mask: one 0/1 per token of ``tokens``: 0 leaves the token out of the loss.
    """

    tokens: str
    prompt: str | None = None
    loss_mask: str | None = None

    @property
    def names(self) -> list[str]:
        """Every column read."""
        return [name for name in (self.tokens, self.prompt, self.loss_mask) if name is not None]


def without_loss(values: np.ndarray) -> np.ndarray:
    """Token ids marked as left out of the loss (``~id``; a signed type)."""
    signed = values if values.dtype.kind == 'i' else values.astype(np.int64)
    return np.invert(signed)


def split_loss_mask(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, no_label)`` of tokens some of which are marked by :func:`without_loss`."""
    no_label = tokens < 0
    return np.bitwise_xor(tokens, tokens >> (tokens.dtype.itemsize * 8 - 1)), no_label


def documents_of(columns: Mapping[str, Column], row_ids: np.ndarray, pack: PackSpec,
                 fields: DocumentFields) -> Docs:
    """The documents of one batch, with ``bos_id``/``eos_id`` around each.

    Empty documents without an added token have nothing to deliver and are left out.

    Raises:
        TokenColumnError: a column is not lists of integers, holds null tokens, or a loss mask does not match its
            tokens.
    """
    values, offsets = _values_and_offsets(columns[fields.tokens], fields.tokens)
    if fields.loss_mask is not None:
        values = _masked(values, offsets, columns[fields.loss_mask], fields)
    if fields.prompt is not None:
        values, offsets = after_prompts(_values_and_offsets(columns[fields.prompt], fields.prompt), values, offsets)
    if pack.added_tokens:
        values, offsets = _with_boundaries(values, offsets, pack)
    bounds = np.asarray(offsets, dtype=np.int64)
    rows = np.asarray(row_ids, dtype=np.int64)
    docs = Docs(values, bounds, rows, np.zeros(len(rows), dtype=np.int64), np.ones(len(rows), dtype=bool))
    lengths = docs.lengths
    if len(lengths) and not lengths.all():
        docs = docs.take(np.flatnonzero(lengths))
    return docs


def _values_and_offsets(column: Column, field: str, kinds: str = 'iu') -> tuple[np.ndarray, np.ndarray]:
    """The token ids of every row one after the other, and the int64 offsets where each row's start."""
    if isinstance(column, ListColumn):
        column = column.normalized()
        values = column.values
        if isinstance(values, MaskedColumn):
            if not values.valid.all():
                raise TokenColumnError(f'the token column {field!r} holds null token ids; fill or drop them before '
                                       f'training')
            values = values.values
        if not isinstance(values, np.ndarray) or values.ndim != 1:
            raise TokenColumnError(f'the token column {field!r} holds nested lists; it must be one list of integer '
                                   f'token ids per row')
        _check_integers(values, field, kinds)
        return values, column.offsets  # a null row (valid False) holds no elements: an empty document
    if isinstance(column, np.ndarray) and column.dtype == object:
        return _from_objects(column, field, kinds)
    if isinstance(column, np.ndarray) and column.ndim == 2:
        _check_integers(column, field, kinds)
        rows, width = column.shape
        return np.ascontiguousarray(column).reshape(-1), np.arange(rows + 1, dtype=np.int64) * width
    kind = column.dtype if isinstance(column, np.ndarray) else type(column).__name__
    raise TokenColumnError(f'the token column {field!r} holds {kind} values, one per row; it must hold a list of '
                           f'integer token ids per row (for a text column pass text_field= and a tokenizer)')


def _masked(values: np.ndarray, offsets: np.ndarray, column: Column, fields: DocumentFields) -> np.ndarray:
    """``values`` with the tokens whose mask is 0 marked as left out of the loss."""
    mask, mask_offsets = _values_and_offsets(column, fields.loss_mask or '', kinds='iub')
    offsets, mask_offsets = np.asarray(offsets, dtype=np.int64), np.asarray(mask_offsets, dtype=np.int64)
    if not np.array_equal(np.diff(offsets), np.diff(mask_offsets)):
        row = int(np.flatnonzero(np.diff(offsets) != np.diff(mask_offsets))[0])
        given, tokens = int(mask_offsets[row + 1] - mask_offsets[row]), int(offsets[row + 1] - offsets[row])
        raise TokenColumnError(f'loss_mask_field={fields.loss_mask!r} has {given} values in a row whose '
                               f'tokens_field={fields.tokens!r} has {tokens} tokens; it must hold one 0/1 per token')
    keep = np.ones(len(values), dtype=bool)
    keep[offsets[0]:offsets[-1]] = mask[mask_offsets[0]:mask_offsets[-1]] != 0
    if keep.all():
        return values
    signed = values if values.dtype.kind == 'i' else values.astype(np.int64)
    return np.where(keep, signed, without_loss(signed))


def after_prompts(prompts: tuple[np.ndarray, np.ndarray], values: np.ndarray,
                   offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's prompt (left out of the loss) followed by its tokens, as one document per row."""
    prompt_values, prompt_offsets = prompts
    prompt_offsets, offsets = np.asarray(prompt_offsets, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
    prompt_lengths, lengths = np.diff(prompt_offsets), np.diff(offsets)
    bounds = np.concatenate(([0], np.cumsum(prompt_lengths + lengths)))
    dtype = np.result_type(prompt_values.dtype, values.dtype, np.int32)
    if dtype.kind != 'i':
        dtype = np.dtype(np.int64)
    out = np.empty(int(bounds[-1]), dtype=dtype)
    in_prompt = np.repeat(bounds[:-1], prompt_lengths) + _ranks(prompt_lengths)
    in_tokens = np.repeat(bounds[:-1] + prompt_lengths, lengths) + _ranks(lengths)
    out[in_prompt] = without_loss(prompt_values[prompt_offsets[0]:prompt_offsets[-1]].astype(dtype, copy=False))
    out[in_tokens] = values[offsets[0]:offsets[-1]]
    return out, bounds


def _ranks(lengths: np.ndarray) -> np.ndarray:
    """``0..n-1`` for each length ``n``, one after the other."""
    total = int(lengths.sum())
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


def _from_objects(column: np.ndarray, field: str, kinds: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the tokenizing transform: one int array per row (or None)."""
    arrays = [np.empty(0, dtype=np.int32) if row is None else np.asarray(row) for row in column]
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    values = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int32)
    _check_integers(values, field, kinds)
    return values, np.concatenate(([0], np.cumsum(lengths)))


def _check_integers(values: np.ndarray, field: str, kinds: str = 'iu') -> None:
    if values.dtype.kind not in kinds and not (values.size == 0 and values.dtype == object):
        raise TokenColumnError(f'the token column {field!r} holds {values.dtype} values; token ids must be integers '
                               f'(cast the column to a list of int32 or int64, or pass text_field= with a tokenizer '
                               f'for text)')


def _with_boundaries(values: np.ndarray, offsets: np.ndarray, pack: PackSpec) -> tuple[np.ndarray, np.ndarray]:
    """``bos_id`` before and ``eos_id`` after every document, in one pass over the tokens."""
    offsets = np.asarray(offsets, dtype=np.int64)
    count = len(offsets) - 1
    added = pack.added_tokens
    new_offsets = offsets + np.arange(count + 1, dtype=np.int64) * added
    largest = max(pack.bos_id or 0, pack.eos_id or 0)
    dtype = values.dtype if values.dtype.kind in 'iu' and largest <= np.iinfo(values.dtype).max else np.int64
    out = np.empty(int(new_offsets[-1]), dtype=dtype)
    keep = np.ones(len(out), dtype=bool)
    if pack.bos_id is not None:
        out[new_offsets[:-1]] = pack.bos_id
        keep[new_offsets[:-1]] = False
    if pack.eos_id is not None:
        out[new_offsets[1:] - 1] = pack.eos_id
        keep[new_offsets[1:] - 1] = False
    out[keep] = values[offsets[0]:offsets[-1]] if count else values[:0]
    return out, new_offsets


def cut_pieces(docs: Docs, remaining: Mapping[int, Sequence[tuple[int, int]]]) -> Docs:
    """``docs`` with each document named in ``remaining`` replaced by the pieces of it listed there.

    Ranges past a document's end are clipped (a shorter document than the saved one cannot deliver more).
    """
    if not remaining or not len(docs):
        return docs
    named = np.isin(docs.rows, np.fromiter(remaining, dtype=np.int64, count=len(remaining)))
    if not named.any():
        return docs
    lengths = docs.lengths
    plain = np.flatnonzero(~named)
    indices: list[np.ndarray] = [plain]
    starts: list[np.ndarray] = [np.zeros(len(plain), dtype=np.int64)]
    stops: list[np.ndarray] = [lengths[plain]]
    for index in np.flatnonzero(named).tolist():
        length = int(lengths[index])
        for first, last in remaining[int(docs.rows[index])]:
            first, last = min(int(first), length), min(int(last), length)
            if first < last:
                indices.append(np.array([index]))
                starts.append(np.array([first], dtype=np.int64))
                stops.append(np.array([last], dtype=np.int64))
    piece_doc = np.concatenate(indices)
    piece_start = np.concatenate(starts)
    order = np.lexsort((piece_start, piece_doc))  # documents in their order, a document's pieces in theirs
    index, start = piece_doc[order], piece_start[order]
    size = np.concatenate(stops)[order] - start
    bounds = np.concatenate(([0], np.cumsum(size))).astype(np.int64)
    gather = np.repeat(docs.bounds[:-1][index] + start - bounds[:-1], size) + np.arange(bounds[-1])
    whole = (start == 0) & (size == lengths[index])
    return Docs(docs.values[gather], bounds, docs.rows[index], start, whole)
