"""Laws of packing: every token exactly once, rows and their boundaries, and the arrays a batch holds.

The corpus's tokens say which document and position they are (``support.token_corpus``), so each law is checked
against the tokens themselves: a token continuing its document follows it by one.
"""

import collections

import numpy as np
import pytest

from petastorm.tokens import IGNORE_INDEX, make_token_dataset
from support.token_corpus import BOS, EOS, SPAN, batch_tokens, expected_tokens, lognormal_lengths, write_corpus

pytest.importorskip('grain')  # the batches are read as numpy through the Grain form (no torch needed)

SEQ = 32
LENGTHS = lognormal_lengths(150, median=20, seed=3, longest=140)


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp('packing') / 'docs.parquet', LENGTHS, row_group_size=23)


def _batches(url, **kwargs):
    kwargs.setdefault('seq_len', SEQ)
    if 'max_tokens' not in kwargs:
        kwargs.setdefault('batch_size', 3)
    kwargs.setdefault('reader_pool_type', 'dummy')
    with make_token_dataset(url, **kwargs) as dataset:
        return [dict(batch) for batch in dataset], dataset.stats()


def _continues(ids):
    """True where a token is the next token of the same document as the token before it in the row."""
    out = np.zeros(ids.shape, dtype=bool)
    out[:, 1:] = (ids[:, 1:] == ids[:, :-1] + 1) & (ids[:, 1:] % SPAN != 1) & (ids[:, :-1] != 0)
    return out


@pytest.mark.parametrize('packing', ['concat', 'first_fit', 'none'])
@pytest.mark.parametrize('boundaries', [{}, {'eos_id': EOS}, {'bos_id': BOS, 'eos_id': EOS}])
def test_every_token_is_delivered_exactly_once(url, packing, boundaries):
    batches, stats = _batches(url, packing=packing, **boundaries)
    delivered = collections.Counter(t for batch in batches for t in batch_tokens(batch))
    assert delivered == expected_tokens(LENGTHS)
    added = sum(1 for name in ('bos_id', 'eos_id') if name in boundaries) * len(LENGTHS)
    assert stats['tokens'] == [int(LENGTHS.sum()) + added]
    if 'eos_id' in boundaries:
        assert sum(int((batch['input_ids'] == EOS).sum()) for batch in batches) == len(LENGTHS)


@pytest.mark.parametrize('packing', ['concat', 'first_fit', 'none'])
def test_rows_and_position_ids_follow_the_documents(url, packing):
    batches, _ = _batches(url, packing=packing, return_document_ids=True, return_attention_mask=True)
    for batch in batches:
        ids, positions = batch['input_ids'], batch['position_ids']
        assert ids.shape == positions.shape == (3, SEQ)
        assert ids.dtype == positions.dtype == np.int64
        real = ids != 0
        continues = _continues(ids)
        # 0 where a document (or a piece of one) starts a segment, else one more than the token before.
        assert (positions[:, 0] == 0).all()
        assert (positions[:, 1:][continues[:, 1:]] == positions[:, :-1][continues[:, 1:]] + 1).all()
        assert (positions[real & ~continues] == 0).all()
        assert (batch['attention_mask'] == real).all()
        segment = np.cumsum(positions == 0, axis=1) - 1
        assert (batch['document_ids'][real] == segment[real]).all()
        assert (batch['document_ids'][~real] == -1).all()
        lengths = real.sum(axis=1)
        assert all(real[row, :n].all() and not real[row, n:].any() for row, n in enumerate(lengths)), \
            'padding only at the end of a row'
        if packing == 'first_fit':
            starts = ids[real & ~continues]
            # a document that fits in a row is never cut: every segment but a long document's pieces starts it
            assert all(t % SPAN == 1 or LENGTHS[(t - 1) // SPAN] > SEQ for t in starts.tolist())
        if packing == 'none':
            assert ((real & ~continues).sum(axis=1) <= 1).all(), 'one document (or piece) per row'
    if packing == 'concat':
        full = [int((batch['input_ids'] != 0).sum()) for batch in batches]
        assert all(n == 3 * SEQ for n in full[:-1]), 'rows of concat are full but the last'


@pytest.mark.parametrize('style', ['hf', 'shifted'])
def test_labels_never_predict_across_documents_and_ignore_padding(url, style):
    batches, _ = _batches(url, packing='first_fit', labels=style)
    for batch in batches:
        ids, labels, positions = batch['input_ids'], batch['labels'], batch['position_ids']
        starts = positions == 0
        if style == 'hf':
            assert (labels[~starts & (ids != 0)] == ids[~starts & (ids != 0)]).all()
            assert (labels[starts | (ids == 0)] == IGNORE_INDEX).all()
        else:
            same = np.zeros(ids.shape, dtype=bool)
            same[:, :-1] = ~starts[:, 1:] & (ids[:, 1:] != 0)
            assert (labels[same] == ids[:, 1:][same[:, :-1]]).all()
            assert (labels[~same] == IGNORE_INDEX).all()
        # both styles predict the same number of tokens: one per token that follows another of its segment
        assert (labels != IGNORE_INDEX).sum() == ((~starts) & (ids != 0)).sum()


def test_no_labels_and_cu_seqlens_bound_every_segment(url):
    batches, _ = _batches(url, labels=None, return_cu_seqlens=True)
    for batch in batches:
        assert 'labels' not in batch
        flat = batch['position_ids'].reshape(-1)
        bounds = batch['cu_seqlens']
        assert bounds.dtype == np.int32
        assert bounds.tolist() == np.flatnonzero(flat == 0).tolist() + [flat.size]
        assert int(batch['max_seqlen']) == int(np.diff(bounds).max())


def test_a_block_causal_mask_from_position_ids_keeps_documents_apart(url):
    batch = _batches(url, packing='concat', return_document_ids=True)[0][1]
    positions = batch['position_ids'][0]
    segment = np.cumsum(positions == 0)
    mask = (segment[:, None] == segment[None, :]) & np.tri(SEQ, dtype=bool)
    document = batch['document_ids'][0]
    assert (mask == ((document[:, None] == document[None, :]) & np.tri(SEQ, dtype=bool))).all()


def test_first_fit_pads_little_on_a_long_tailed_corpus(tmp_path):
    lengths = lognormal_lengths(4000, median=60, sigma=1.0, seed=5, longest=4000)
    url = write_corpus(tmp_path / 'lognormal.parquet', lengths, row_group_size=500)
    _, stats = _batches(url, seq_len=200, batch_size=16, packing='first_fit', pack_window=64)
    _, plain = _batches(url, seq_len=200, batch_size=16, packing='none')
    assert stats['tokens'] == plain['tokens'] == [int(lengths.sum())]
    assert stats['padding_tokens'] / (stats['tokens'][0] + stats['padding_tokens']) < 0.02
    assert stats['padding_tokens'] < plain['padding_tokens'] / 20


def test_long_documents_in_packing_none_split_truncate_or_fail(url):
    split, _ = _batches(url, packing='none')
    assert collections.Counter(t for b in split for t in batch_tokens(b)) == expected_tokens(LENGTHS)
    with pytest.warns(UserWarning, match="long_documents='truncate'"):
        cut, stats = _batches(url, packing='none', long_documents='truncate')
    kept = collections.Counter(t for b in cut for t in batch_tokens(b))
    assert kept == collections.Counter(t for t in expected_tokens(LENGTHS) if (t - 1) % SPAN < SEQ)
    assert stats['tokens_truncated'] == int(np.maximum(LENGTHS - SEQ, 0).sum()) > 0
    assert sum(len(b['input_ids']) for b in cut) == -(-len(LENGTHS) // 3) * 3, 'one row per document'
    with pytest.raises(ValueError, match=r"more than seq_len=32.*long_documents='split'"):
        _batches(url, packing='none', long_documents='error')


def test_token_budgets(url):
    packed, _ = _batches(url, max_tokens=100)
    assert {b['input_ids'].shape for b in packed} == {(3, SEQ)}, 'max_tokens // seq_len rows'
    single, _ = _batches(url, packing='none', max_tokens=100)
    shapes = [b['input_ids'].shape for b in single]
    assert all(rows * width <= 100 for rows, width in shapes)
    assert len(set(shapes)) > 1
    assert collections.Counter(t for b in single for t in batch_tokens(b)) == expected_tokens(LENGTHS)
    for batch in single:  # the width is the longest row's: some row has no padding
        assert (batch['input_ids'][:, -1] != 0).any()


def test_the_shuffle_buffer_reorders_rows_reproducibly(url):
    plain, _ = _batches(url, seed=1)
    shuffled, _ = _batches(url, seed=1, shuffle_buffer=20)
    again, _ = _batches(url, seed=1, shuffle_buffer=20)
    other, _ = _batches(url, seed=2, shuffle_buffer=20)

    def rows(batches):
        return [tuple(row) for b in batches for row in b['input_ids'].tolist()]

    assert sorted(rows(shuffled)) == sorted(rows(plain))
    assert rows(shuffled) != rows(plain)
    assert rows(again) == rows(shuffled)
    assert collections.Counter(t for b in other for t in batch_tokens(b)) == expected_tokens(LENGTHS)


def test_batches_kept_by_the_caller_are_never_written_again(url, monkeypatch):
    """Rows are cut ahead into arrays that are used again once no batch refers to them: one still held is not."""
    monkeypatch.setattr('petastorm.tokens._packers.CUT_AHEAD_TOKENS', 4 * SEQ)  # many cuts of 4 rows
    kwargs = dict(seq_len=SEQ, batch_size=2, reader_pool_type='dummy')
    with make_token_dataset(url, **kwargs) as dataset:
        copied = [{name: np.array(value) for name, value in batch.items()} for batch in dataset]
    with make_token_dataset(url, **kwargs) as dataset:
        kept = []
        for index, batch in enumerate(dataset):
            if index % 3 == 0:  # some batches kept as they came (views), the others dropped
                kept.append((index, batch))
    assert len(kept) > 5
    for index, batch in kept:
        assert all(np.array_equal(batch[name], copied[index][name]) for name in batch)
