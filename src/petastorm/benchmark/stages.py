"""Which stage bounds a measured read rate, from the reader's stage timings (see :mod:`petastorm.stage_timing`).

Workers run I/O (opening the file and reading the row group's columns with pyarrow, Parquet decompression
included), filter, decode (the codecs) and transform for many work items at once; the consumer waits for the pool
(``queue_wait``) and spends the rest of its time making what the user gets from the columns (``collate``: rows for
``make_reader``, tensors for a torch loader, the ``tf.data`` pipeline). Each stage is shown as the share of the
capacity it used during the measurement: a worker stage's seconds divided by ``workers x wall time``, a consumer
stage's seconds divided by the wall time. When the workers together are busier than the consumer, their largest
stage bounds the rate and speeding it up (more workers, a cheaper codec) helps; otherwise ``collate`` bounds it
and more workers cannot help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from petastorm.stage_timing import WORKER_STAGES

__all__ = ['STAGES', 'StageBreakdown', 'stage_breakdown']

#: Every stage, in the order they are shown.
STAGES = (*WORKER_STAGES, 'collate', 'queue_wait')
_LABELS = {'io': 'I/O', 'filter': 'filter', 'decode': 'decode', 'transform': 'transform', 'collate': 'collate',
           'queue_wait': 'queue wait'}
_WHERE = {'io': 'workers', 'filter': 'workers', 'decode': 'workers', 'transform': 'workers', 'collate': 'consumer',
          'queue_wait': 'consumer'}


@dataclass(frozen=True)
class StageBreakdown:
    """Seconds and capacity share of every stage over one measurement.

    Attributes:
        seconds: stage -> seconds spent on the rows delivered (worker stages summed over workers).
        shares: stage -> fraction of the stage's capacity used (see the module doc); ``queue_wait`` is the
            fraction of the wall time the consumer waited for the workers.
        wall_seconds: the measurement's duration.
        workers: workers sharing the worker stages (1 for the inline ``dummy`` pool).
        bound: the stage that bounds the rate.
    """

    seconds: dict[str, float]
    shares: dict[str, float]
    wall_seconds: float
    workers: int
    bound: str

    @property
    def verdict(self) -> str:
        """One sentence naming the bounding stage and why."""
        wait = self.shares['queue_wait']
        busy = self.shares[self.bound]
        if _WHERE[self.bound] == 'consumer':
            return (f'bound by {_LABELS[self.bound]} in the consumer (busy {busy:.0%} of the time, waiting for the '
                    f'workers {wait:.0%}): more workers will not help')
        return (f'bound by {_LABELS[self.bound]} in the workers (it uses {busy:.0%} of {self.workers} worker(s); '
                f'the consumer waited {wait:.0%} of the time)')

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly form."""
        return {'seconds': self.seconds, 'shares': self.shares, 'wall_seconds': self.wall_seconds,
                'workers': self.workers, 'bound': self.bound, 'verdict': self.verdict}

    def format(self) -> str:
        """A small table of the stages and the verdict, one line each."""
        lines = [f'Stage breakdown over {self.wall_seconds:.2f} s ({self.workers} worker(s)):',
                 f'  {"stage":<11}{"where":<10}{"seconds":>9}{"share":>8}']
        for stage in STAGES:
            lines.append(f'  {_LABELS[stage]:<11}{_WHERE[stage]:<10}{self.seconds[stage]:>9.3f}'
                         f'{self.shares[stage]:>8.0%}')
        lines.append(f'Bottleneck: {self.verdict}')
        return '\n'.join(lines)


def stage_breakdown(before: dict[str, Any], after: dict[str, Any], wall_seconds: float, rows: int, workers: int,
                    inline: bool) -> StageBreakdown:
    """Interpret two snapshots of a reader's stage totals taken around a measurement.

    Worker seconds arrive with the work items the consumer takes, which need not match the rows delivered in the
    measurement (a row reader may serve a whole measurement from one item). So a worker stage's share is its cost
    per row (over the items taken during the measurement, or over the whole run when none was) times the rows
    delivered, divided by ``workers x wall_seconds``. No share exceeds 100%, and neither do the worker stages
    together nor the consumer's two: an estimate claiming more is scaled down to the time there was.

    Args:
        before: ``reader.diagnostics['stages']`` when the measurement started.
        after: the same when it ended.
        wall_seconds: the measurement's duration.
        rows: rows delivered during the measurement.
        workers: the reader's ``workers_count``.
        inline: the pool runs the work inside the consumer's wait (the ``dummy`` pool): its queue wait then
            contains the worker stages, which are taken out of it, and the workers count is 1.
    """
    window = {stage: max(0.0, after['seconds'].get(stage, 0.0) - before['seconds'].get(stage, 0.0))
              for stage in (*WORKER_STAGES, 'queue_wait')}
    item_rows = after['rows'] - before['rows']
    per_row_source = window if item_rows > 0 else after['seconds']
    per_row_rows = item_rows if item_rows > 0 else after['rows']
    wall = max(wall_seconds, 1e-9)
    workers = 1 if inline else max(1, workers)
    spent = {stage: per_row_source.get(stage, 0.0) * rows / max(per_row_rows, 1) for stage in WORKER_STAGES}
    # Whatever the consumer did not spend waiting for results went into making the user's items.
    spent['collate'] = max(0.0, wall_seconds - window['queue_wait'])
    spent['queue_wait'] = window['queue_wait']
    if inline:
        spent['queue_wait'] = max(0.0, spent['queue_wait'] - sum(window[s] for s in WORKER_STAGES))
    # A worker stage's seconds are estimated from its cost per row: the estimate may claim more than the workers
    # had (a few items timed while many rows were delivered). Workers cannot be busier than all of their time, so
    # such an estimate is scaled down to it, keeping the stages' proportions.
    capacity = wall * workers
    claimed = sum(spent[stage] for stage in WORKER_STAGES)
    if claimed > capacity:
        for stage in WORKER_STAGES:
            spent[stage] *= capacity / claimed
    spent['queue_wait'] = min(spent['queue_wait'], wall_seconds)
    spent['collate'] = min(spent['collate'], max(0.0, wall_seconds - spent['queue_wait']))
    shares = {stage: min(1.0, spent[stage] / capacity) for stage in WORKER_STAGES}
    shares['collate'] = min(1.0, spent['collate'] / wall)
    shares['queue_wait'] = min(1.0, spent['queue_wait'] / wall)
    # The workers as a whole against the consumer; within the busier workers, their largest stage.
    if sum(shares[stage] for stage in WORKER_STAGES) > shares['collate']:
        bound = max(WORKER_STAGES, key=lambda stage: shares[stage])
    else:
        bound = 'collate'
    return StageBreakdown(seconds={stage: spent[stage] for stage in STAGES},
                          shares={stage: shares[stage] for stage in STAGES}, wall_seconds=wall_seconds,
                          workers=workers, bound=bound)
