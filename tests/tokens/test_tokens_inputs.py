"""What a token loader reads: token columns of every integer list type, text through each kind of tokenizer (in the
reader's threads or processes), files written by Hugging Face ``datasets`` and by pyarrow, and bad input refused
with a message naming the field and the fix.
"""

import collections

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm.errors import NoMatchingFieldsError
from petastorm.tokens import TokenColumnError, TokenizerOutputError, make_token_dataset
from support.token_corpus import (
    EOS,
    batch_tokens,
    bpe_tokenizer,
    expected_tokens,
    lognormal_lengths,
    texts,
    word_ids,
    write_corpus,
)

pytest.importorskip('grain')

LENGTHS = lognormal_lengths(60, median=15, seed=2, longest=70)
TEXTS = texts(80, seed=4)


def _tokens(url, **kwargs):
    kwargs.setdefault('seq_len', 16)
    kwargs.setdefault('batch_size', 4)
    kwargs.setdefault('workers_count', 1)
    with make_token_dataset(url, **kwargs) as dataset:
        return collections.Counter(t for batch in dataset for t in batch_tokens(batch)), dataset.stats()


@pytest.fixture(scope='module')
def text_url(tmp_path_factory):
    path = tmp_path_factory.mktemp('text') / 'text.parquet'
    pq.write_table(pa.table({'text': TEXTS, 'id': np.arange(len(TEXTS))}), str(path), row_group_size=13)
    return f'file://{path}'


@pytest.mark.parametrize(('value_type', 'list_type'), [(pa.int32(), 'list'), (pa.int64(), 'large_list'),
                                                      (pa.uint16(), 'list'), (pa.uint32(), 'list')])
def test_token_columns_of_any_integer_list_type(tmp_path, value_type, list_type):
    lengths = LENGTHS[:15] if value_type == pa.uint16() else LENGTHS  # the tokens of 15 documents fit 16 bits
    url = write_corpus(tmp_path / 'ids.parquet', lengths, value_type=value_type, list_type=list_type)
    assert _tokens(url)[0] == expected_tokens(lengths)


def test_a_fixed_length_token_column(tmp_path):
    ids = np.arange(40 * 8, dtype=np.int64).reshape(40, 8) + 1
    pq.write_table(pa.table({'ids': pa.FixedSizeListArray.from_arrays(pa.array(ids.ravel()), 8)}),
                   str(tmp_path / 'fixed.parquet'))
    tokens, _ = _tokens(f'file://{tmp_path}/fixed.parquet', tokens_field='ids', seq_len=12)
    assert tokens == collections.Counter(ids.ravel().tolist())


def _word_counts(texts_, eos=None):
    counts = collections.Counter(t for ids in word_ids(texts_) for t in ids)
    return counts


def test_a_callable_tokenizer_in_threads_and_processes_sees_the_same_text(text_url):
    by_threads, stats = _tokens(text_url, text_field='text', tokenizer=word_ids, workers_count=2)
    assert by_threads == _word_counts(TEXTS)
    by_processes, _ = _tokens(text_url, text_field='text', tokenizer=word_ids, reader_pool_type='process',
                              workers_count=2)
    assert by_processes == by_threads
    assert stats['tokens'] == [sum(by_threads.values())]


def test_a_tokenizers_bpe_and_a_transformers_tokenizer(text_url):
    tokenizers = pytest.importorskip('tokenizers')
    bpe = bpe_tokenizer(TEXTS)
    assert isinstance(bpe, tokenizers.Tokenizer)
    expected = collections.Counter(t for e in bpe.encode_batch(TEXTS, add_special_tokens=False) for t in e.ids)
    # text_field defaults to 'text' when a tokenizer is given (the Hub's layout); a process pool pickles it
    assert _tokens(text_url, tokenizer=bpe, reader_pool_type='process', workers_count=2)[0] == expected
    transformers = pytest.importorskip('transformers')
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe)
    assert _tokens(text_url, tokenizer=wrapped)[0] == expected
    with_eos, _ = _tokens(text_url, tokenizer=wrapped, eos_id=EOS, packing='first_fit')
    assert with_eos == expected


def test_files_written_by_hugging_face_datasets(tmp_path):
    datasets = pytest.importorskip('datasets')
    ids = [list(range(i * 100 + 1, i * 100 + 1 + n)) for i, n in enumerate(LENGTHS.tolist())]
    path = tmp_path / 'hub.parquet'
    datasets.Dataset.from_dict({'input_ids': ids, 'text': TEXTS[:len(ids)]}).to_parquet(str(path))
    tokens, _ = _tokens(f'file://{path}')  # tokens_field defaults to 'input_ids'
    assert tokens == collections.Counter(t for doc in ids for t in doc)
    assert _tokens(f'file://{path}', tokenizer=word_ids)[0] == _word_counts(TEXTS[:len(ids)])


def test_bad_input_is_refused_naming_the_field_and_the_fix(tmp_path, text_url):
    floats = tmp_path / 'floats.parquet'
    pq.write_table(pa.table({'input_ids': pa.array([[1.5, 2.0], [3.0]], pa.list_(pa.float32()))}), str(floats))
    with pytest.raises(TokenColumnError, match=r"tokens_field='input_ids'.*float32.*list of integer token ids"):
        make_token_dataset(f'file://{floats}', seq_len=8, batch_size=2)
    with pytest.raises(TokenColumnError, match=r"tokens_field='text'.*pass text_field= and a tokenizer"):
        make_token_dataset(text_url, tokens_field='text', seq_len=8, batch_size=2)
    with pytest.raises(ValueError, match=r"text_field='text' needs tokenizer="):
        make_token_dataset(text_url, text_field='text', seq_len=8, batch_size=2)
    with pytest.raises(NoMatchingFieldsError, match=r"tokens_field='input_ids' is not a column of .*text.parquet"):
        make_token_dataset(text_url, seq_len=8, batch_size=2)
    for seq_len in (0, -3, 2.5):
        with pytest.raises(ValueError, match='seq_len must be a positive integer'):
            make_token_dataset(text_url, seq_len=seq_len, batch_size=2)
    with pytest.raises(ValueError, match='either batch_size= .* or max_tokens='):
        make_token_dataset(text_url, seq_len=8, batch_size=2, max_tokens=64)
    with pytest.raises(ValueError, match='weights= mixes several sources'):
        make_token_dataset(text_url, seq_len=8, batch_size=2, weights=[1.0])
    with pytest.raises(ValueError, match="long_documents='truncate' applies to packing='none'"):
        make_token_dataset(text_url, seq_len=8, batch_size=2, long_documents='truncate')


@pytest.mark.parametrize(('tokenizer', 'message'), [
    (lambda batch: [[1, 2]], r'returned 1 items for \d+ texts'),
    (lambda batch: ['ab' for _ in batch], 'one list of integer token ids per text'),
    (lambda batch: [[1.5] for _ in batch], 'one list of integer token ids per text'),
    (lambda batch: [[-1] for _ in batch], r'outside \[0, 2\*\*31\)'),
])
def test_a_tokenizer_returning_the_wrong_shape_is_named(text_url, tokenizer, message):
    with pytest.raises(TokenizerOutputError, match=rf"callable tokenizer .*text_field='text'.*{message}"):
        _tokens(text_url, tokenizer=tokenizer, reader_pool_type='dummy')
