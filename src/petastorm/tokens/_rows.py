"""Packed rows and the arrays of a batch made of them.

A :class:`RowBlock` is a run of packed rows: their tokens (padded to one width) and their *segments*, the pieces
of documents each row holds, by where they start. Segments say everything a batch needs beside the tokens:
``position_ids`` count from 0 at the start of each segment (and at the start of the padding), labels leave out
the first token of each segment, ``document_ids`` and ``cu_seqlens`` number and bound them. They also say what a
saved position must name about rows not delivered yet (:func:`row_segments`).

:func:`batch_arrays` makes every array of a batch from a block at once, without a Python loop over tokens or rows.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petastorm.shuffle import ramps
from petastorm.tokens._documents import split_loss_mask
from petastorm.tokens._options import BatchSpec

__all__ = ['IGNORE_INDEX', 'ArrayPool', 'RowBlock', 'Segment', 'batch_arrays', 'block_of_rows', 'concat_blocks',
           'padding_rows', 'row_arrays', 'row_segments', 'slice_rows', 'take_rows', 'with_arrays']

#: The label of a token that is not predicted (padding, the first token of a segment): PyTorch's and Hugging Face's.
IGNORE_INDEX = -100

#: A segment as packers hand it over: ``(document, start in the document, its tokens)``.
Segment = tuple[int, int, np.ndarray]


@dataclass(frozen=True)
class RowBlock:
    """Rows of packed tokens.

    Attributes:
        tokens: int64 ``(rows, width)``; past a row's length it holds the padding token.
        lengths: int64 per row: its tokens that are not padding.
        seg_row: int64 per segment, ascending: the row it is in.
        seg_col: int64 per segment: where it starts in its row (each row's first segment starts at 0).
        seg_doc: int64 per segment: its document's number (the reader's row id).
        seg_start: int64 per segment: where it starts in its document's tokens.
        source: int64 per row: the source (of a mixture) it comes from; -1 for a row of padding only.
        arrays: the rows' arrays of a batch when made already (:func:`with_arrays`), rows first, or None.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    seg_row: np.ndarray
    seg_col: np.ndarray
    seg_doc: np.ndarray
    seg_start: np.ndarray
    source: np.ndarray
    arrays: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        """Tokens per row, padding included."""
        return int(self.tokens.shape[1])

    def seg_lengths(self) -> np.ndarray:
        """Tokens of each segment."""
        ends = np.empty(len(self.seg_row), dtype=np.int64)
        if len(ends):
            same_row = self.seg_row[1:] == self.seg_row[:-1]
            ends[:-1] = np.where(same_row, self.seg_col[1:], self.lengths[self.seg_row[:-1]])
            ends[-1] = self.lengths[self.seg_row[-1]]
        return ends - self.seg_col


def block_of_rows(rows: Sequence[Sequence[Segment]], width: int, pad_id: int, source: int) -> RowBlock:
    """A block of rows, each given as its segments in order (at most ``width`` tokens in all)."""
    count = len(rows)
    tokens = np.full((count, width), pad_id, dtype=np.int64)
    lengths = np.zeros(count, dtype=np.int64)
    seg_row: list[int] = []
    seg_col: list[int] = []
    seg_doc: list[int] = []
    seg_start: list[int] = []
    for index, segments in enumerate(rows):
        column = 0
        for doc, start, values in segments:
            stop = column + len(values)
            tokens[index, column:stop] = values
            seg_row.append(index)
            seg_col.append(column)
            seg_doc.append(doc)
            seg_start.append(start)
            column = stop
        lengths[index] = column
    return RowBlock(tokens, lengths, np.array(seg_row, dtype=np.int64), np.array(seg_col, dtype=np.int64),
                    np.array(seg_doc, dtype=np.int64), np.array(seg_start, dtype=np.int64),
                    np.full(count, source, dtype=np.int64))


def padding_rows(count: int, width: int, pad_id: int) -> RowBlock:
    """``count`` rows of padding only (to fill the last batch of a pass)."""
    empty = np.empty(0, dtype=np.int64)
    return RowBlock(np.full((count, width), pad_id, dtype=np.int64), np.zeros(count, dtype=np.int64), empty, empty,
                    empty, empty, np.full(count, -1, dtype=np.int64))


def concat_blocks(blocks: Sequence[RowBlock], width: int, pad_id: int) -> RowBlock:
    """The rows of every block, one after the other, padded to ``width``."""
    if len(blocks) == 1 and blocks[0].width == width:
        return blocks[0]
    tokens = [block.tokens if block.width == width else _widened(block.tokens, width, pad_id) for block in blocks]
    first_rows = np.cumsum([0] + [len(block) for block in blocks[:-1]])
    arrays = None
    known = [block.arrays for block in blocks if block.arrays is not None and block.width == width]
    if len(known) == len(blocks):
        arrays = {name: np.concatenate([one[name] for one in known]) for name in known[0]}
    return RowBlock(np.concatenate(tokens), np.concatenate([b.lengths for b in blocks]),
                    np.concatenate([b.seg_row + first for b, first in zip(blocks, first_rows, strict=True)]),
                    np.concatenate([b.seg_col for b in blocks]), np.concatenate([b.seg_doc for b in blocks]),
                    np.concatenate([b.seg_start for b in blocks]), np.concatenate([b.source for b in blocks]), arrays)


def slice_rows(block: RowBlock, start: int, stop: int) -> RowBlock:
    """Rows ``[start, stop)`` of a block (views of its arrays)."""
    first, last = block.seg_row.searchsorted((start, stop))
    arrays = None if block.arrays is None else {name: values[start:stop] for name, values in block.arrays.items()}
    return RowBlock(block.tokens[start:stop], block.lengths[start:stop], block.seg_row[first:last] - start,
                    block.seg_col[first:last], block.seg_doc[first:last], block.seg_start[first:last],
                    block.source[start:stop], arrays)


def _widened(tokens: np.ndarray, width: int, pad_id: int) -> np.ndarray:
    out = np.full((len(tokens), width), pad_id, dtype=np.int64)
    out[:, :tokens.shape[1]] = tokens
    return out


def take_rows(block: RowBlock, indices: np.ndarray) -> RowBlock:
    """Rows ``indices`` of a block, in that order."""
    indices = np.asarray(indices, dtype=np.int64)
    counts = np.bincount(block.seg_row, minlength=len(block))
    first = np.concatenate(([0], np.cumsum(counts)))
    picked_counts = counts[indices]
    new_first = np.concatenate(([0], np.cumsum(picked_counts)))
    gather = np.repeat(first[indices] - new_first[:-1], picked_counts) + np.arange(new_first[-1])
    arrays = None if block.arrays is None else {name: values[indices] for name, values in block.arrays.items()}
    return RowBlock(block.tokens[indices], block.lengths[indices],
                    np.repeat(np.arange(len(indices), dtype=np.int64), picked_counts), block.seg_col[gather],
                    block.seg_doc[gather], block.seg_start[gather], block.source[indices], arrays)


def row_segments(block: RowBlock) -> list[list[int]]:
    """Each row as ``[source, document, start, length, document, start, length, ...]`` (what a state keeps)."""
    lengths = block.seg_lengths()
    flat = np.column_stack((block.seg_doc, block.seg_start, lengths)).tolist()
    rows: list[list[int]] = [[int(source)] for source in block.source.tolist()]
    for row, segment in zip(block.seg_row.tolist(), flat, strict=True):
        rows[row].extend(segment)
    return rows


def batch_arrays(block: RowBlock, spec: BatchSpec) -> dict[str, np.ndarray]:
    """The arrays of a batch: ``input_ids``, ``position_ids`` and what ``spec`` asks for, all int64.

    ``labels`` (``'hf'``) are the input ids with :data:`IGNORE_INDEX` on padding and on the first token of every
    segment (a model shifts them, so that no token is predicted from another document); ``'shifted'`` puts at each
    position the next token of the same segment. ``cu_seqlens`` (int32, as flash-attention takes it) bounds every
    segment of the flattened batch, padding included as a segment of its own.
    """
    out = dict(block.arrays) if block.arrays is not None else row_arrays(block, spec)
    if spec.cu_seqlens:
        rows, width = block.tokens.shape
        starts, _ = _segment_starts(block)
        bounds = np.append(starts, rows * width).astype(np.int32)
        out['cu_seqlens'] = bounds
        out['max_seqlen'] = np.array(int(np.diff(bounds).max()) if len(bounds) > 1 else 0, dtype=np.int64)
    return out


def with_arrays(block: RowBlock, spec: BatchSpec, pool: ArrayPool | None = None) -> RowBlock:
    """The block with its rows' arrays made (so that batches cut from it are views of them), in ``pool``'s arrays
    when given."""
    return dataclasses.replace(block, arrays=row_arrays(block, spec, pool))


class ArrayPool:
    """Large arrays used again once nothing refers to them any more (their reference counts say so).

    A block's arrays reach the training loop as views (``torch.from_numpy`` of slices); once every batch cut from
    them is dropped, their memory is filled again for a later block instead of new memory being mapped, which costs
    more in page faults than filling it. An array someone still holds is never written.
    """

    def __init__(self, keep: int = 3) -> None:
        self._arrays: dict[str, list[np.ndarray]] = {}
        self._keep = keep

    def array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """An int64 array of ``shape`` for ``name``: a free one of the pool, or a new one (kept for later)."""
        arrays = self._arrays.setdefault(name, [])
        for index in range(len(arrays)):
            # Held only by the list and the call's argument: no block, view or tensor refers to it.
            if arrays[index].shape == shape and sys.getrefcount(arrays[index]) == _FREE_REFERENCES:
                return arrays[index]
        fresh = np.empty(shape, dtype=np.int64)
        arrays.append(fresh)
        if len(arrays) > self._keep:
            arrays.pop(0)  # still held outside: it lives on there, the pool lets it go
        return fresh


def _free_references() -> int:
    arrays = [np.empty(1)]
    return sys.getrefcount(arrays[0])


_FREE_REFERENCES = _free_references()


def row_arrays(block: RowBlock, spec: BatchSpec, pool: ArrayPool | None = None) -> dict[str, np.ndarray]:
    """The arrays of :func:`batch_arrays` that are rows first (all but ``cu_seqlens`` and ``max_seqlen``)."""
    tokens = block.tokens
    rows, width = tokens.shape
    starts, is_padding = _segment_starts(block)
    sizes = np.empty(len(starts), dtype=np.int64)
    sizes[:-1] = starts[1:] - starts[:-1]
    sizes[-1:] = rows * width - starts[-1:]
    padded = np.flatnonzero(block.lengths < width).tolist() if is_padding.any() else []

    def new(name: str) -> np.ndarray:
        return np.empty((rows, width), dtype=np.int64) if pool is None else pool.array(name, (rows, width))

    no_label = None
    if spec.loss_mask:  # tokens left out of the loss come as ~id
        tokens, no_label = split_loss_mask(tokens)
    out = {'input_ids': tokens, 'position_ids': ramps(new('position_ids'), starts)}
    if spec.labels is not None:
        out['labels'] = _labels(new('labels'), tokens, starts, spec.labels, no_label)
    if spec.attention_mask:
        out['attention_mask'] = new('attention_mask')
        out['attention_mask'].fill(1)
    if spec.document_ids:
        first_of_row = np.searchsorted(starts, starts - starts % width)  # each segment's row's first segment
        numbers = np.where(is_padding, -1, np.arange(len(starts)) - first_of_row)
        out['document_ids'] = np.repeat(numbers, sizes).reshape(rows, width)
    for row in padded:  # what follows a row's last token predicts nothing and is not attended to
        length = int(block.lengths[row])
        if 'labels' in out:
            out['labels'][row, max(length - (spec.labels == 'shifted'), 0):] = IGNORE_INDEX
        if 'attention_mask' in out:
            out['attention_mask'][row, length:] = 0
    return out




def _segment_starts(block: RowBlock) -> tuple[np.ndarray, np.ndarray]:
    """Where every segment of the flattened batch starts (the padding of a row is one), and which are padding."""
    width = block.width
    starts = block.seg_row * width + block.seg_col
    padded = np.flatnonzero(block.lengths < width)
    if not len(padded):
        return starts, np.zeros(len(starts), dtype=bool)
    all_starts = np.concatenate((starts, padded * width + block.lengths[padded]))
    order = np.argsort(all_starts, kind='stable')
    return all_starts[order], order >= len(starts)


def _labels(out: np.ndarray, tokens: np.ndarray, starts: np.ndarray, style: str,
            no_label: np.ndarray | None) -> np.ndarray:
    """``'hf'``: the tokens, a segment's first one ignored; ``'shifted'``: the next token, a segment's last one
    ignored (padding is marked by the caller); either way, ignored where the label is a token of ``no_label``."""
    width = tokens.shape[1]
    flat = out.reshape(-1)
    if style == 'hf':
        np.copyto(out, tokens)
        if no_label is not None:
            out[no_label] = IGNORE_INDEX
        flat[starts] = IGNORE_INDEX
    else:
        out[:, :-1] = tokens[:, 1:]
        if no_label is not None:
            out[:, :-1][no_label[:, 1:]] = IGNORE_INDEX
        out[:, -1] = IGNORE_INDEX
        flat[starts[starts % width != 0] - 1] = IGNORE_INDEX
    return out
