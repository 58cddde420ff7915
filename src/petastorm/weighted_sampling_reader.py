"""Mix several readers into one stream, drawing each item from a reader chosen with given probabilities.

A mix is also a column source for the loaders (:mod:`petastorm.reading.source`): the torch and JAX loaders read it
as columns (rows of row readers are mixed column-wise, with the very draws row iteration makes) and save its
position exactly: every reader's, with the rows the mix or the loader holds counted as not delivered, and the
state of the draw (rewound over held rows when they are the last ones taken, so the same seed gives the same
sequence after a restore).

Example::

    with WeightedSamplingReader([make_reader(url_a), make_reader(url_b)], [0.8, 0.2], seed=0) as mixed:
        for row in mixed:
            ...
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from petastorm.reading.batch import ColumnBatch
from petastorm.reading.source import ItemSource, SourceInfo, is_column_source, positions_of

__all__ = ['WeightedSamplingReader']

# A mixed row's number: the reader's index above the reader's own row number (epochs below 2**16 fit).
_READER_SPAN = 1 << 56
# Rows drawn at once when row readers are mixed column-wise.
_ROWS_PER_DRAW = 1024
# How many recent draws of batch readers the mix remembers (their sizes), to rewind the draw over held rows.
_DRAW_LOG = 4096


def _check_same_shape(readers: Sequence[Any]) -> None:
    """Every reader yields items of the same kind: batched or not, same NGram, same field names."""
    first = readers[0]
    for index, reader in enumerate(readers[1:], start=1):
        if reader.batched_output != first.batched_output:
            raise ValueError(f'All readers passed to WeightedSamplingReader should have the same batched_output: '
                             f'reader 0 has batched_output={first.batched_output}, reader {index} has '
                             f'{reader.batched_output} (do not mix make_reader and make_batch_reader readers)')
        if reader.ngram != first.ngram:
            raise ValueError(f'All readers passed to WeightedSamplingReader should have the same ngram: reader 0 '
                             f'has {first.ngram!r}, reader {index} has {reader.ngram!r}')
        names, first_names = set(reader.schema.fields), set(first.schema.fields)
        if names != first_names:
            raise ValueError(f'All readers passed to WeightedSamplingReader should have the same schema: fields '
                             f'only in reader 0: {sorted(first_names - names)}, fields only in reader {index}: '
                             f'{sorted(names - first_names)}')


def _cumulative_probabilities(probabilities: Sequence[float], readers_count: int) -> np.ndarray:
    if len(probabilities) != readers_count:
        raise ValueError(f'readers and probabilities must have the same length: got {readers_count} readers and '
                         f'{len(probabilities)} probabilities')
    try:
        weights = np.asarray(probabilities, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f'probabilities must be numbers, got {list(probabilities)!r}') from err
    if weights.ndim != 1 or not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError(f'probabilities must be finite and non-negative, got {list(probabilities)!r}')
    if weights.sum() <= 0:
        raise ValueError(f'at least one probability must be positive, got {list(probabilities)!r}')
    cumulative = np.cumsum(weights) / weights.sum()
    # Rounding can leave the total just under 1; pin it so a draw in [0, 1) never falls past the last reader
    # with a positive probability (nor onto a trailing reader whose probability is 0).
    cumulative[int(np.flatnonzero(weights)[-1]):] = 1.0
    return cumulative


class WeightedSamplingReader:
    """Yields items from several readers, choosing the reader of each item at random with given probabilities.

    The readers must yield the same kind of items: all rows (``make_reader``) or all batches
    (``make_batch_reader``), the same NGram (or none) and the same field names. The mix stops as soon as the
    chosen reader runs out (as Petastorm's does), so give the readers enough epochs (or ``num_epochs=None``).

    Args:
        readers: two or more readers.
        probabilities: one non-negative weight per reader; normalised to sum to 1.
        seed: seeds the choice of readers (``np.random.default_rng(seed)``); None draws fresh entropy.

    Raises:
        ValueError: fewer than two readers, a bad or mismatched list of probabilities, or readers that yield
            different kinds of items (the message names the reader and the mismatch).
    """

    def __init__(self, readers: Sequence[Any], probabilities: Sequence[float], seed: int | None = None) -> None:
        readers = list(readers)
        if len(readers) < 2:
            raise ValueError(f'Two or more readers must be specified. Got {len(readers)}.')
        self._cumulative = _cumulative_probabilities(list(probabilities), len(readers))
        _check_same_shape(readers)
        self._readers = readers
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        # Serializes the draw and the read, so a seeded mix is the same sequence whichever thread consumes it.
        self._lock = threading.Lock()
        self._exhausted = False
        # Column-wise mixing (column_batches): each reader's batches not yet used up, and recent draw sizes.
        self._held: list[deque[tuple[ColumnBatch, int]]] = [deque() for _ in readers]
        self._draw_sizes: deque[int] = deque(maxlen=_DRAW_LOG)

    @property
    def readers(self) -> list[Any]:
        """The mixed readers."""
        return list(self._readers)

    @property
    def schema(self) -> Any:
        """The schema of the items (the first reader's)."""
        return self._readers[0].schema

    @property
    def ngram(self) -> Any:
        """The readers' NGram, or None."""
        return self._readers[0].ngram

    @property
    def batched_output(self) -> bool:
        """True when the readers yield batches (``make_batch_reader``)."""
        return bool(self._readers[0].batched_output)

    @property
    def info(self) -> SourceInfo:
        """What the mix delivers, for the loaders.

        The first reader's schema, NGram and transform; the seed of the choice of readers (loaders seed their
        shuffling buffers from it); endless when every reader is (``num_epochs=None``).
        """
        first = self._readers[0]
        return SourceInfo(schema=first.schema, ngram=first.ngram, batched_output=bool(first.batched_output),
                          seed=self._seed, transform_spec=getattr(first, 'transform_spec', None),
                          endless=all(_endless(r) for r in self._readers))

    @property
    def resumable(self) -> bool:
        """Every reader is a column source with positions: loaders over the mix can save their position."""
        return all(is_column_source(r) and positions_of(r) is not None for r in self._readers)

    @property
    def num_rows_per_pass(self) -> int | None:
        """Unknown (None): the mix ends when a chosen reader runs out."""
        return None

    @property
    def num_rows_this_pass(self) -> int | None:
        """Unknown (None)."""
        return None

    @property
    def last_row_consumed(self) -> bool:
        """True once any of the readers has run out."""
        return any(reader.last_row_consumed for reader in self._readers)

    @property
    def stopped(self) -> bool:
        """True once any of the readers was stopped."""
        return any(bool(getattr(reader, 'stopped', False)) for reader in self._readers)

    def __iter__(self) -> WeightedSamplingReader:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._exhausted:
                raise StopIteration
            chosen = int(np.searchsorted(self._cumulative, self._rng.random(), side='right'))
            try:
                return next(self._readers[chosen])
            except StopIteration:
                # Once one reader ends the mix ends; later calls must not resume from the other readers.
                self._exhausted = True
                raise

    def next(self) -> Any:
        """Same as ``next(reader)``."""
        return self.__next__()

    # -- column-wise mixing, for the loaders -------------------------------------------------------------------

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """The mix as batches of columns, with the draws :meth:`__next__` would make (one per row or batch).

        Rows carry ``row_ids`` naming their reader and their row in it, so that a loader can save its position.
        ``first_rows`` changes nothing: a mix draws per batch of its readers, whose batches stay whole row groups.
        """
        if not all(is_column_source(r) for r in self._readers):
            # Reader-like objects without columns: their items, gathered into columns (no position).
            yield from ItemSource(self).column_batches()
            return
        sources = [r.column_batches() for r in self._readers]
        if self.batched_output:
            yield from self._mix_batches(sources)
        else:
            yield from self._mix_rows(sources)

    def _mix_batches(self, sources: list[Iterator[ColumnBatch]]) -> Iterator[ColumnBatch]:
        while True:
            with self._lock:
                if self._exhausted:
                    return
                chosen = int(np.searchsorted(self._cumulative, self._rng.random(), side='right'))
                try:
                    batch = self._next_held(chosen, sources[chosen])
                except StopIteration:
                    self._exhausted = True
                    return
                self._draw_sizes.append(batch.num_rows)
            yield _tagged(batch, chosen)

    def _next_held(self, index: int, source: Iterator[ColumnBatch]) -> ColumnBatch:
        """The rest of the first batch the mix holds of a reader, or the reader's next batch."""
        held = self._held[index]
        if held:
            batch, offset = held.popleft()
            return _slice(batch, offset, batch.num_rows)
        return next(source)

    def _mix_rows(self, sources: list[Iterator[ColumnBatch]]) -> Iterator[ColumnBatch]:
        while True:
            with self._lock:
                if self._exhausted:
                    return
                choices = np.searchsorted(self._cumulative, self._rng.random(_ROWS_PER_DRAW), side='right')
                wanted = [int(np.count_nonzero(choices == index)) for index in range(len(self._readers))]
                parts = [self._take_rows(index, source, count)
                         for index, (source, count) in enumerate(zip(sources, wanted, strict=True))]
                got = [0 if part is None else part.num_rows for part in parts]
                short = [index for index in range(len(parts)) if got[index] < wanted[index]]
                if short:
                    # A reader ran out: the mix ends at the first draw that found it empty; rows taken for the
                    # draws after it go back to their readers (they stay pending in a saved state).
                    cut = min(int(np.flatnonzero(choices == index)[got[index]]) for index in short)
                    choices = choices[:cut]
                    for index, part in enumerate(parts):
                        keep = int(np.count_nonzero(choices == index))
                        if part is not None and keep < part.num_rows:
                            self._held[index].appendleft((part, keep))
                            parts[index] = _slice(part, 0, keep)
                    self._exhausted = True
                    if not cut:
                        return
                batch = _interleave(choices, parts)
            yield batch

    def _take_rows(self, index: int, source: Iterator[ColumnBatch], count: int) -> ColumnBatch | None:
        """``count`` rows of a reader (fewer when it runs out; None when it has none), from what the mix holds."""
        if count == 0:
            return None
        held = self._held[index]
        pieces: list[ColumnBatch] = []
        taken = 0
        while taken < count:
            if not held:
                try:
                    held.append((next(source), 0))
                except StopIteration:
                    break
            batch, offset = held.popleft()
            stop = min(batch.num_rows, offset + count - taken)
            pieces.append(_slice(batch, offset, stop))
            taken += stop - offset
            if stop < batch.num_rows:
                held.appendleft((batch, stop))
        if not pieces:
            return None
        return _concat(pieces, index)

    def state_holding(self, held_rows: np.ndarray, held_in_order: bool = False) -> dict[str, Any]:
        """The position when a loader holds these rows (by ``row_ids``) undelivered.

        Every reader's state counts its rows held by the mix or the loader as not delivered. When the held rows
        are the last ones taken (``held_in_order``: no shuffling buffer), the draw is rewound over them, so that a
        restored mix draws them again in the same order and continues the same sequence.
        """
        held_rows = np.asarray(held_rows, dtype=np.int64)
        with self._lock:
            states = []
            for index, reader in enumerate(self._readers):
                mine = [held_rows[(held_rows >= 0) & (held_rows // _READER_SPAN == index)] % _READER_SPAN]
                mine += [np.asarray(batch.row_ids[offset:]) for batch, offset in self._held[index]
                         if batch.row_ids is not None]
                states.append(reader.state_holding(np.concatenate(mine)) if hasattr(reader, 'state_holding')
                              else reader.state_dict())
            rng = np.random.default_rng()
            rng.bit_generator.state = self._rng.bit_generator.state
            rewind = self._draws_over(len(held_rows)) if held_in_order else 0
            if rewind:
                rng.bit_generator.advance(-rewind)  # type: ignore[attr-defined]  # PCG64, default_rng's
            return _mix_state(rng.bit_generator.state, self._exhausted and not rewind, states)

    def _draws_over(self, rows: int) -> int:
        """Draws that gave the last ``rows`` rows taken (0 when the mix does not remember that far)."""
        if not rows or not self.batched_output:
            return rows  # row readers: one draw per row (rows the mix holds were read ahead of any draw)
        draws = total = 0
        for size in reversed(self._draw_sizes):
            if total >= rows:
                break
            total += size
            draws += 1
        return draws if total >= rows else 0

    def state_dict(self) -> dict[str, Any]:
        """The position of the mix: each reader's position and the state of the random choice of readers.

        A restored mix continues the same sequence of choices (the mixture is kept) over exactly the items not
        delivered yet (see :meth:`petastorm.reader.Reader.state_dict`).
        """
        if any(self._held):
            return self.state_holding(np.empty(0, dtype=np.int64))
        with self._lock:
            return _mix_state(self._rng.bit_generator.state, self._exhausted,
                              [reader.state_dict() for reader in self._readers])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (call on new readers made with the same arguments, before reading).

        Raises:
            ValueError: the state is of a mix of another number of readers.
        """
        saved = self._reader_states(state)
        with self._lock:
            for reader, reader_state in zip(self._readers, saved, strict=True):
                reader.load_state_dict(reader_state)
            self._restore_draw(state)

    def _reader_states(self, state: Any) -> list[Any]:
        """The state of each mixed reader in a saved mix state.

        Raises:
            ValueError: the state is of a mix of another number of readers.
        """
        saved = state.get('readers', []) if isinstance(state, dict) else []
        if len(saved) != len(self._readers):
            raise ValueError(f'the state holds {len(saved)} reader states; this WeightedSamplingReader mixes '
                             f'{len(self._readers)} readers')
        return list(saved)

    def _restore_draw(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state['choice_rng']
        self._exhausted = bool(state.get('exhausted', False))
        self._held = [deque() for _ in self._readers]
        self._draw_sizes.clear()

    def reset(self) -> None:
        """Start every reader's next pass (the draw continues)."""
        self.restart()

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """Abandon the mix being read and start again: every reader's next pass, or from a :meth:`state_dict`.

        Args:
            state: None continues the draw over every reader's next pass; a state restores the mix's position.
            new_pass: the state was saved between passes of a loader: every reader starts the pass after it.
        """
        saved = [None] * len(self._readers) if state is None else self._reader_states(state)
        with self._lock:
            for reader, reader_state in zip(self._readers, saved, strict=True):
                reader.restart(reader_state, new_pass=new_pass)
            if state is None:
                self._exhausted = False
                self._held = [deque() for _ in self._readers]
                self._draw_sizes.clear()
            else:
                self._restore_draw(state)

    def stop(self) -> None:
        """Stop every reader (non-blocking)."""
        for reader in self._readers:
            reader.stop()

    def join(self) -> None:
        """Wait until the workers of every reader have finished (call after :meth:`stop`)."""
        for reader in self._readers:
            reader.join()

    def __repr__(self) -> str:
        probabilities = np.diff(self._cumulative, prepend=0.0)
        shown = ', '.join(f'{p:.3g}' for p in probabilities)
        state = ', exhausted' if self._exhausted else ''
        readers = ', '.join(repr(reader) for reader in self._readers)
        return f'<WeightedSamplingReader probabilities=[{shown}]{state}, readers=[{readers}]>'

    def __enter__(self) -> WeightedSamplingReader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        # Stop them all first so they wind down together, then wait for each.
        self.stop()
        self.join()
        for reader in self._readers:
            # Each reader's own exit releases its cache quietly (stop and join are done, so they return at once).
            reader.__exit__(None, None, None)


def _mix_state(choice_rng: Mapping[str, Any], exhausted: bool, readers: list[Any]) -> dict[str, Any]:
    """A mix's state: every reader's state and the state of the random choice of readers."""
    return {'version': 1, 'choice_rng': choice_rng, 'exhausted': exhausted, 'readers': readers}


def _endless(reader: Any) -> bool:
    """Whether a mixed reader is endless (``num_epochs=None``; a reader-like object when it says so)."""
    if is_column_source(reader):
        return reader.info.endless
    return bool(getattr(reader, 'endless', False))


def _slice(batch: ColumnBatch, start: int, stop: int) -> ColumnBatch:
    if start == 0 and stop == batch.num_rows:
        return batch
    return ColumnBatch({name: values[start:stop] for name, values in batch.columns.items()}, stop - start,
                       rows_are_tuples=batch.rows_are_tuples,
                       row_ids=None if batch.row_ids is None else batch.row_ids[start:stop])


def _concat(pieces: list[ColumnBatch], index: int) -> ColumnBatch:
    """Pieces of one reader's batches as one batch (row numbers kept as the reader's)."""
    if len(pieces) == 1:
        return pieces[0]
    names = list(pieces[0].columns)
    columns = {name: np.concatenate([piece.columns[name] for piece in pieces]) for name in names}
    ids = None if any(piece.row_ids is None for piece in pieces) else np.concatenate([p.row_ids for p in pieces])
    return ColumnBatch(columns, sum(piece.num_rows for piece in pieces), rows_are_tuples=pieces[0].rows_are_tuples,
                       row_ids=ids)


def _row_ids(batch: ColumnBatch, index: int) -> np.ndarray:
    if batch.row_ids is None:
        return np.full(batch.num_rows, -1, dtype=np.int64)
    return index * _READER_SPAN + np.asarray(batch.row_ids, dtype=np.int64)


def _tagged(batch: ColumnBatch, index: int) -> ColumnBatch:
    """A reader's batch with row numbers that also name the reader."""
    return ColumnBatch(batch.columns, batch.num_rows, rows_are_tuples=batch.rows_are_tuples,
                       row_ids=_row_ids(batch, index))


def _interleave(choices: np.ndarray, parts: list[ColumnBatch | None]) -> ColumnBatch:
    """The rows of every reader's part in the order of the draws (``choices[i]``: the reader of row ``i``)."""
    present = [(index, part) for index, part in enumerate(parts) if part is not None and part.num_rows]
    order = np.argsort(choices, kind='stable')  # positions grouped by reader, in draw order: as the parts are
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    names = list(present[0][1].columns)
    columns = {name: np.concatenate([part.columns[name] for _, part in present])[inverse] for name in names}
    ids = np.concatenate([_row_ids(part, index) for index, part in present])[inverse]
    return ColumnBatch(columns, len(choices), rows_are_tuples=present[0][1].rows_are_tuples, row_ids=ids)
