"""Supervised fine-tuning: prompt tokens are in ``input_ids`` but never a label, whether the prompt is its own column
(token ids or text) or a ``loss_mask_field`` says which tokens are trained on; every packing, both label styles,
and an exact resume carry the mask.

Token ``k`` of document ``d`` is ``d * SPAN + k + 1`` (``support.token_corpus``), so a test tells a prompt token
from its id alone: the first ``PROMPT[d]`` tokens of document ``d`` are its prompt.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.token_corpus import BOS, EOS, SPAN, WORDS, document, lognormal_lengths, numpy_batch, word_ids

torch = pytest.importorskip('torch')
from petastorm.errors import NoMatchingFieldsError  # noqa: E402
from petastorm.tokens import IGNORE_INDEX, TokenColumnError, make_token_loader  # noqa: E402

SEQ = 32
LENGTHS = lognormal_lengths(60, median=14, seed=3, longest=70) + 2
PROMPT = np.random.default_rng(4).integers(1, LENGTHS)  # at least one prompt and one response token


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    """Each row: the whole document, its prompt and its response as columns, and a 0/1 mask of its response."""
    docs = [document(d, int(n)) for d, n in enumerate(LENGTHS)]
    lists = pa.list_(pa.int32())
    table = pa.table({
        'input_ids': pa.array(docs, lists),
        'prompt_ids': pa.array([doc[:p] for doc, p in zip(docs, PROMPT, strict=True)], lists),
        'completion_ids': pa.array([doc[p:] for doc, p in zip(docs, PROMPT, strict=True)], lists),
        'completion_mask': pa.array([(np.arange(len(doc)) >= p).astype(np.int8) for doc, p in
                                     zip(docs, PROMPT, strict=True)], pa.list_(pa.int8())),
        'short_mask': pa.array([[1]] * len(docs), pa.list_(pa.int8())),
        'float_mask': pa.array([[1.0] * len(doc) for doc in docs], pa.list_(pa.float32())),
    })
    path = tmp_path_factory.mktemp('sft') / 'sft.parquet'
    pq.write_table(table, str(path), row_group_size=13)
    return f'file://{path}'


def _is_prompt(ids):
    index, within = np.divmod(ids - 1, SPAN)
    real = (ids > 0) & (ids < BOS)
    return real & (within < PROMPT[np.where(real, index, 0)])


def _expected_labels(batch, style):
    """The labels the law gives: the target token, unless it is padding, another segment's or a prompt's."""
    ids, positions = batch['input_ids'], batch['position_ids']
    if style == 'hf':
        keep = (ids != 0) & (positions != 0) & ~_is_prompt(ids)
        return np.where(keep, ids, IGNORE_INDEX)
    expected = np.full_like(ids, IGNORE_INDEX)
    following = ids[:, 1:]
    keep = (positions[:, 1:] == positions[:, :-1] + 1) & (following != 0) & ~_is_prompt(following)
    expected[:, :-1] = np.where(keep, following, IGNORE_INDEX)
    return expected


def _batches(url, **kwargs):
    kwargs = {'seq_len': SEQ, 'batch_size': 3, 'workers_count': 1, 'seed': 2, **kwargs}
    with make_token_loader(url, **kwargs) as loader:
        return [numpy_batch(batch) for batch in loader]


FIELDS = {'mask': dict(loss_mask_field='completion_mask'),
          'prompt column': dict(tokens_field='completion_ids', prompt_field='prompt_ids')}


@pytest.mark.parametrize('fields', FIELDS.values(), ids=FIELDS.keys())
@pytest.mark.parametrize('case', [dict(packing='concat', labels='hf'), dict(packing='first_fit', labels='shifted'),
                                  dict(packing='none', labels='hf', eos_id=EOS),
                                  dict(packing='first_fit', labels='hf', eos_id=EOS, shuffle_buffer=4)],
                         ids=['concat-hf', 'first_fit-shifted', 'none-hf-eos', 'first_fit-hf-shuffled'])
def test_prompt_tokens_are_inputs_but_never_labels(url, fields, case):
    batches = _batches(url, **fields, **case)
    plain = _batches(url, **case)  # the same documents without a mask: the same inputs
    assert len(batches) == len(plain)
    prompts = 0
    for batch, reference in zip(batches, plain, strict=True):
        np.testing.assert_array_equal(batch['input_ids'], reference['input_ids'])
        np.testing.assert_array_equal(batch['position_ids'], reference['position_ids'])
        np.testing.assert_array_equal(batch['labels'], _expected_labels(batch, case['labels']))
        prompts += int(_is_prompt(batch['input_ids']).sum())
    assert prompts == PROMPT.sum(), 'every prompt token is in the inputs'


def test_a_restored_loader_continues_the_masked_stream_bitwise(url):
    case = dict(loss_mask_field='completion_mask', packing='first_fit', pack_window=3, shuffle_buffer=3, num_epochs=2)
    whole = _batches(url, **case)
    with make_token_loader(url, seq_len=SEQ, batch_size=3, workers_count=1, seed=2, **case) as loader:
        head = []
        for batch in loader:
            head.append(numpy_batch(batch))
            if len(head) == 5:
                state = json.loads(json.dumps(loader.state_dict()))
                break
    with make_token_loader(url, seq_len=SEQ, batch_size=3, workers_count=1, seed=2, **case) as loader:
        loader.load_state_dict(state)
        tail = [numpy_batch(batch) for batch in loader]
    assert len(head) + len(tail) == len(whole)
    for got, expected in zip(head + tail, whole, strict=True):
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])


def test_two_ranks_continued_on_three_train_on_every_response_token_once(url):
    """An elastic restore cuts partly delivered documents to the ranges left: the mask is cut with them."""
    case = dict(loss_mask_field='completion_mask', packing='concat', seq_len=SEQ, batch_size=2, workers_count=1,
                seed=2)
    seen, states = [], []
    for rank in range(2):
        with make_token_loader(url, cur_shard=rank, shard_count=2, **case) as loader:
            batches = iter(loader)
            for _ in range(3):
                seen.append(numpy_batch(next(batches)))
            states.append(json.loads(json.dumps(loader.state_dict())))
    gathered = {'format': 'petastorm.tokens', 'version': 1, 'ranks': states}
    for rank in range(3):
        with make_token_loader(url, cur_shard=rank, shard_count=3, **case) as loader:
            loader.load_state_dict(gathered)
            seen += [numpy_batch(batch) for batch in loader]
    ids = np.concatenate([batch['input_ids'].ravel() for batch in seen])
    labels = np.concatenate([batch['labels'].ravel() for batch in seen])
    for batch in seen:
        np.testing.assert_array_equal(batch['labels'], _expected_labels(batch, 'hf'))
    tokens = ids[ids != 0]
    assert len(tokens) == len(set(tokens.tolist())) == LENGTHS.sum(), 'every token once'
    trained = labels[labels != IGNORE_INDEX]
    assert not _is_prompt(trained).any()
    assert len(trained) >= (LENGTHS - PROMPT).sum() - len(seen) * 2, 'the responses, but for a row start each'


def test_text_prompts_tokenized_in_the_workers_are_left_out_of_the_loss(tmp_path):
    rng = np.random.default_rng(5)
    asked = [' '.join(rng.choice(WORDS[:10], int(n))) for n in rng.integers(1, 8, 40)]  # ids 1..10
    answered = [' '.join(rng.choice(WORDS[10:], int(n))) for n in rng.integers(1, 8, 40)]  # ids 11..
    path = tmp_path / 'text.parquet'
    pq.write_table(pa.table({'prompt': asked, 'completion': answered}), str(path), row_group_size=9)
    batches = _batches(f'file://{path}', text_field='completion', prompt_field='prompt', tokenizer=word_ids,
                       packing='first_fit', eos_id=99, shuffle_documents=False)
    ids = np.concatenate([batch['input_ids'] for batch in batches])
    labels = np.concatenate([batch['labels'] for batch in batches])
    positions = np.concatenate([batch['position_ids'] for batch in batches])
    assert sorted(ids[(ids > 0) & (ids <= 10)].tolist()) == sorted(np.concatenate(word_ids(asked)).tolist())
    trained = (ids > 10) & (positions != 0)
    np.testing.assert_array_equal(labels, np.where(trained, ids, IGNORE_INDEX))


def test_bad_sft_arguments_and_columns_are_named(url):
    with pytest.raises(TokenColumnError, match=r"loss_mask_field='short_mask' has 1 values in a row whose "
                                               r"tokens_field='input_ids' has \d+ tokens"):
        _batches(url, loss_mask_field='short_mask')
    with pytest.raises(TokenColumnError, match=r"loss_mask_field='float_mask' .* holds float32 values .* one list of "
                                               r'0/1 per row'):
        _batches(url, loss_mask_field='float_mask')
    with pytest.raises(ValueError, match='labels=None makes none'):
        _batches(url, loss_mask_field='completion_mask', labels=None)
    with pytest.raises(ValueError, match='pass prompt_field='):
        _batches(url, loss_mask_field='completion_mask', tokenizer=word_ids)
    with pytest.raises(NoMatchingFieldsError, match="'no_such_column'"), \
            pytest.warns(UserWarning, match='match no field'):
        _batches(url, prompt_field='no_such_column')
