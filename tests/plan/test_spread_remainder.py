"""``shard_remainder='spread'``: shares that differ by one row, disjoint, covering the epoch, and elastic restarts
that deliver every owed row exactly once (what the token loaders rely on).

Rows are expanded as the worker orders them, as in ``test_distributed_plan.py``.
"""

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm.plan import (
    ShardLayout,
    Stage,
    WorkItem,
    encode_rows,
    rank_share,
    remaining_runs,
    row_permutation,
    runs_of_rows,
    share_size,
    split_drop_partitions,
)
from petastorm.plan.runs import remainder_rows

piece_rows = st.lists(st.integers(min_value=0, max_value=23), min_size=1, max_size=12)


def _layout(rows, shard_count, shard, seed, shuffle_rows=True):
    items = split_drop_partitions([WorkItem(i, 0, n) for i, n in enumerate(rows) if n], 1)
    return ShardLayout(tuple(items), seed, True, shuffle_rows, 'rows', shard_count, shard, 'spread')


def _stream(layout, stage):
    units, _ = layout.units(stage)
    out = []
    for unit in units:
        item = unit.item
        order = row_permutation(item.num_rows, unit.shuffle_seed) if layout.shuffle_rows else np.arange(item.num_rows)
        if unit.order_picks is not None:
            order = order[list(unit.order_picks)]
        elif unit.order_range is not None:
            order = order[unit.order_range[0]:unit.order_range[1]]
        out.extend((item.piece_index, item.row_start + int(r)) for r in order)
    return out


def test_spread_shares_are_consecutive_and_differ_by_one():
    runs = [(0, 0, 5), (1, 0, 2)]  # 7 rows over 3 shards: 3, 2, 2
    assert [rank_share(runs, 3, k, 'spread') for k in range(3)] == [[(0, 0, 3)], [(0, 3, 5)], [(1, 0, 2)]]
    assert [share_size(7, 3, 'spread', k) for k in range(3)] == [3, 2, 2]
    assert remainder_rows(7, 3, 'spread') == 0


@settings(max_examples=80, deadline=None)
@given(rows=piece_rows, shard_count=st.integers(1, 9), seed=st.integers(0, 2**32), epoch=st.integers(0, 3))
def test_spread_shares_cover_the_epoch_once(rows, shard_count, seed, epoch):
    layouts = [_layout(rows, shard_count, k, seed) for k in range(shard_count)]
    streams = [_stream(layout, Stage(epoch)) for layout in layouts]
    sizes = [len(stream) for stream in streams]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == [layout.rows_per_epoch for layout in layouts]
    counts = collections.Counter(row for stream in streams for row in stream)
    assert set(counts) == {(p, r) for p, n in enumerate(rows) for r in range(n)}
    assert max(counts.values(), default=1) == 1


@settings(max_examples=100, deadline=None)
@given(rows=piece_rows, old_count=st.integers(1, 7), new_count=st.integers(1, 7), seed=st.integers(0, 2**32),
       data=st.data())
def test_spread_elastic_restart_delivers_every_owed_row_once(rows, old_count, new_count, seed, data):
    old = [_layout(rows, old_count, k, seed) for k in range(old_count)]
    delivered, states = collections.Counter(), []
    for layout in old:
        stream = _stream(layout, Stage(0))
        consumed = data.draw(st.integers(0, len(stream)))
        held = data.draw(st.sets(st.integers(0, consumed - 1), max_size=consumed)) if consumed else set()
        positions = [p for _, a, b in layout.share(Stage(0)) for p in range(a, b)]
        delivered.update(stream[i] for i in range(consumed) if i not in held)
        pending = runs_of_rows(encode_rows(np.array([positions[i] for i in sorted(held)], dtype=np.int64), 0))
        states.append((consumed, pending))
    runs = remaining_runs([(0, 0, old[0].total_rows)], old_count, 'spread', states)
    again = collections.Counter(row for k in range(new_count)
                                for row in _stream(_layout(rows, new_count, k, seed), Stage(0, tuple(runs))))
    assert max(again.values(), default=1) == 1
    assert not set(again) & set(delivered)
    assert set(again) | set(delivered) == {(p, r) for p, n in enumerate(rows) for r in range(n)}
