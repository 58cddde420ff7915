"""Tokenizing a text column in the reader's workers, a whole row group at a time.

:func:`tokenizing_transform` makes the ``TransformSpec`` a token loader's reader runs: its function receives the
row group's text column and returns the token ids of every row, so that tokenization runs in the reader's
threads or processes, batched, beside the reading of the next row groups, never per row in the training process.
The function object (:class:`TokenizeColumn`) pickles with the tokenizer, as a process pool needs.

Three kinds of tokenizer are taken, told apart by what they are:

* a ``tokenizers.Tokenizer``: ``encode_batch_fast`` (or ``encode_batch``) without special tokens;
* a ``transformers`` tokenizer (``PreTrainedTokenizerBase``): called on the list with ``add_special_tokens=False``;
* any other callable: a function from a list of strings to a list of token id lists (or arrays).

Special tokens come from the loader's ``bos_id``/``eos_id``, so that every tokenizer marks document boundaries
the same way.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import numpy as np

from petastorm.errors import PetastormError
from petastorm.tokens._documents import TokenColumnError, after_prompts
from petastorm.transform import TransformSpec

__all__ = ['TOKENS_COLUMN', 'TokenizeColumn', 'TokenizerOutputError', 'describe_tokenizer', 'flat_token_ids',
           'tokenizer_kind', 'tokenizing_transform']

#: The column the tokenizing transform produces in place of the text column.
TOKENS_COLUMN = '__petastorm_tokens'


class TokenizerOutputError(PetastormError, TypeError):
    """A tokenizer returned something other than one list of integer token ids per text."""


def tokenizer_kind(tokenizer: Any) -> str:
    """``'tokenizers'``, ``'transformers'`` or ``'callable'``: how the tokenizer is called."""
    backend = sys.modules.get('tokenizers')
    if backend is not None and isinstance(tokenizer, backend.Tokenizer):
        return 'tokenizers'
    hf = sys.modules.get('transformers')
    if hf is not None and isinstance(tokenizer, hf.PreTrainedTokenizerBase):
        return 'transformers'
    if callable(tokenizer):
        return 'callable'
    raise TypeError(f'tokenizer must be a tokenizers.Tokenizer, a transformers tokenizer or a function from a list '
                    f'of strings to a list of token id lists, got {type(tokenizer).__name__}')


def describe_tokenizer(tokenizer: Any) -> str:
    """How a tokenizer is named in messages."""
    name = getattr(tokenizer, '__qualname__', None) or type(tokenizer).__name__
    return f'{tokenizer_kind(tokenizer)} tokenizer {name}'


class TokenizeColumn:
    """The ``TransformSpec`` function: a DataFrame of a row group's text in, its token ids out.

    Args:
        tokenizer: the tokenizer (see the module's documentation).
        text_field: the column of text.
        prompt_field: a column of prompts, tokenized and put before each text's tokens, marked as left out of the
            loss (:func:`~petastorm.tokens._documents.without_loss`), or None.
    """

    def __init__(self, tokenizer: Any, text_field: str, prompt_field: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.text_field = text_field
        self.prompt_field = prompt_field
        self.kind = tokenizer_kind(tokenizer)

    def encode(self, texts: list[str]) -> list[Any]:
        """One sequence of token ids per text, as the tokenizer returns them."""
        tokenizer = self.tokenizer
        if self.kind == 'tokenizers':
            encode = getattr(tokenizer, 'encode_batch_fast', tokenizer.encode_batch)
            return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]
        if self.kind == 'transformers':
            encoded = tokenizer(texts, add_special_tokens=False, return_attention_mask=False,
                                return_token_type_ids=False)
            return list(encoded['input_ids'])
        return tokenizer(texts)

    def __call__(self, frame: Any) -> Any:
        import pandas as pd

        values, bounds = self._flat(frame, self.text_field)
        if self.prompt_field is not None:
            if self.prompt_field not in frame.columns:
                raise TokenColumnError(f'prompt_field={self.prompt_field!r} is not a column of the dataset; its '
                                       f'columns read are {list(frame.columns)}')
            values, bounds = after_prompts(self._flat(frame, self.prompt_field), values, bounds)
        return pd.DataFrame({TOKENS_COLUMN: _per_row(values, bounds)}, index=frame.index)

    def _flat(self, frame: Any, field: str) -> tuple[np.ndarray, np.ndarray]:
        column = frame[field]
        if column.isna().any():
            column = column.fillna('')  # a null text is an empty document
        texts = column.tolist()
        return flat_token_ids(self.encode(texts), len(texts), self.tokenizer, field)


def _per_row(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    out = np.empty(len(bounds) - 1, dtype=object)
    for index in range(len(out)):
        out[index] = values[bounds[index]:bounds[index + 1]]
    return out


def flat_token_ids(encoded: Any, count: int, tokenizer: Any, field: str) -> tuple[np.ndarray, np.ndarray]:
    """The tokenizer's output as one int32 array of every text's ids, and the int64 bounds of each text's.

    Raises:
        TokenizerOutputError: not one sequence of integers per text; the message names the tokenizer, the field and
            what came back.
    """
    what = f'the {describe_tokenizer(tokenizer)} (text_field={field!r})'
    if isinstance(encoded, (str, bytes)) or not hasattr(encoded, '__len__') or len(encoded) != count:
        got = f'{len(encoded)} items' if hasattr(encoded, '__len__') else type(encoded).__name__
        raise TokenizerOutputError(f'{what} returned {got} for {count} texts; it must return one list of token ids '
                                   f'per text (a function from a list of strings to a list of lists of ints)')
    first = encoded[0] if count else None
    wrong = f'{what} must return one list of integer token ids per text; its first item is {type(first).__name__} ' \
            f'{first!r:.80}'
    try:
        lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=count)
        sample = next((ids[0] for ids in encoded if len(ids)), 0)  # one element: numpy would truncate floats
        if isinstance(sample, (bool, np.bool_)) or not isinstance(sample, (int, np.integer)) or isinstance(
                encoded[0], (str, bytes)):
            raise TypeError(f'a token id is {type(sample).__name__}')
        values = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=int(lengths.sum()))
    except (TypeError, ValueError) as err:
        raise TokenizerOutputError(f'{wrong} ({err})') from err
    if len(values) and (values.min() < 0 or values.max() > np.iinfo(np.int32).max):
        raise TokenizerOutputError(f'{what} returned token ids outside [0, 2**31): {values.min()}..{values.max()}')
    return values.astype(np.int32), np.concatenate(([0], np.cumsum(lengths)))


def tokenizing_transform(tokenizer: Any, text_field: str, prompt_field: str | None = None) -> TransformSpec:
    """The ``TransformSpec`` that replaces ``text_field`` (and ``prompt_field``) with its token ids.

    The ids are in column :data:`TOKENS_COLUMN`.
    """
    return TransformSpec(TokenizeColumn(tokenizer, text_field, prompt_field),
                         edit_fields=[(TOKENS_COLUMN, np.object_, (None,), False)], selected_fields=[TOKENS_COLUMN])
