"""Keys of the rows' random draws: a pure function of the item's seed, the epoch and the row's place."""

from __future__ import annotations

import dataclasses

import numpy as np

from petastorm.plan import ScheduledItem, WorkItem, epoch_order, split_head
from petastorm.plan.row_keys import row_draw_keys


def _keys_by_row(scheduled: ScheduledItem, rows: np.ndarray) -> dict[int, int]:
    keys = row_draw_keys(scheduled, rows, len(rows))
    return dict(zip((scheduled.item.row_start + rows).tolist(), keys.tolist(), strict=True))


def test_same_plan_same_keys_and_every_row_its_own():
    items = [WorkItem(0, 0, 50), WorkItem(1, 0, 50)]
    first = epoch_order(items, 3, seed=7, shuffle_row_groups=True)
    again = epoch_order(items, 3, seed=7, shuffle_row_groups=True)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(row_draw_keys(a, None, 50), row_draw_keys(b, None, 50))
    keys = np.concatenate([row_draw_keys(s, None, 50) for s in first])
    assert keys.dtype == np.uint64
    assert len(set(keys.tolist())) == 100


def test_other_epochs_and_seeds_draw_otherwise():
    items = [WorkItem(0, 0, 20)]
    base = row_draw_keys(epoch_order(items, 0, 1, False)[0], None, 20)
    assert not set(base.tolist()) & set(row_draw_keys(epoch_order(items, 1, 1, False)[0], None, 20).tolist())
    assert not set(base.tolist()) & set(row_draw_keys(epoch_order(items, 0, 2, False)[0], None, 20).tolist())


def test_a_row_keeps_its_key_however_the_item_is_cut_or_ordered():
    scheduled = epoch_order([WorkItem(4, 10, 40)], 2, seed=5, shuffle_row_groups=False)[0]
    whole = _keys_by_row(scheduled, np.arange(30))
    shuffled = _keys_by_row(scheduled, np.random.default_rng(0).permutation(30))
    assert shuffled == whole
    head, rest = split_head(scheduled, 8)
    assert {**_keys_by_row(head, np.arange(8)), **_keys_by_row(rest, np.arange(8, 30))} == whole
    # A restored position narrows the item to the rows left (same seed): the rows keep their keys.
    narrowed = dataclasses.replace(scheduled, item=WorkItem(4, 25, 40))
    assert _keys_by_row(narrowed, np.arange(15)) == {row: whole[row] for row in range(25, 40)}
