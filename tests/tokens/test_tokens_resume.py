"""Resume laws of the token loader: the same ranks continue bitwise; other ranks deliver every token exactly once.

Positions go through JSON (what a checkpoint keeps). "Bitwise" compares every array of every batch of a run
stopped at a step and restored in a new loader with the uninterrupted run.
"""

import collections
import json

import numpy as np
import pytest

from support.token_corpus import EOS, batch_tokens, expected_tokens, lognormal_lengths, numpy_batch, write_corpus

torch = pytest.importorskip('torch')
from petastorm.tokens import make_token_loader  # noqa: E402

SEQ = 24
LENGTHS = lognormal_lengths(240, median=18, seed=11, longest=90)  # 240 documents: shares of 2, 3 and 4 ranks


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp('resume') / 'docs.parquet', LENGTHS, row_group_size=29)


def _loader(url, **kwargs):
    kwargs.setdefault('seq_len', SEQ)
    if 'max_tokens' not in kwargs:
        kwargs.setdefault('batch_size', 3)
    kwargs.setdefault('workers_count', 2)
    kwargs.setdefault('num_epochs', 2)
    kwargs.setdefault('seed', 5)
    return make_token_loader(url, **kwargs)


def _run(url, stop_after=None, state=None, **kwargs):
    """The batches of a pass (from ``state``), and the position after ``stop_after`` batches (JSON round trip)."""
    batches = []
    with _loader(url, **kwargs) as loader:
        if state is not None:
            loader.load_state_dict(state)
        for batch in loader:
            batches.append(numpy_batch(batch))
            if len(batches) == stop_after:
                return batches, json.loads(json.dumps(loader.state_dict()))
    return batches, None


def _same(first, second):
    return len(first) == len(second) and all(
        a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        for a, b in zip(first, second, strict=True))


CASES = [
    dict(packing='concat'),
    dict(packing='first_fit', eos_id=EOS, return_cu_seqlens=True),
    dict(packing='none', labels='shifted'),
    dict(packing='concat', shuffle_buffer=7, return_document_ids=True),
    dict(packing='first_fit', shuffle_buffer=5, pack_window=4),
    dict(packing='none', max_tokens=70, shuffle_buffer=3),
    dict(packing='concat', cur_shard=1, shard_count=3),
    dict(packing='first_fit', cur_shard=0, shard_count=2, shuffle_documents=False),
]


@pytest.mark.parametrize('case', CASES, ids=lambda case: '-'.join(f'{k}={v}' for k, v in case.items()))
def test_the_same_ranks_continue_the_token_stream_bitwise(url, case):
    whole, _ = _run(url, **case)
    assert len(whole) > 10
    for stop in sorted({1, 4, len(whole) // 2 + 1, len(whole) - 1}):
        head, state = _run(url, stop_after=stop, **case)
        tail, _ = _run(url, state=state, **case)
        assert _same(head + tail, whole), f'restored after {stop} of {len(whole)} batches'


def test_a_restored_loader_can_be_saved_and_restored_again(url):
    case = dict(packing='first_fit', shuffle_buffer=6)
    whole, _ = _run(url, **case)
    head, state = _run(url, stop_after=5, **case)
    with _loader(url, **case) as loader:
        loader.load_state_dict(state)
        assert loader.state_dict() == state, 'saved before reading: the same position'
        batches = iter(loader)
        middle = [numpy_batch(next(batches)) for _ in range(3)]
        again = json.loads(json.dumps(loader.state_dict()))
    tail, _ = _run(url, state=again, **case)
    assert _same(head + middle + tail, whole)


def test_a_position_saved_after_the_last_batch_starts_the_next_pass(url):
    whole, _ = _run(url, num_epochs=1)
    head, state = _run(url, stop_after=len(whole), num_epochs=1)
    assert _same(head, whole)
    assert state['in_progress'] is False
    with _loader(url, num_epochs=1) as loader:
        loader.load_state_dict(state)
        following = [numpy_batch(b) for b in loader]
    assert collections.Counter(t for b in following for t in batch_tokens(b)) == expected_tokens(LENGTHS)
    assert not _same(following, whole), 'the next pass reads the next epoch order'


@pytest.mark.parametrize(('pool', 'workers'), [('dummy', 1), ('thread', 1), ('thread', 3), ('process', 2)])
def test_every_worker_count_and_pool_gives_the_same_stream(url, pool, workers):
    case = dict(packing='first_fit', shuffle_buffer=4, num_epochs=1)
    reference, _ = _run(url, reader_pool_type='thread', workers_count=2, **case)
    assert _same(_run(url, reader_pool_type=pool, workers_count=workers, **case)[0], reference)


def _saved_ranks(url, ranks, steps, state=None, **case):
    """Tokens ``ranks`` ranks delivered in ``steps`` batches each (from ``state`` if given), and their positions."""
    delivered = collections.Counter()
    states = []
    for rank in range(ranks):
        with _loader(url, cur_shard=rank, shard_count=ranks, **case) as loader:
            if state is not None:
                loader.load_state_dict(state)
            batches = iter(loader)
            for _ in range(steps):
                batch = next(batches, None)
                if batch is None:
                    break
                delivered.update(batch_tokens(batch))
            states.append(json.loads(json.dumps(loader.state_dict())))
    return delivered, {'format': 'petastorm.tokens', 'version': 1, 'ranks': states}


def _rest(url, ranks, state, **case):
    """Tokens ``ranks`` ranks restored from ``state`` deliver to the end of the pass."""
    delivered = collections.Counter()
    for rank in range(ranks):
        with _loader(url, cur_shard=rank, shard_count=ranks, **case) as loader:
            loader.load_state_dict(state)
            delivered.update(t for batch in loader for t in batch_tokens(batch))
    return delivered


@pytest.mark.parametrize(('old', 'new', 'steps'), [(4, 2, 3), (2, 3, 7), (1, 3, 11), (3, 3, 2)])
@pytest.mark.parametrize('case', [dict(packing='concat', eos_id=EOS), dict(packing='first_fit', shuffle_buffer=4),
                                  dict(packing='none', max_tokens=60)], ids=['concat', 'first_fit', 'none'])
def test_other_ranks_deliver_every_token_exactly_once(url, old, new, steps, case):
    delivered, state = _saved_ranks(url, old, steps, num_epochs=1, **case)
    assert delivered + _rest(url, new, state, num_epochs=1, **case) == expected_tokens(LENGTHS)


def test_a_chain_of_restores_on_other_ranks_delivers_every_token_once(url):
    case = dict(packing='concat', shuffle_buffer=3, num_epochs=1)
    first, state = _saved_ranks(url, 2, 4, **case)
    second, state = _saved_ranks(url, 3, 2, state=state, **case)
    assert first + second + _rest(url, 2, state, **case) == expected_tokens(LENGTHS)


def test_positions_of_another_loader_are_refused_by_name(url):
    _, state = _run(url, stop_after=2)
    with _loader(url, seq_len=SEQ + 1) as loader, pytest.raises(ValueError, match=r'seq_len=24.*seq_len=25'):
        loader.load_state_dict(state)
    with _loader(url) as loader, pytest.raises(ValueError, match='not a position saved by a petastorm.tokens'):
        loader.load_state_dict({'reader': {}})


def test_epochs_of_steps_per_epoch_batches_continue_the_pass_and_survive_a_restore(url):
    case = dict(steps_per_epoch=5, num_epochs=1)
    whole, _ = _run(url, num_epochs=1)
    with _loader(url, **case) as loader:
        assert len(loader) == 5
        epochs = [[numpy_batch(b) for b in loader] for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict()))
        assert [len(epoch) for epoch in epochs] == [5, 5, 5]
        first = [numpy_batch(b) for b in loader][:2]
    assert _same([b for epoch in epochs for b in epoch], whole[:15])
    with _loader(url, **case) as loader:  # saved mid-pass, between epochs: the next epoch follows
        loader.load_state_dict(state)
        assert _same([numpy_batch(b) for b in loader][:2], first)
    with _loader(url, **case) as loader:
        head = [numpy_batch(b) for b in loader]
        batches = iter(loader)
        head += [numpy_batch(next(batches)) for _ in range(2)]
        state = json.loads(json.dumps(loader.state_dict()))
    with _loader(url, **case) as loader:  # saved mid-epoch: the restored epoch ends where the saved one would
        loader.load_state_dict(state)
        assert _same(head[5:] + [numpy_batch(b) for b in loader], whole[5:10])


@pytest.mark.parametrize('case', [dict(packing='concat'), dict(packing='first_fit', shuffle_buffer=5),
                                  dict(packing='none', max_tokens=60)], ids=['concat', 'first_fit', 'none'])
def test_positions_saved_every_step_restore_exactly_and_elsewhere(url, case):
    """A position saved at every step names what was handed out since the reader last moved (as runs of documents
    it drops when read again): restored on the same ranks bitwise, on others every token once."""
    whole, _ = _run(url, num_epochs=1, **case)
    states = []
    with _loader(url, num_epochs=1, **case) as loader:
        for _batch in loader:
            states.append(json.loads(json.dumps(loader.state_dict())))
    assert any(part['delivered'] for state in states for part in state['sources']), 'the runs are exercised'
    for stop in (3, len(states) // 2, len(states) - 2):
        tail, _ = _run(url, state=states[stop - 1], num_epochs=1, **case)
        assert _same(whole[:stop] + tail, whole)
    ranks = []
    for rank in range(2):
        with _loader(url, cur_shard=rank, shard_count=2, num_epochs=1, **case) as loader:
            batches = iter(loader)
            delivered = collections.Counter()
            for _ in range(5):
                delivered.update(batch_tokens(next(batches)))
                state = json.loads(json.dumps(loader.state_dict()))
            ranks.append((delivered, state))
    gathered = {'format': 'petastorm.tokens', 'version': 1, 'ranks': [state for _, state in ranks]}
    total = ranks[0][0] + ranks[1][0] + _rest(url, 3, gathered, num_epochs=1, **case)
    assert total == expected_tokens(LENGTHS)


@pytest.mark.parametrize('case', [dict(packing='concat'), dict(packing='first_fit', shuffle_buffer=5, pack_window=4),
                                  dict(packing='none', max_tokens=60, shuffle_buffer=3),
                                  dict(packing='concat', shuffle_buffer=7)],
                         ids=['concat', 'first_fit-shuffled', 'none-budget', 'concat-shuffled'])
def test_a_position_read_long_after_it_was_taken_is_the_one_of_its_step(url, case, monkeypatch):
    """state_dict() keeps what the loader held (shared, not copied) and makes its lists only when read: read at the
    end of the pass, every step's position is the one read at its step, and it restores that step exactly."""
    from petastorm.tokens._queue import PieceQueue

    made = collections.Counter()
    partial = PieceQueue.partial

    def counted(self, into):
        made['lists'] += 1
        return partial(self, into)

    from petastorm.reading import position

    reader_state = position.position_state

    def counted_reader(*args, **kwargs):
        made['reader'] += 1
        return reader_state(*args, **kwargs)

    monkeypatch.setattr(PieceQueue, 'partial', counted)
    monkeypatch.setattr(position, 'position_state', counted_reader)
    whole, _ = _run(url, num_epochs=1, **case)
    at_once, later = [], []
    with _loader(url, num_epochs=1, **case) as loader:
        for _batch in loader:
            before, reader_before = made['lists'], made['reader']
            later.append(loader.state_dict())
            assert made['lists'] == before, 'taking a position makes none of its lists'
            assert made['reader'] == reader_before, "nor the reader's position (taken every reader batch)"
            at_once.append(json.loads(json.dumps(loader.state_dict())))
            assert made['lists'] == before + at_once[-1]['in_progress'], 'reading one makes them (in a pass)'
    assert len(later) > 6
    assert [json.loads(json.dumps(state)) for state in later] == at_once
    stop = len(later) // 2
    tail, _ = _run(url, state=later[stop - 1], num_epochs=1, **case)
    assert _same(whole[:stop] + tail, whole)


def test_a_position_goes_through_torch_save_pickle_and_copies_as_plain_data(url, tmp_path):
    """What checkpoints do with a position (torch.save loaded with weights_only, pickle, deepcopy, dict()) gives the
    same plain data as JSON, and restores the same stream."""
    import copy
    import pickle

    whole, _ = _run(url, num_epochs=1, packing='first_fit', shuffle_buffer=5)
    with _loader(url, num_epochs=1, packing='first_fit', shuffle_buffer=5) as loader:
        batches = iter(loader)
        for _ in range(4):
            next(batches)
        state = loader.state_dict()
        for _ in range(3):
            next(batches)  # the loader moves on before the position is read
    torch.save({'data': state}, tmp_path / 'ckpt.pt')
    loaded = torch.load(tmp_path / 'ckpt.pt', weights_only=True)['data']
    expected = json.loads(json.dumps(state))
    for other in (loaded, pickle.loads(pickle.dumps(state)), copy.deepcopy(state), dict(state), {**state}):
        assert json.loads(json.dumps(other)) == expected
    assert state == loaded
    assert loaded == state
    tail, _ = _run(url, state=loaded, num_epochs=1, packing='first_fit', shuffle_buffer=5)
    assert _same(whole[:4] + tail, whole)


@pytest.mark.parametrize('case', [dict(packing='concat'), dict(packing='first_fit', shuffle_buffer=5, pack_window=4),
                                  dict(packing='concat', weights=[0.7, 0.3], shuffle_buffer=4)],
                         ids=['concat', 'first_fit-shuffled', 'mixture-shuffled'])
def test_a_position_taken_with_its_batch_is_the_one_taken_when_asked(url, case):
    """Once state_dict() was called, the next batch takes the position as it is made: a loader asked every step
    gives, at every step, the counts a loader asked only then takes on the spot, and restores the same stream (the
    documents it names may differ: held since the reader's last batch and handed out, or not held any more)."""
    source = [url, url] if 'weights' in case else url
    whole, _ = _run(source, num_epochs=1, **case)
    every = []
    with _loader(source, num_epochs=1, **case) as loader:
        for _batch in loader:
            every.append(json.loads(json.dumps(loader.state_dict())))
    steps = [2, len(every) // 2, len(every) - 2]
    asked = {}
    with _loader(source, num_epochs=1, **case) as loader:
        for step, _batch in enumerate(loader, start=1):
            if step in steps:
                asked[step] = json.loads(json.dumps(loader.state_dict()))
    assert len(every) == len(whole) > 8
    assert len(asked) == len(steps)
    for step, state in asked.items():
        assert {**every[step - 1], 'sources': None} == {**state, 'sources': None}, step
        for saved in (every[step - 1], state):
            tail, _ = _run(source, state=saved, num_epochs=1, **case)
            assert _same(whole[:step] + tail, whole), step
