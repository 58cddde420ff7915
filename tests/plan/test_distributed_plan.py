"""Laws of distributed planning, simulated without data: equal shares, disjoint, covering, elastic restarts.

Every scheduled item is expanded into the rows ``(piece, row)`` it reads, exactly as the worker orders them, so
the laws are checked on rows, not on bookkeeping.
"""

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm.plan import (
    RANK_ENVIRONMENT,
    ShardLayout,
    Stage,
    WorkItem,
    detect_rank_and_world_size,
    encode_rows,
    merge_runs,
    rank_share,
    remaining_runs,
    resolve_shard,
    row_permutation,
    runs_length,
    runs_of_rows,
    share_size,
    slice_runs,
    split_drop_partitions,
    units_of_runs,
)
from petastorm.reading.options import validate_options

piece_rows = st.lists(st.integers(min_value=0, max_value=23), min_size=1, max_size=12)


def _layout(rows, shard_count, shard, seed, remainder='pad', shuffle_rows=True, drop_partitions=1):
    items = split_drop_partitions([WorkItem(i, 0, n) for i, n in enumerate(rows) if n], drop_partitions)
    return ShardLayout(tuple(items), seed, True, shuffle_rows, 'rows', shard_count, shard, remainder)


def _rows_of(unit, shuffle_rows):
    """The (piece, row) pairs a worker delivers for a scheduled item, in delivery order (mirrors read.py)."""
    item = unit.item
    order = row_permutation(item.num_rows, unit.shuffle_seed) if shuffle_rows else np.arange(item.num_rows)
    if unit.order_picks is not None:
        order = order[list(unit.order_picks)]
    elif unit.order_range is not None:
        order = order[unit.order_range[0]:unit.order_range[1]]
    return [(item.piece_index, item.row_start + int(r)) for r in order]


def _stream(layout, stage):
    units, _ = layout.units(stage)
    return [row for unit in units for row in _rows_of(unit, layout.shuffle_rows)]


@settings(max_examples=120, deadline=None)
@given(rows=piece_rows, shard_count=st.integers(min_value=1, max_value=64), seed=st.integers(0, 2**32),
       epoch=st.integers(0, 5), remainder=st.sampled_from(['pad', 'drop_last']), shuffle_rows=st.booleans(),
       drop_partitions=st.integers(1, 3))
def test_rows_mode_shares_are_equal_disjoint_and_cover_the_epoch(rows, shard_count, seed, epoch, remainder,
                                                                 shuffle_rows, drop_partitions):
    total = sum(rows)
    layouts = [_layout(rows, shard_count, k, seed, remainder, shuffle_rows, drop_partitions)
               for k in range(shard_count)]
    streams = [_stream(layout, Stage(epoch)) for layout in layouts]
    quota = share_size(total, shard_count, remainder)
    assert [len(s) for s in streams] == [quota] * shard_count
    assert all(layout.rows_per_epoch == quota for layout in layouts)
    counts = collections.Counter(row for stream in streams for row in stream)
    every_row = {(p, r) for p, n in enumerate(rows) for r in range(n)}
    if remainder == 'drop_last':
        assert max(counts.values(), default=1) == 1, 'no row twice in an epoch'
        assert len(every_row - set(counts)) == total - shard_count * quota < shard_count
    else:
        assert set(counts) == every_row
        assert sum(counts.values()) - total == layouts[0].remainder_rows < shard_count
        if total >= shard_count:
            assert max(counts.values(), default=1) <= 2


@settings(max_examples=40, deadline=None)
@given(rows=piece_rows, seed=st.integers(0, 2**32))
def test_every_epoch_is_a_new_order_of_the_same_rows(rows, seed):
    layout = _layout(rows, 1, 0, seed)
    epochs = [_stream(layout, Stage(e)) for e in range(3)]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert _stream(_layout(rows, 1, 0, seed), Stage(1)) == epochs[1], 'an epoch order depends on (seed, epoch) only'


@settings(max_examples=120, deadline=None)
@given(rows=piece_rows, old_count=st.integers(1, 9), new_count=st.integers(1, 9), seed=st.integers(0, 2**32),
       remainder=st.sampled_from(['pad', 'drop_last']), data=st.data())
def test_elastic_restart_delivers_each_row_not_yet_delivered_exactly_once(rows, old_count, new_count, seed,
                                                                          remainder, data):
    """Old ranks took ``consumed`` rows each and still held some (a loader's buffer); new ranks take the rest."""
    old = [_layout(rows, old_count, k, seed, remainder) for k in range(old_count)]
    quota = old[0].rows_per_epoch
    consumed = data.draw(st.integers(0, quota))
    delivered, states = collections.Counter(), []
    for layout in old:
        stream = _stream(layout, Stage(0))
        share = layout.share(Stage(0))
        held = data.draw(st.sets(st.integers(0, consumed - 1), max_size=consumed)) if consumed else set()
        positions = [p for _, a, b in share for p in range(a, b)]  # global positions, in this rank's order
        delivered.update(stream[i] for i in range(consumed) if i not in held)
        pending = runs_of_rows(encode_rows(np.array([positions[i] for i in sorted(held)], dtype=np.int64), 0))
        states.append((consumed, pending))
    runs = remaining_runs([(0, 0, old[0].total_rows)], old_count, remainder, states)
    new = [_layout(rows, new_count, k, seed, remainder) for k in range(new_count)]
    new_streams = [_stream(layout, Stage(0, tuple(runs))) for layout in new]
    assert len({len(s) for s in new_streams}) == 1, 'new ranks get equal shares'
    assert len(new_streams[0]) == share_size(runs_length(runs), new_count, remainder)
    again = collections.Counter(row for s in new_streams for row in s)
    owed = collections.Counter(row for layout in old for row in _stream(layout, Stage(0))) - delivered
    if remainder == 'drop_last':
        assert not (set(again) & set(delivered))
        assert max(again.values(), default=1) == 1
        assert sum((owed - again).values()) == runs_length(runs) - new_count * len(new_streams[0]) < new_count
    else:
        assert set(again) == set(owed), 'every owed row comes, none already delivered (except padding)'


def test_same_world_restart_continues_each_rank_exactly():
    rows = [7, 3, 11, 5]
    for shard in range(3):
        layout = _layout(rows, 3, shard, seed=4)
        whole = _stream(layout, Stage(2))
        assert _stream(layout, Stage(2, None, 5)) == whole[5:]


def test_scattered_rows_are_read_once_per_row_group():
    layout = _layout([10, 10, 10], 1, 0, seed=1)
    order = layout.ordered(0)
    picks = [order[1].item_base + 7, order[1].item_base + 2, order[0].item_base + 4]
    units = units_of_runs(sorted(runs_of_rows(encode_rows(np.array(picks), 0))), layout.ordered, narrow=False)
    assert len(units) == 2
    assert sorted(u.num_rows for u in units) == [1, 2]
    assert sorted(p for u in units for p in u.base_positions()) == sorted(picks)


def test_unshuffled_ranges_read_only_their_rows():
    layout = _layout([10, 10], 3, 1, seed=1, shuffle_rows=False)
    units, _ = layout.units(Stage(0))
    assert sum(u.item.num_rows for u in units) == 7, 'narrowed work items, not whole row groups'
    assert all(u.order_range is None and u.order_picks is None for u in units)


def test_run_helpers():
    runs = [(0, 0, 3), (0, 3, 5), (1, 0, 2)]
    assert merge_runs(runs) == [(0, 0, 5), (1, 0, 2)]
    assert slice_runs(runs, 4, 9) == [(0, 4, 5), (1, 0, 2), (0, 0, 2)], 'positions past the end wrap around'
    assert rank_share(runs, 2, 1, 'drop_last') == [(0, 3, 5), (1, 0, 1)]
    assert rank_share(runs, 2, 1, 'pad') == [(0, 4, 5), (1, 0, 2), (0, 0, 1)]


@pytest.mark.parametrize(('rank_name', 'size_name'), RANK_ENVIRONMENT)
def test_rank_detection_reads_each_launcher(rank_name, size_name):
    assert detect_rank_and_world_size({rank_name: '3', size_name: '8'}) == (3, 8, rank_name)


def test_rank_detection_prefers_torchrun_and_checks_values():
    both = {'RANK': '1', 'WORLD_SIZE': '2', 'SLURM_PROCID': '5', 'SLURM_NTASKS': '6'}
    assert detect_rank_and_world_size(both)[:2] == (1, 2)
    with pytest.raises(ValueError, match='RANK=4 and WORLD_SIZE=4'):
        detect_rank_and_world_size({'RANK': '4', 'WORLD_SIZE': '4'})
    with pytest.raises(ValueError, match='must be integers'):
        detect_rank_and_world_size({'HOROVOD_RANK': 'x', 'HOROVOD_SIZE': '2'})
    with pytest.raises(ValueError, match="cur_shard='auto' needs torch.distributed"):
        detect_rank_and_world_size({})


def test_auto_shard_options_come_from_the_environment(monkeypatch):
    for rank_name, size_name in RANK_ENVIRONMENT:
        monkeypatch.delenv(rank_name, raising=False)
        monkeypatch.delenv(size_name, raising=False)
    monkeypatch.setenv('SLURM_PROCID', '2')
    monkeypatch.setenv('SLURM_NTASKS', '5')
    options = validate_options(dataset_url_or_urls='file:///x', batched_output=True, cur_shard='auto',
                               shard_count='auto', shard_mode='rows', seed=1)
    assert (options.cur_shard, options.shard_count, options.shard_source) == (2, 5, 'SLURM_PROCID')
    assert resolve_shard(1, 'auto') == (1, 5, 'SLURM_PROCID')
    with pytest.raises(ValueError, match='found world size 5'):
        resolve_shard('auto', 4)
    with pytest.raises(ValueError, match='shard_mode must be one of'):
        validate_options(dataset_url_or_urls='file:///x', batched_output=True, shard_mode='files')
    with pytest.raises(ValueError, match='shard_remainder must be one of'):
        validate_options(dataset_url_or_urls='file:///x', batched_output=True, shard_remainder='keep')


def test_unseeded_shuffled_row_shards_are_refused():
    # Unseeded shards would each shuffle their own way and their shares would overlap.
    shards = dict(dataset_url_or_urls='file:///x', batched_output=True, shard_mode='rows', cur_shard=0, shard_count=2)
    with pytest.raises(ValueError, match=r'pass the same seed= to the reader of every shard'):
        validate_options(**shards)
    with pytest.raises(ValueError, match=r'shard_count=2'):
        validate_options(**shards, shuffle_row_groups=False, shuffle_rows=True)
    assert validate_options(**shards, seed=3).seed == 3
    assert validate_options(**shards, shuffle_row_groups=False).shard_count == 2
    assert validate_options(**{**shards, 'cur_shard': None, 'shard_count': None}).shard_count is None
