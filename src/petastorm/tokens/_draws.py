"""Random draws that a saved position names by a count: the mixture's choice of sources, the shuffle's picks.

Every draw is a pure function of the seed, a key and the draw's number, so a position only keeps how many draws
were made: a restored loader continues the same sequence, whatever happened in between (no generator state to
save). Uniform numbers come in blocks of :data:`BLOCK` from ``np.random.default_rng([seed, *key, block])``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from petastorm.tokens._options import check_weights

__all__ = ['BLOCK', 'Mixture', 'generator', 'uniforms']

BLOCK = 4096


def generator(seed: int, key: Sequence[int]) -> np.random.Generator:
    """The generator of ``key`` (non-negative ints) under ``seed``."""
    return np.random.default_rng([seed, *[int(k) for k in key]])


def uniforms(seed: int, key: Sequence[int], first: int, count: int) -> np.ndarray:
    """Uniform numbers ``[first, first + count)`` of the sequence of ``key``."""
    out = np.empty(count, dtype=np.float64)
    filled = 0
    while filled < count:
        block, offset = divmod(first + filled, BLOCK)
        values = generator(seed, [*key, block]).random(BLOCK)
        take = min(BLOCK - offset, count - filled)
        out[filled:filled + take] = values[offset:offset + take]
        filled += take
    return out


class Mixture:
    """Which source each packed row comes from: a draw with the weights of the step.

    Args:
        weights: one weight per source, or a function of the step (batches delivered so far) returning them.
        count: the number of sources.
        seed: the loader's seed.
    """

    def __init__(self, weights: Sequence[float] | Callable[[int], Sequence[float]], count: int, seed: int) -> None:
        self._weights = weights
        self._count = count
        self._seed = seed

    def cumulative(self, step: int) -> np.ndarray:
        """The cumulative weights at ``step``.

        Raises:
            ValueError: a weight function returned something other than one non-negative weight per source.
        """
        weights = self._weights(step) if callable(self._weights) else self._weights
        values = check_weights(weights, self._count, f'weights({step})' if callable(self._weights) else 'weights')
        cumulative = np.cumsum(values) / values.sum()
        cumulative[int(np.flatnonzero(values)[-1]):] = 1.0  # a draw in [0, 1) never falls past the last positive one
        return cumulative

    def sources(self, key: Sequence[int], first: int, count: int, step: int) -> np.ndarray:
        """The sources of draws ``[first, first + count)``."""
        return np.searchsorted(self.cumulative(step), uniforms(self._seed, key, first, count), side='right')
