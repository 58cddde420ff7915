"""An epoch's order held as arrays (petastorm.plan.order.EpochOrder): scheduled items made only when asked."""

from __future__ import annotations

import tracemalloc

import numpy as np

from petastorm.plan import ScheduledItem, WorkItem, epoch_order
from petastorm.plan.order import epoch_rng


def test_the_order_is_each_item_with_its_seed_and_base():
    items = [WorkItem(index, 0, 10 + index) for index in range(6)]
    order = epoch_order(items, 2, seed=3, shuffle_row_groups=True)
    rng = epoch_rng(3, 2)
    permutation = rng.permutation(len(items))
    seeds = rng.integers(0, 2**63 - 1, size=len(items))
    bases = np.cumsum([items[i].num_rows for i in permutation]).tolist()
    expected = [ScheduledItem(items[i], 2, int(seeds[i]), item_base=base - items[i].num_rows)
                for i, base in zip(permutation.tolist(), bases, strict=True)]
    assert list(order) == expected
    assert order == expected
    assert order[-1] == expected[-1]
    assert order[1:3] == expected[1:3]
    assert order.bases.tolist() == [s.item_base for s in expected]


def test_the_order_of_many_row_groups_is_arrays():
    # A shard by rows lays out every row group of the store: the order of an epoch of 200,000 of them is three
    # arrays (5 MB), not 200,000 scheduled items (54 MB; 270 MB for a million).
    items = [WorkItem(index, 0, 100) for index in range(200_000)]
    tracemalloc.start()
    try:
        order = epoch_order(items, 0, seed=1, shuffle_row_groups=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(order) == 200_000
    assert peak < 16 << 20
    assert order[199_999].item_base == 19_999_900
