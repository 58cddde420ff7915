"""Corpora of documents for the token loader tests, whose tokens say where they come from.

Token ``k`` of document ``d`` is ``d * SPAN + k + 1``: every token of a corpus is distinct and never 0 (the
padding token), so a test can check that each token was delivered exactly once, and where a row's documents
start, from the token ids alone.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SPAN = 4096
#: ids beyond every document token, for ``bos_id``/``eos_id``.
BOS, EOS = 1 << 28, (1 << 28) + 1


def document(index: int, length: int) -> np.ndarray:
    """The tokens of document ``index``."""
    return np.arange(length, dtype=np.int32) + index * SPAN + 1


def lognormal_lengths(count: int, median: float = 40, sigma: float = 1.0, seed: int = 0,
                      longest: int = SPAN - 1) -> np.ndarray:
    """Document lengths of a log-normal distribution (at least 1 token, at most ``longest``)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), sigma, count).astype(np.int64), 1, longest)


def write_corpus(path: Path, lengths: np.ndarray, row_group_size: int = 37, column: str = 'input_ids',
                 value_type: pa.DataType | None = None, list_type: str = 'list', first: int = 0) -> str:
    """A Parquet file of one document per row (written by pyarrow), documents numbered from ``first``; its URL.

    Tokens are int32 unless ``value_type`` says otherwise.
    """
    value_type = pa.int32() if value_type is None else value_type
    values = pa.array(np.concatenate([document(first + i, int(n)) for i, n in enumerate(lengths)]), value_type)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    make = pa.LargeListArray if list_type == 'large_list' else pa.ListArray
    tokens = make.from_arrays(pa.array(offsets, pa.int64() if list_type == 'large_list' else pa.int32()), values)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: tokens, 'doc': np.arange(len(lengths))}), str(path),
                   row_group_size=row_group_size)
    return f'file://{path}'


def expected_tokens(lengths: np.ndarray, epochs: int = 1, first: int = 0) -> collections.Counter:
    """Every token of the corpus (documents numbered from ``first``), ``epochs`` times."""
    counter: collections.Counter = collections.Counter()
    for index, length in enumerate(lengths):
        counter.update(document(first + index, int(length)).tolist())
    return counter if epochs == 1 else collections.Counter({k: v * epochs for k, v in counter.items()})


def batch_tokens(batch: dict, pad_id: int = 0) -> list[int]:
    """The tokens of a batch that are not padding or added boundaries (torch tensors or numpy arrays)."""
    ids = np.asarray(batch['input_ids'])
    keep = (ids != pad_id) & (ids < BOS)
    return ids[keep].tolist()


def numpy_batch(batch: dict) -> dict:
    """A batch's arrays as numpy copies (``max_seqlen`` as an int)."""
    return {name: value if isinstance(value, int) else np.array(value.numpy() if hasattr(value, 'numpy') else value)
            for name, value in batch.items()}


WORDS = ['the', 'a', 'token', 'loader', 'reads', 'parquet', 'documents', 'and', 'packs', 'rows', 'of', 'text',
         'model', 'language', 'train', 'exact', 'resume', 'elastic', 'ranks', 'every', 'once']


def texts(count: int, seed: int = 0, median_words: float = 12) -> list[str]:
    """Documents of words (log-normal lengths), reproducible."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median_words), 0.8, count).astype(int), 0, 200)
    return [' '.join(WORDS[i] for i in rng.integers(0, len(WORDS), n)) for n in lengths]


def word_ids(batch: list[str]) -> list[list[int]]:
    """A tokenizer of the callable kind: one id per word (picklable, for process pools)."""
    return [[WORDS.index(word) + 1 for word in text.split()] for text in batch]


def bpe_tokenizer(corpus: list[str], vocab_size: int = 200):
    """A ``tokenizers`` BPE trained on ``corpus``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token='[UNK]'))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=['[UNK]']))
    return tokenizer
