"""Keys of the random draws made while decoding a row (a video clip's start), as pure functions of the plan.

A row's key mixes the scheduled item's seed (itself drawn from the reader's seed and the epoch: see
:func:`petastorm.plan.order.epoch_schedule`), the epoch, and the row's place in the dataset (its row group and its
row there). Nothing else goes in: the key does not depend on the pool kind, the worker count, the order rows are
delivered in, the filters, or on how the item was cut (a head split off, the rest of an item after a restored
position). So a seeded reader draws the same clips every run, and a reader restored from a saved position draws the
clips the first reader drew for the same rows, without keeping anything in its state.
"""

from __future__ import annotations

import numpy as np

from petastorm.plan.items import ScheduledItem

__all__ = ['row_draw_keys']

_MASK = 0xFFFFFFFFFFFFFFFF
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 values: nearby inputs give unrelated outputs."""
    with np.errstate(over='ignore'):
        values = values ^ (values >> np.uint64(30))
        values = values * np.uint64(0xBF58476D1CE4E5B9)
        values = values ^ (values >> np.uint64(27))
        values = values * np.uint64(0x94D049BB133111EB)
        return values ^ (values >> np.uint64(31))


def row_draw_keys(scheduled: ScheduledItem, rows: np.ndarray | None, num_rows: int) -> np.ndarray:
    """One uint64 key per row a worker decodes of ``scheduled``.

    Args:
        scheduled: the scheduled item being read.
        rows: the rows decoded, as offsets from the item's first row (None: ``num_rows`` rows from it, in order).
        num_rows: the number of rows decoded.
    """
    offsets = np.arange(num_rows, dtype=np.uint64) if rows is None else np.asarray(rows).astype(np.uint64)
    item = scheduled.item
    base = np.asarray([scheduled.shuffle_seed & _MASK, scheduled.epoch & _MASK, item.piece_index & _MASK],
                      dtype=np.uint64)
    with np.errstate(over='ignore'):
        seed = _mix(_mix(_mix(base[0:1]) + base[1:2] * _GOLDEN) + base[2:3] * _GOLDEN)
        return _mix(seed + (np.uint64(item.row_start) + offsets) * _GOLDEN)
