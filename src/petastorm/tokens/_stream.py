"""Passes of token batches: the rows of every source, mixed, shuffled and cut into batches, and their position.

:class:`TokenStream` is what the torch loader and the Grain dataset share. Its rules for passes are the loaders'
(:class:`petastorm.reading.BatchStream`): each ``iter()`` starts a pass (the readers' next ``num_epochs`` epochs),
unless the sources are endless (``num_epochs=None``), where it continues; an older iterator is superseded. With
``steps_per_epoch`` an ``iter()`` hands out the batches up to the next multiple of it (counted from the start of
the pass, so a restored loader ends the epoch where the saved one would have), and the next one continues. A pass
ends when its single source has nothing left, or when a mixture draws a source that has nothing left (as
:class:`~petastorm.weighted_sampling_reader.WeightedSamplingReader` does), or when :meth:`TokenStream.end_pass`
says so (every rank of a distributed run ending at the same step). The stream knows a pass ended when it hands
out its last batch, so a position saved after it is between passes.

A batch is ``batch_size`` rows (``max_tokens // seq_len`` with a token budget), the last one of a pass filled with
rows of padding; with ``packing='none'`` and ``max_tokens`` it is as many rows as fit in the budget at the width of
its longest row. Rows come from the sources in the mixture's draws, through a buffer of ``shuffle_buffer`` rows
drawn at random when asked.

The position (:mod:`petastorm.tokens._state`; taken and restored by :mod:`petastorm.tokens._positions`) counts the
draws made, so that the same draws follow a restore; the rows in the buffer are saved by the ranges of documents
they hold.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.tokens._draws import Mixture, generator
from petastorm.tokens._feed import Feed
from petastorm.tokens._options import TokenOptions
from petastorm.tokens._packers import ConcatPacker
from petastorm.tokens._positions import Counters, StreamPositions
from petastorm.tokens._rows import (
    RowBlock,
    batch_arrays,
    concat_blocks,
    padding_rows,
    row_segments,
    slice_rows,
    take_rows,
    with_arrays,
)

__all__ = ['TokenStream']

_SUPERSEDED = ('this iterator of the {name} was superseded by a newer iter() of the same loader, which continues '
               'its pass; iterate the newest one')
_MIXTURE_STREAM, _SHUFFLE_STREAM = 0, 1  # the keys of the mixture's and the shuffle's draws


@dataclass
class _Pass:
    batches: Generator[dict[str, np.ndarray], None, None]
    delivered: int = 0
    complete: bool = False
    broken: bool = False


class TokenStream(StreamPositions):
    """Token batches of one or more sources (see the module's documentation).

    Args:
        feeds: one feed per source.
        options: the loader's options.
        name: how the loader is named in messages.
    """

    def __init__(self, feeds: Sequence[Feed], options: TokenOptions, name: str) -> None:
        self.feeds = list(feeds)
        self.options = options
        self.pack, self.spec = options.pack, options.batch
        self.name = name
        read = options.read
        self._mixture = Mixture(read.weights, len(self.feeds), read.seed) if read.weights is not None else None
        first = self.feeds[0].positions.state_dict()
        self.shard, self.shard_count = int(first['shard']), int(first['shard_count'])
        for feed in self.feeds:
            if isinstance(feed.packer, ConcatPacker):  # its rows are cut ahead: their arrays are made together
                feed.packer.prepare = functools.partial(with_arrays, spec=self.spec)
        self._counts = Counters(tokens=[0] * len(self.feeds))
        # Single rows with their segments as a position keeps them: the shuffle's buffer, or a row put back.
        self._buffer: list[tuple[RowBlock, list[int]]] = []
        self._saved_rows: list[list[int]] | None = None  # the buffer's rows of a restore, until rebuilt
        self._restoring = False  # a restore on the same ranks may still read its rows' documents again
        self._taking = False  # state_dict() was called since the last batch
        self._taken: Callable[[], dict[str, Any]] | None = None  # the position after the last batch, taken with it
        self._mixture_ended = False
        self._pass: _Pass | None = None
        self._restart = False
        self._token = 0
        self.error: BaseException | None = None

    # -- what loaders ask ----------------------------------------------------------------------------------------

    @property
    def endless(self) -> bool:
        """Every source is endless (``num_epochs=None``): a new iteration continues the pass."""
        return all(feed.source.info.endless for feed in self.feeds)

    @property
    def rows_per_batch(self) -> int | None:
        """Rows of every batch, or None when a token budget decides per batch (``packing='none'``)."""
        if self.spec.batch_size is not None:
            return self.spec.batch_size
        assert self.spec.max_tokens is not None
        return None if self.pack.packing == 'none' else self.spec.max_tokens // self.pack.seq_len

    def num_batches(self) -> int | None:
        """Batches of an epoch: ``steps_per_epoch`` (at most), or those of a pass when known in advance (one
        document per row, cut, a fixed batch size)."""
        if self.spec.steps_per_epoch is not None:
            return self.spec.steps_per_epoch
        rows = self.feeds[0].source.num_rows_per_pass
        batch = self.rows_per_batch
        if (rows is None or batch is None or len(self.feeds) > 1 or self.pack.packing != 'none'
                or self.pack.long_documents == 'split'):
            return None
        return -(-rows // batch)

    def stats(self) -> dict[str, Any]:
        """Counts for logging: tokens delivered per source, padding, truncated tokens, steps and passes."""
        truncated = sum(getattr(feed.packer, 'truncated_tokens', 0) for feed in self.feeds)
        return {'tokens': list(self._counts.tokens), 'padding_tokens': self._counts.padding,
                'tokens_truncated': truncated, 'steps': self._counts.steps, 'total_steps': self._counts.total_steps,
                'passes_done': self._counts.passes_done}

    def end_pass(self) -> None:
        """End the pass being read now (what it still holds is left out); the next ``iter()`` starts another."""
        if self._pass is not None:
            self._pass.complete = True

    # -- passes --------------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.error is not None:
            raise RuntimeError(f'Cannot start a new iteration because last time iteration failed with error '
                               f'{self.error!r}.')
        current = self._pass
        continues = self.endless or self.spec.steps_per_epoch is not None
        if current is not None and current.broken and not current.complete and continues:
            self.load_state_dict(self.state_dict())  # an interrupt went through the pass: continue from its position
        elif current is not None and (current.complete or
                                      ((current.delivered or current.broken) and not continues)):
            self._close_pass()
        if self._pass is None:
            self._start_pass()
        self._token += 1
        return self._serve(self._token)

    def _close_pass(self) -> None:
        self._taken = None
        if self._pass is not None:
            self._pass.batches.close()
        self._pass = None
        self._counts.passes_done += 1
        self._restart = True

    def _start_pass(self) -> None:
        self._taken = None
        if self._restart:
            for feed in self.feeds:
                feed.new_pass(restart=True)
            self._new_pass_counters()
        self._restart = False
        self._pass = _Pass(self._batches())

    def _new_pass_counters(self) -> None:
        counts = self._counts
        counts.steps = counts.draws = counts.picks = 0
        self._buffer = []
        self._mixture_ended = False

    def _serve(self, token: int) -> Iterator[dict[str, np.ndarray]]:
        epoch = self.spec.steps_per_epoch
        served = 0
        while not (epoch is not None and served and self._counts.steps % epoch == 0):
            current = self._pass
            if token != self._token:
                if current is None or current.complete:
                    return
                raise RuntimeError(_SUPERSEDED.format(name=self.name))
            if current is None or current.complete:
                return
            try:
                batch = next(current.batches)
            except StopIteration:
                current.complete = True
                return
            except Exception as err:
                self.error = err
                raise
            except BaseException:
                current.broken = True
                raise
            current.delivered += 1
            served += 1
            yield batch

    def _batches(self) -> Generator[dict[str, np.ndarray], None, None]:
        if self._saved_rows is not None or any(feed.restoring for feed in self.feeds):
            self._finish_restore()
        self._restoring = False
        while True:
            block = self._next_block()
            if block is None:
                return
            batch = self._finish_batch(block)
            if not self._has_more() and self._pass is not None:
                self._pass.complete = True  # a position saved now is between passes
            self._taken = None
            if self._taking and not (self._pass is not None and self._pass.complete):
                self._taking = False  # state_dict() was called since the last batch: it will be after this one
                self._taken = self._take(False)
            yield batch

    # -- rows ----------------------------------------------------------------------------------------------------

    @property
    def _key(self) -> list[int]:
        counts = self._counts
        return [self.shard, self.shard_count, counts.generation, counts.passes_done]

    def _next_block(self) -> RowBlock | None:
        """The rows of the next batch (padded to a whole batch), or None when the pass has no row left."""
        rows = self.rows_per_batch
        if rows is None:
            return self._budget_block()
        blocks = self._shuffled(rows) if self.spec.shuffle_buffer else [self._draw(rows)]
        present = [block for block in blocks if block is not None and len(block)]
        if not present:
            return None
        got = sum(len(block) for block in present)
        if got < rows:
            present.append(padding_rows(rows - got, self.pack.seq_len, self.pack.pad_id))
        return concat_blocks(present, self.pack.seq_len, self.pack.pad_id)

    def _draw(self, count: int) -> RowBlock | None:
        """``count`` rows of the sources in the mixture's draws (fewer when the pass ends)."""
        if self._mixture is None:
            return self.feeds[0].rows(count)
        if self._mixture_ended:
            return None
        counts = self._counts
        chosen = self._mixture.sources([*self._key, _MIXTURE_STREAM], counts.draws, count, counts.total_steps)
        counts.draws += count
        wanted = np.bincount(chosen, minlength=len(self.feeds))
        blocks = {index: self.feeds[index].rows(int(number)) for index, number in enumerate(wanted.tolist())
                  if number}
        got = {index: 0 if block is None else len(block) for index, block in blocks.items()}
        short = [index for index, number in got.items() if number < wanted[index]]
        if short:  # a source ran out: the mixture ends at the first draw that found it empty
            self._mixture_ended = True
            cut = min(int(np.flatnonzero(chosen == index)[got[index]]) for index in short)
            chosen = chosen[:cut]
        if not len(chosen):
            return None
        return _interleaved(chosen, blocks, self.pack.seq_len, self.pack.pad_id)

    def _fill_buffer(self, extra: int) -> None:
        capacity = self.spec.shuffle_buffer + extra
        while len(self._buffer) < capacity:
            block = self._draw(min(capacity - len(self._buffer), max(extra, 1)))
            if block is None or not len(block):
                return
            self._buffer = self._buffer + _single_rows(block)  # a new list: a position taken may hold the old

    def _shuffled(self, count: int) -> list[RowBlock | None]:
        """``count`` rows drawn at random from the buffer (refilled first)."""
        self._fill_buffer(count)
        if not self._buffer:
            return []
        counts = self._counts
        rng = generator(self.options.read.seed, [*self._key, _SHUFFLE_STREAM, counts.picks])
        counts.picks += 1
        picked = rng.choice(len(self._buffer), size=min(count, len(self._buffer)), replace=False)
        chosen = set(picked.tolist())
        rows: list[RowBlock | None] = [self._buffer[index][0] for index in picked.tolist()]
        self._buffer = [row for index, row in enumerate(self._buffer) if index not in chosen]
        return rows

    def _next_row(self) -> RowBlock | None:
        if self.spec.shuffle_buffer:
            rows = self._shuffled(1)
            return rows[0] if rows else None
        if self._buffer:
            first, self._buffer = self._buffer[0], self._buffer[1:]
            return first[0]
        return self._draw(1)

    def _budget_block(self) -> RowBlock | None:
        """As many rows as fit in ``max_tokens`` at the width of the longest (``packing='none'``)."""
        budget = self.spec.max_tokens
        assert budget is not None
        rows: list[RowBlock] = []
        width = 0
        while True:
            row = self._next_row()
            if row is None:
                break
            wider = max(width, int(row.lengths[0]))
            if rows and (len(rows) + 1) * wider > budget:
                self._buffer = [*_single_rows(row), *self._buffer]  # it opens the next batch
                break
            rows.append(row)
            width = wider
        if not rows:
            return None
        block = concat_blocks(rows, self.pack.seq_len, self.pack.pad_id)
        return RowBlock(np.ascontiguousarray(block.tokens[:, :width]), block.lengths, block.seg_row, block.seg_col,
                        block.seg_doc, block.seg_start, block.source)

    def _has_more(self) -> bool:
        """The pass has another row to give (reading ahead into the queues if needed)."""
        if self._buffer:
            return True
        if self._mixture is None:
            return self.feeds[0].has_more()
        if self._mixture_ended:
            return False
        counts = self._counts
        first = int(self._mixture.sources([*self._key, _MIXTURE_STREAM], counts.draws, 1, counts.total_steps)[0])
        return self.feeds[first].has_more()

    def _finish_batch(self, block: RowBlock) -> dict[str, np.ndarray]:
        counts = self._counts
        delivered = int(block.lengths.sum())  # a row of padding only has none
        if len(self.feeds) == 1:
            counts.tokens = [counts.tokens[0] + delivered]  # a new list: a position taken before holds the old
        else:
            real = block.source >= 0
            per_source = np.bincount(block.source[real], weights=block.lengths[real], minlength=len(self.feeds))
            counts.tokens = [int(a + b) for a, b in zip(counts.tokens, per_source.tolist(), strict=True)]
        counts.padding += int(block.tokens.size) - delivered
        counts.steps += 1
        counts.total_steps += 1
        return batch_arrays(block, self.spec)

def _single_rows(block: RowBlock) -> list[tuple[RowBlock, list[int]]]:
    """Each row of a block on its own, with its segments as a position keeps them."""
    flats = row_segments(block)
    return [(slice_rows(block, index, index + 1), flat) for index, flat in enumerate(flats)]


def _interleaved(chosen: np.ndarray, blocks: dict[int, RowBlock | None], width: int, pad_id: int) -> RowBlock:
    """The rows of each source's block in the order of the draws (``chosen[i]``: the source of row ``i``)."""
    present = {index: block for index, block in sorted(blocks.items()) if block is not None}
    block = concat_blocks(list(present.values()), width, pad_id)
    sizes = [len(one) for one in present.values()]
    start = dict(zip(present, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))
    rank_in_source = np.empty(len(chosen), dtype=np.int64)
    for index in np.unique(chosen).tolist():
        where = np.flatnonzero(chosen == index)
        rank_in_source[where] = start[index] + np.arange(len(where))
    return take_rows(block, rank_in_source)
