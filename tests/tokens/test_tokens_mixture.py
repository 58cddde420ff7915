"""Mixtures of sources: rows drawn with the weights (fixed or a function of the step), counted per source, ended when
a drawn source has nothing left, and resumed on the same draws.
"""

import collections
import json

import numpy as np
import pytest

from support.token_corpus import SPAN, batch_tokens, expected_tokens, lognormal_lengths, numpy_batch, write_corpus

torch = pytest.importorskip('torch')
from petastorm.tokens import make_token_loader  # noqa: E402

SEQ = 16
FIRST_B = 10_000  # the documents of source B are numbered from here: a token says its source
LENGTHS_A = lognormal_lengths(200, median=14, seed=1, longest=60)
LENGTHS_B = lognormal_lengths(120, median=20, seed=2, longest=60)


@pytest.fixture(scope='module')
def urls(tmp_path_factory):
    root = tmp_path_factory.mktemp('mixture')
    return [write_corpus(root / 'a.parquet', LENGTHS_A, row_group_size=31),
            write_corpus(root / 'b.parquet', LENGTHS_B, row_group_size=17, first=FIRST_B)]


def _source(token):
    return int(token >= FIRST_B * SPAN)


def _loader(urls, **kwargs):
    kwargs.setdefault('seq_len', SEQ)
    kwargs.setdefault('batch_size', 4)
    kwargs.setdefault('workers_count', 1)
    kwargs.setdefault('weights', [0.75, 0.25])
    return make_token_loader(urls, **kwargs)


def test_rows_follow_the_weights_and_tokens_are_counted_per_source(urls):
    with _loader(urls, num_epochs=None) as loader:
        batches = iter(loader)
        rows = [row for _ in range(100) for row in next(batches)['input_ids'].tolist()]
        stats = loader.stats()
    sources = [_source(row[0]) for row in rows]
    assert all(_source(t) == source for row, source in zip(rows, sources, strict=True) for t in row if t), \
        'a row has one source'
    assert 0.68 < sources.count(0) / len(sources) < 0.82
    per_source = [sum(1 for row in rows for t in row if t and _source(t) == s) for s in (0, 1)]
    assert stats['tokens'] == per_source


def test_the_pass_ends_when_a_drawn_source_has_nothing_left(urls):
    with _loader(urls, weights=[0.2, 0.8], num_epochs=1) as loader:
        tokens = collections.Counter(t for batch in loader for t in batch_tokens(batch))
    of_b = collections.Counter({t: n for t, n in tokens.items() if _source(t)})
    assert of_b == expected_tokens(LENGTHS_B, first=FIRST_B), 'B, drawn most, is read to its end'
    assert max(tokens.values()) == 1
    assert 0 < len(tokens) - len(of_b) < sum(LENGTHS_A)


def test_weights_may_be_a_function_of_the_step(urls):
    seen = []

    def curriculum(step):
        seen.append(step)
        return [1.0, 0.0] if step < 5 else [0.0, 1.0]

    with _loader(urls, weights=curriculum, num_epochs=None) as loader:
        batches = iter(loader)
        sources = [{_source(t) for t in batch_tokens(next(batches))} for _ in range(10)]
    assert sources == [{0}] * 5 + [{1}] * 5
    assert sorted(set(seen))[:10] == list(range(10)), 'called with the number of batches delivered before'
    with pytest.raises(ValueError, match=r'weights\(0\) must hold one weight per source'), \
            _loader(urls, weights=lambda step: [1.0]) as loader:
        next(iter(loader))


def test_a_mixture_resumes_on_the_same_draws_bitwise(urls):
    case = dict(num_epochs=None, shuffle_buffer=5, packing='first_fit')
    with _loader(urls, **case) as loader:
        batches = iter(loader)
        whole = [numpy_batch(next(batches)) for _ in range(40)]
    with _loader(urls, **case) as loader:
        batches = iter(loader)
        head = [numpy_batch(next(batches)) for _ in range(17)]
        state = json.loads(json.dumps(loader.state_dict()))
    with _loader(urls, **case) as loader:
        loader.load_state_dict(state)
        batches = iter(loader)
        tail = [numpy_batch(next(batches)) for _ in range(23)]
        assert loader.stats()['total_steps'] == 40
    for first, second in zip(head + tail, whole, strict=True):
        assert all(np.array_equal(first[k], second[k]) for k in first)


def test_a_mixture_on_other_ranks_delivers_no_token_twice(urls):
    delivered = collections.Counter()
    states = []
    for rank in range(2):
        with _loader(urls, cur_shard=rank, shard_count=2, num_epochs=1) as loader:
            batches = iter(loader)
            for _ in range(6):
                delivered.update(batch_tokens(next(batches)))
            states.append(json.loads(json.dumps(loader.state_dict())))
    totals = []
    for rank in range(3):
        with _loader(urls, cur_shard=rank, shard_count=3, num_epochs=1) as loader:
            loader.load_state_dict({'format': 'petastorm.tokens', 'version': 1, 'ranks': states})
            delivered.update(t for batch in loader for t in batch_tokens(batch))
            totals.append(loader.stats()['tokens'])
    assert max(delivered.values()) == 1
    assert [sum(column) for column in zip(*totals, strict=True)] == [
        sum(1 for t in delivered if _source(t) == s) for s in (0, 1)], 'rank 0 carries the saved totals'
