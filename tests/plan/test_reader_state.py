"""The typed reader state: a dict kept in a checkpoint reads back and is written with the same keys and values."""

from __future__ import annotations

import json

import pytest

from petastorm.plan import STATE_VERSION, ReaderState, Stage, every_rank, rank_states

# A state as the reader has written it (``state_dict()`` after a loader held rows), through JSON as checkpoints are.
SAVED = {'version': 1, 'seed': 7, 'shard_mode': 'rows', 'remainder': 'pad', 'shard_count': 2, 'shard': 1,
         'shuffle_rows': True, 'shuffle_row_groups': True, 'rows_per_epoch_total': 300, 'pass_start': 0, 'epoch': 1,
         'runs': [[1, 0, 150], [1, 160, 300]], 'consumed': 40, 'pending': [[0, 5, 9], [1, 3, 4]], 'num_epochs': 2}


def test_a_saved_dict_reads_back_and_is_written_with_the_same_keys_in_the_same_order():
    state = ReaderState.from_dict(json.loads(json.dumps(SAVED)))
    assert state.runs == ((1, 0, 150), (1, 160, 300))
    assert state.pending == ((0, 5, 9), (1, 3, 4))
    assert state.stage == Stage(1, ((1, 0, 150), (1, 160, 300)), 40, ((0, 5, 9), (1, 3, 4)))
    assert list(state.to_dict().items()) == list(SAVED.items())


def test_a_table_version_is_written_only_for_a_table():
    table = ReaderState.from_dict({**SAVED, 'table': ['delta', 3]})
    assert table.table == ('delta', 3)
    assert table.to_dict()['table'] == ['delta', 3]
    assert list(table.to_dict())[-2:] == ['table', 'num_epochs']
    assert 'table' not in ReaderState.from_dict(SAVED).to_dict()


def test_a_state_without_the_options_it_is_compared_on_reads_them_as_none():
    old = {key: value for key, value in SAVED.items() if key not in ('shuffle_rows', 'runs', 'pending', 'num_epochs')}
    state = ReaderState.from_dict(old)
    assert (state.shuffle_rows, state.runs, state.pending, state.num_epochs) == (None, None, (), None)


@pytest.mark.parametrize('bad', [None, [], 'state', {**SAVED, 'version': 2},
                                 {key: value for key, value in SAVED.items() if key != 'epoch'},
                                 {'version': 1, 'choice_rng': {}, 'exhausted': False, 'readers': []}])
def test_what_is_not_a_reader_state_is_refused_naming_where(bad):
    with pytest.raises(ValueError, match=rf'^restore: not a reader state of version {STATE_VERSION}: '):
        ReaderState.from_dict(bad, 'restore')


def test_one_state_or_the_list_of_every_ranks():
    one = rank_states(SAVED)
    assert len(one) == 1
    assert one[0].shard == 1
    both = rank_states([{**SAVED, 'shard': 0}, SAVED])
    assert [state.shard for state in both] == [0, 1]
    with pytest.raises(ValueError, match='^load_state_dict got an empty list of states$'):
        rank_states([])
    with pytest.raises(ValueError, match=r'^load_state_dict \(state 1\): not a reader state'):
        rank_states([SAVED, {'version': 1}])


def test_every_rank_gathers_a_state_sharded_over_the_whole_world_in_rank_order():
    mine = {**SAVED, 'shard': 1}
    gathered = []

    def gather(state):
        gathered.append(state)
        return [state, {**SAVED, 'shard': 0}]

    assert every_rank(mine, 2, gather) == [{**SAVED, 'shard': 0}, mine]
    assert gathered == [mine]
    # Nothing is gathered (no collective) for one rank, another sharding, or a state that is not a reader's.
    for state, world in [(mine, 1), (mine, 3), ({'version': 1, 'readers': []}, 2)]:
        assert every_rank(state, world, gather) is state
    assert len(gathered) == 1
