"""Mix several readers into one stream, drawing each item from a reader chosen with given probabilities.

Example::

    with WeightedSamplingReader([make_reader(url_a), make_reader(url_b)], [0.8, 0.2], seed=0) as mixed:
        for row in mixed:
            ...
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ['WeightedSamplingReader']


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
        self._rng = np.random.default_rng(seed)
        # Serializes the draw and the read, so a seeded mix is the same sequence whichever thread consumes it.
        self._lock = threading.Lock()
        self._exhausted = False

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

    def state_dict(self) -> dict[str, Any]:
        """The position of the mix: each reader's position and the state of the random choice of readers.

        A restored mix continues the same sequence of choices (the mixture is kept) over exactly the items not
        delivered yet (see :meth:`petastorm.reader.Reader.state_dict`).
        """
        with self._lock:
            return {'version': 1, 'choice_rng': self._rng.bit_generator.state, 'exhausted': self._exhausted,
                    'readers': [reader.state_dict() for reader in self._readers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (call on new readers made with the same arguments, before reading).

        Raises:
            ValueError: the state is of a mix of another number of readers.
        """
        saved = state.get('readers', []) if isinstance(state, dict) else []
        if len(saved) != len(self._readers):
            raise ValueError(f'the state holds {len(saved)} reader states; this WeightedSamplingReader mixes '
                             f'{len(self._readers)} readers')
        with self._lock:
            for reader, reader_state in zip(self._readers, saved, strict=True):
                reader.load_state_dict(reader_state)
            self._rng.bit_generator.state = state['choice_rng']
            self._exhausted = bool(state.get('exhausted', False))

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
