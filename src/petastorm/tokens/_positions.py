"""The position of a token stream: taken as the stream goes, and continued from.

:class:`StreamPositions` is the part of :class:`~petastorm.tokens._stream.TokenStream` that saves and restores
(the format is :mod:`petastorm.tokens._state`'s). A position taken keeps references to what the stream holds (its
counters, the shuffle's buffer, each source's part): the stream replaces them, never changes them, as it goes on,
so taking one costs a few attribute reads, and its lists are made when first read. A restore on the same ranks
reads the saved rows' documents again and rebuilds those rows exactly; one on another number of ranks merges every
rank's position and splits again what no rank delivered.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from petastorm.tokens._feed import Feed
from petastorm.tokens._options import PackSpec
from petastorm.tokens._rows import RowBlock, block_of_rows
from petastorm.tokens._state import (
    FORMAT,
    VERSION,
    Position,
    check_states,
    merged_delivered,
    merged_ranges,
    own_state,
    rank_states,
)

if TYPE_CHECKING:
    from petastorm.tokens._options import TokenOptions

logger = logging.getLogger(__name__)

__all__ = ['Counters', 'StreamPositions']

_FIRST_KEYS = {'format': FORMAT}  # what a position holds at once


def _nothing_buffered() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


def _buffered_docs(saved: list[list[int]] | None, buffer: list[tuple[RowBlock, list[int]]],
                   index: int) -> np.ndarray:
    """The documents of source ``index`` in the rows a position kept (a restore's saved rows are not read again
    yet: none)."""
    if saved is not None or not buffer:
        return _nothing_buffered()
    return np.array([doc for _, row in buffer if row[0] == index for doc in row[1::3]], dtype=np.int64)


@dataclass
class Counters:
    """What a position counts besides the sources' parts."""

    passes_done: int = 0
    steps: int = 0  # batches of this pass
    total_steps: int = 0  # batches since the first pass (weight functions take it)
    draws: int = 0  # the mixture's draws this pass
    picks: int = 0  # the shuffle's draws this pass
    generation: int = 0  # restores on another world size (a new sequence of draws each)
    tokens: list[int] = field(default_factory=list)
    padding: int = 0


class StreamPositions:
    """Saving and restoring a :class:`~petastorm.tokens._stream.TokenStream`'s position (see the module's
    documentation); the stream's state it reads and sets is declared here."""

    feeds: list[Feed]
    options: TokenOptions
    pack: PackSpec
    name: str
    shard: int
    shard_count: int
    error: BaseException | None
    _counts: Counters
    _buffer: list[tuple[RowBlock, list[int]]]
    _saved_rows: list[list[int]] | None
    _restoring: bool
    _taking: bool
    _taken: Callable[[], dict[str, Any]] | None
    _mixture_ended: bool
    _pass: Any
    _restart: bool

    def state_dict(self) -> dict[str, Any]:
        """This rank's position (see :mod:`petastorm.tokens._state`), taken in constant time while no restore is
        under way: references to what the stream holds now (replaced, never changed, as it goes on), its lists
        made from them when first read.

        Once it was called, the next batch takes them as it is made (:meth:`_batches`), while what they refer to
        is in the processor's caches: a loader saving its position every step pays a few hundred nanoseconds here.
        """
        self._taking = True
        current = self._pass
        between = self._restart or (current is not None and current.complete)
        if not between and self._taken is not None:
            return Position.later(_FIRST_KEYS, self._taken)
        # A key at once: json's encoder skips an empty dict unread.
        position = Position.later(_FIRST_KEYS, self._take(between))
        if self._saved_rows is not None or (self._restoring and any(feed.restoring for feed in self.feeds)):
            position._made()  # a restore still reads documents again: what it holds changes in place
        return position

    def _take(self, between: bool) -> Callable[[], dict[str, Any]]:
        """What a position taken now refers to, as the function that makes its keys (but the first)."""
        counts = vars(self._counts).copy()  # its list of tokens is replaced, never changed
        if between and not self._restart:
            counts['passes_done'] += 1  # the pass ended: a restore starts the next one
        saved = None if between else self._saved_rows
        buffer = [] if between else self._buffer  # replaced, never changed, as rows come and go
        if saved is None and not buffer:
            sources = [feed.snapshot(_nothing_buffered, between) for feed in self.feeds]
        else:
            sources = [feed.snapshot(functools.partial(_buffered_docs, saved, buffer, index), between)
                       for index, feed in enumerate(self.feeds)]
        return functools.partial(self._made_state, between, counts, saved, buffer, sources)

    def _made_state(self, between: bool, counts: dict[str, Any], saved: list[list[int]] | None,
                    buffer: list[tuple[RowBlock, list[int]]],
                    sources: list[Callable[[], dict[str, Any]]]) -> dict[str, Any]:
        """The keys of a position but its first, from what :meth:`state_dict` kept."""
        pack = self.pack
        return {'version': VERSION, 'seq_len': pack.seq_len, 'packing': pack.packing, 'bos_id': pack.bos_id,
                'eos_id': pack.eos_id, 'shard': self.shard, 'shard_count': self.shard_count,
                'passes_done': counts['passes_done'], 'in_progress': not between,
                'steps': 0 if between else counts['steps'], 'total_steps': counts['total_steps'],
                'draws': 0 if between else counts['draws'], 'picks': 0 if between else counts['picks'],
                'generation': counts['generation'], 'tokens': list(counts['tokens']), 'padding': counts['padding'],
                'rows': saved if saved is not None else [flat for _, flat in buffer],
                'sources': [source() for source in sources]}

    def load_state_dict(self, state: Any) -> None:
        """Continue from a position: this rank's own (the same world size), else every rank's (another one).

        Raises:
            ValueError: the position is not a token loader's, or was saved with other arguments.
        """
        states = rank_states(state)
        check_states(states, self.options, len(self.feeds))
        self._taken = None
        if self._pass is not None:
            self._pass.batches.close()
        self._pass = None
        self._restart = False
        self._mixture_ended = False
        self.error = None
        mine = own_state(states, self.shard, self.shard_count)
        if mine is not None:
            self._restore_own(mine)
        else:
            self._restore_elsewhere(states)

    def _restore_own(self, state: dict[str, Any]) -> None:
        in_progress = bool(state['in_progress'])
        rows = state.get('rows', []) if in_progress else []
        for index, feed in enumerate(self.feeds):
            docs = {int(doc) for row in rows if int(row[0]) == index for doc in row[1::3]}
            part = state['sources'][index]
            if not in_progress:
                part = {'reader': part['reader']}
            feed.restore(part, docs, in_progress)
        self._counts = Counters(
            passes_done=int(state['passes_done']), steps=int(state['steps']), total_steps=int(state['total_steps']),
            draws=int(state['draws']), picks=int(state['picks']), generation=int(state['generation']),
            tokens=[int(n) for n in state['tokens']], padding=int(state['padding']))
        self._buffer = []
        self._saved_rows = [list(row) for row in rows] if rows else None
        self._restoring = True

    def _restore_elsewhere(self, states: list[dict[str, Any]]) -> None:
        in_progress = any(state.get('in_progress') for state in states)
        for index, feed in enumerate(self.feeds):
            feed.restore_elsewhere([state['sources'][index]['reader'] for state in states],
                                   merged_ranges(states, index), merged_delivered(states, index), in_progress)
        tokens = [sum(int(state['tokens'][index]) for state in states) if self.shard == 0 else 0
                  for index in range(len(self.feeds))]
        self._counts = Counters(
            passes_done=min(int(state['passes_done']) for state in states),
            steps=max(int(state['steps']) for state in states),
            total_steps=max(int(state['total_steps']) for state in states),
            generation=max(int(state['generation']) for state in states) + 1, tokens=tokens,
            padding=sum(int(state['padding']) for state in states) if self.shard == 0 else 0)
        self._buffer = []
        self._saved_rows = None
        logger.info('%s: continuing %d ranks on %d: the documents no rank delivered are split again',
                    self.name, len(states), self.shard_count)

    def _finish_restore(self) -> None:
        """Read the saved rows' documents again and rebuild those rows exactly (same world size)."""
        for feed in self.feeds:
            feed.read_saved()
        if self._saved_rows is not None:
            self._buffer = [(block_of_rows([_segments(row, self.feeds[int(row[0])])], self.pack.seq_len,
                                           self.pack.pad_id, int(row[0])), row) for row in self._saved_rows]
        for feed in self.feeds:
            feed.finish_restore()
        self._saved_rows = None
        self._restoring = False


def _segments(row: list[int], feed: Feed) -> list[tuple[int, int, np.ndarray]]:
    flat = row[1:]
    return [(int(flat[k]), int(flat[k + 1]), feed.saved_tokens(int(flat[k]))[int(flat[k + 1]):
                                                                              int(flat[k + 1]) + int(flat[k + 2])])
            for k in range(0, len(flat), 3)]
