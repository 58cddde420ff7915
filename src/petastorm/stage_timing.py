"""Where the time of a read goes: seconds per stage, measured only when a reader is asked to.

A worker measures its own stages of one work item with a :class:`StageClock` (I/O, filtering, decoding, the
transform) and sends them back with the item's result, so the numbers travel through every pool kind with the
result itself and need no shared state between workers. The consumer adds them up in a
:class:`StageTotals`, together with the time it spent waiting for the pool (the queue wait). When timing is off
no clock exists and nothing is added to the results.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

__all__ = ['WORKER_STAGES', 'StageClock', 'StageTotals', 'lap']

T = TypeVar('T')

#: Worker-side stages, in the order a work item goes through them.
WORKER_STAGES = ('io', 'filter', 'decode', 'transform')


class StageClock:
    """Splits the wall time of one work item into stages: each :meth:`lap` charges the time since the last."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        """Charge the time since the previous lap (or since the clock was made) to ``stage``."""
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now


def lap(clock: StageClock | None, stage: str) -> None:
    """``clock.lap(stage)`` when timing is on; nothing when ``clock`` is None."""
    if clock is not None:
        clock.lap(stage)


class StageTotals:
    """Stage seconds summed over every work item a reader delivered, plus the consumer's wait for the pool.

    ``seconds`` maps each worker stage and ``'queue_wait'`` to seconds; ``items`` and ``rows`` count what was
    delivered. Worker seconds are summed over all workers, so with ``N`` busy workers they grow up to ``N`` times
    faster than the wall clock.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys((*WORKER_STAGES, 'queue_wait'), 0.0)
        self.items = 0
        self.rows = 0

    def timed(self, results: Iterator[T]) -> Iterator[T]:
        """Yield ``results`` unchanged, adding the time spent waiting for each to ``'queue_wait'``."""
        while True:
            started = time.perf_counter()
            try:
                result = next(results)
            except StopIteration:
                return
            self.seconds['queue_wait'] += time.perf_counter() - started
            yield result

    def add(self, seconds: Mapping[str, float] | None, rows: int) -> None:
        """Count one delivered item of ``rows`` rows whose worker spent ``seconds`` per stage."""
        for stage, spent in (seconds or {}).items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + spent
        self.items += 1
        self.rows += rows

    def snapshot(self) -> dict[str, Any]:
        """A copy of the totals: ``{'seconds': {...}, 'items': n, 'rows': n}``."""
        return {'seconds': dict(self.seconds), 'items': self.items, 'rows': self.rows}
