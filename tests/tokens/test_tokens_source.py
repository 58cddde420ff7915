"""The documents by number (``make_document_source``): records as pyarrow reads the rows, Grain's own pipelines
over them (shuffle, packing, checkpoints), pickling for Grain's worker processes, and its errors."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm.tokens import make_document_source
from support.token_corpus import BOS, EOS, document, expected_tokens, lognormal_lengths, texts, word_ids, write_corpus

LENGTHS = np.array([3, 0, 5, 1, 7, 2, 9, 4, 4, 6, 1, 8, 2, 3, 5, 0, 2, 6, 3, 1])


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp('source')
    write_corpus(root / 'part-0.parquet', LENGTHS[:12], row_group_size=5)  # row groups of 5, 5 and 2 rows
    write_corpus(root / 'part-1.parquet', LENGTHS[12:], row_group_size=3, first=12)
    return f'file://{root}'


def test_records_are_the_rows_in_file_order_with_the_added_tokens(url):
    source = make_document_source(url, bos_id=BOS, eos_id=EOS)
    assert len(source) == len(LENGTHS)
    for index, length in enumerate(LENGTHS):
        record = source[index]
        assert list(record) == ['input_ids']
        assert record['input_ids'].dtype == np.int64
        assert record['input_ids'].tolist() == [BOS, *document(index, int(length)).tolist(), EOS]
    assert source[-1]['input_ids'].tolist() == source[len(LENGTHS) - 1]['input_ids'].tolist()


def test_an_empty_document_is_an_empty_record(url):
    source = make_document_source(url)
    assert source[1]['input_ids'].tolist() == []
    assert source[15]['input_ids'].tolist() == []
    assert source[2]['input_ids'].tolist() == document(2, 5).tolist()


def test_bad_record_numbers_are_refused_naming_the_size(url):
    source = make_document_source(url)
    with pytest.raises(IndexError, match=r'record 20 is out of range: .* has 20 documents'):
        source[20]
    with pytest.raises(IndexError, match='record -21'):
        source[-21]
    with pytest.raises(TypeError, match='record number'):
        source['3']


def test_text_is_tokenized_a_row_group_at_a_time_and_each_row_group_read_once_in_order(tmp_path):
    corpus = texts(23, seed=3)
    pq.write_table(pa.table({'text': corpus}), tmp_path / 'text.parquet', row_group_size=6)
    calls = []

    def tokenizer(batch):
        calls.append(len(batch))
        return word_ids(batch)

    source = make_document_source(f'file://{tmp_path}', text_field='text', tokenizer=tokenizer, eos_id=99,
                                  cached_row_groups=1)
    calls.clear()  # opening the source may read a first batch to check the tokenizer's output
    assert [source[i]['input_ids'].tolist() for i in range(len(corpus))] == [ids + [99] for ids in word_ids(corpus)]
    assert calls == [6, 6, 6, 5]


def test_prompts_and_loss_masks_come_as_a_loss_mask(tmp_path):
    prompts = pa.array([[7, 8], [9], []], pa.list_(pa.int32()))
    answers = pa.array([[1, 2, 3], [4], [5, 6]], pa.list_(pa.int32()))
    pq.write_table(pa.table({'prompt': prompts, 'answer': answers}), tmp_path / 'sft.parquet')
    source = make_document_source(f'file://{tmp_path}', tokens_field='answer', prompt_field='prompt', eos_id=0)
    first = source[0]
    assert first['input_ids'].tolist() == [7, 8, 1, 2, 3, 0]
    assert first['loss_mask'].tolist() == [0, 0, 1, 1, 1, 1]
    assert source[2]['loss_mask'].tolist() == [1, 1, 1]

    masks = pa.array([[1, 0, 1], [0], [1, 1]], pa.list_(pa.int8()))
    pq.write_table(pa.table({'ids': answers, 'mask': masks}), tmp_path / 'sft.parquet')
    masked = make_document_source(f'file://{tmp_path}', tokens_field='ids', loss_mask_field='mask')
    assert masked[0]['input_ids'].tolist() == [1, 2, 3]
    assert masked[0]['loss_mask'].tolist() == [1, 0, 1]


def test_a_pickled_source_reads_as_the_original_with_a_cache_of_its_own(url):
    source = make_document_source(url, eos_id=EOS)
    source[4]
    copy = pickle.loads(pickle.dumps(source))
    assert not copy._cache
    assert [copy[i]['input_ids'].tolist() for i in range(len(copy))] == \
        [source[i]['input_ids'].tolist() for i in range(len(source))]


def test_threads_reading_one_row_group_at_once_read_it_once(url, monkeypatch):
    source = make_document_source(url)
    reads = []
    read = source._read
    gate = threading.Barrier(4)

    def counted(piece):
        reads.append(piece)
        time.sleep(0.2)  # the other threads ask while this read is under way
        return read(piece)

    monkeypatch.setattr(source, '_read', counted)
    results = {}

    def work(index):
        gate.wait()
        results[index] = source[index]['input_ids'].tolist()

    threads = [threading.Thread(target=work, args=(index,)) for index in (0, 2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reads == [0]
    assert results == {index: document(index, int(LENGTHS[index])).tolist() for index in (0, 2, 3, 4)}


def test_a_failed_read_reaches_every_waiting_caller_and_is_tried_again(url, monkeypatch):
    source = make_document_source(url)
    read = source._read
    failures = [OSError('the store went away')]
    gate = threading.Barrier(3)

    def flaky(piece):
        time.sleep(0.2)  # the other callers wait for this read
        if failures:
            raise failures.pop()
        return read(piece)

    monkeypatch.setattr(source, '_read', flaky)
    outcomes = {}

    def work(index):
        gate.wait()
        try:
            outcomes[index] = source[index]['input_ids'].tolist()
        except OSError as err:
            outcomes[index] = str(err)

    threads = [threading.Thread(target=work, args=(index,)) for index in (0, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == dict.fromkeys((0, 2, 3), 'the store went away')
    assert source[0]['input_ids'].tolist() == document(0, 3).tolist()


def test_reader_options_that_change_the_rows_are_refused(url):
    with pytest.raises(ValueError, match=r"reader_options \['filters'\] are not taken"):
        make_document_source(url, reader_options={'filters': [('doc', '>', 3)]})
    with pytest.raises(ValueError, match='cached_row_groups'):
        make_document_source(url, cached_row_groups=0)
    with pytest.raises(ValueError, match='text_field'):
        make_document_source(url, text_field='text')


def test_grain_shuffles_packs_and_restores_a_pipeline_over_the_source(tmp_path):
    grain = pytest.importorskip('grain')
    lengths = lognormal_lengths(120, median=20, seed=5)
    write_corpus(tmp_path / 'corpus.parquet', lengths, row_group_size=16)
    source = make_document_source(f'file://{tmp_path}', eos_id=EOS)

    def pipeline():
        # A window that divides the length: grain 0.2's window shuffle repeats records of a shorter last window.
        documents = grain.experimental.WindowShuffleMapDataset(grain.MapDataset.source(source), window_size=40,
                                                               seed=7)
        return grain.experimental.ConcatThenSplitIterDataset(documents.to_iter_dataset(),
                                                             length_struct={'input_ids': 64})

    rows = [row['input_ids'].tolist() for row in pipeline()]
    assert all(len(row) == 64 for row in rows)
    delivered = [token for row in rows for token in row if token != EOS and token != 0]
    assert sorted(delivered) == sorted(expected_tokens(lengths).elements())
    assert delivered != sorted(delivered)  # shuffled within the windows

    iterator = iter(pipeline())
    head = [next(iterator)['input_ids'].tolist() for _ in range(5)]
    state = iterator.get_state()
    restored = iter(pipeline())
    restored.set_state(state)
    assert head + [row['input_ids'].tolist() for row in restored] == rows
