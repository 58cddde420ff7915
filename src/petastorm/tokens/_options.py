"""Every argument of a token loader, declared once in frozen dataclasses and checked once.

:func:`token_options` is the first call of :func:`~petastorm.tokens.make_token_loader` and
:func:`~petastorm.tokens.make_token_dataset`: it turns their keyword arguments into a :class:`TokenOptions` made of
three parts, one per concern: what is read (:class:`ReadSpec`), how documents become rows (:class:`PackSpec`), and
what a batch holds (:class:`BatchSpec`). Everything below works on those objects.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from petastorm._checks import check_positive_int, is_integer

__all__ = ['DOCUMENT_READER_OPTIONS', 'LABELS', 'LONG_DOCUMENTS', 'PACKINGS', 'BatchSpec', 'LabelStyle',
           'LongDocuments', 'PackSpec', 'Packing', 'PoolType', 'ReadSpec', 'TokenOptions', 'check_weights',
           'document_options', 'token_options']

Packing = Literal['concat', 'first_fit', 'none']
LabelStyle = Literal['hf', 'shifted']
LongDocuments = Literal['split', 'truncate', 'error']
PoolType = Literal['thread', 'process', 'dummy']
PACKINGS: tuple[str, ...] = ('concat', 'first_fit', 'none')
LABELS: tuple[Any, ...] = ('hf', 'shifted', None)
LONG_DOCUMENTS: tuple[str, ...] = ('split', 'truncate', 'error')

#: Reader arguments the token loader sets itself (``reader_options`` may not name them).
_OWN_READER_ARGUMENTS = frozenset({
    'dataset_url_or_urls', 'schema_fields', 'seed', 'shuffle_rows', 'shuffle_row_groups', 'num_epochs', 'cur_shard',
    'shard_count', 'shard_mode', 'storage_options', 'reader_pool_type', 'workers_count', 'transform_spec',
})


@dataclass(frozen=True)
class PackSpec:
    """How documents become rows of ``seq_len`` tokens.

    Attributes:
        seq_len: tokens per row.
        packing: ``'concat'``, ``'first_fit'`` or ``'none'`` (see :func:`~petastorm.tokens.make_token_loader`).
        pad_id: the token that fills the rest of a row.
        bos_id: a token put before every document, or None.
        eos_id: a token put after every document, or None.
        long_documents: with ``packing='none'``, what a document longer than ``seq_len`` becomes.
        window: with ``packing='first_fit'``, how many rows are open for documents at once.
    """

    seq_len: int
    packing: Packing = 'concat'
    pad_id: int = 0
    bos_id: int | None = None
    eos_id: int | None = None
    long_documents: LongDocuments = 'split'
    window: int = 64

    @property
    def added_tokens(self) -> int:
        """Tokens added to every document (``bos_id`` and ``eos_id``)."""
        return int(self.bos_id is not None) + int(self.eos_id is not None)


@dataclass(frozen=True)
class BatchSpec:
    """What a batch holds.

    Attributes:
        batch_size: rows per batch, or None when ``max_tokens`` sets them.
        max_tokens: the tokens (rows times width, padding included) a batch may hold, or None.
        labels: ``'hf'`` (labels are the input ids, shifted by the model), ``'shifted'`` (the next token), or None.
        cu_seqlens: add ``cu_seqlens`` and ``max_seqlen`` (flash-attention's varlen arguments).
        document_ids: add ``document_ids`` (the document's number inside its row; -1 on padding).
        attention_mask: add ``attention_mask`` (1 on tokens, 0 on padding).
        shuffle_buffer: packed rows drawn at random from a buffer of this many (0: in packing order).
        steps_per_epoch: batches of an epoch (each ``iter()``), the pass going on over epochs; None: an epoch is
            a pass.
        loss_mask: some tokens come marked as left out of the loss (``prompt_field`` or ``loss_mask_field``).
    """

    batch_size: int | None = None
    max_tokens: int | None = None
    labels: LabelStyle | None = 'hf'
    cu_seqlens: bool = False
    document_ids: bool = False
    attention_mask: bool = False
    shuffle_buffer: int = 0
    steps_per_epoch: int | None = None
    loss_mask: bool = False


@dataclass(frozen=True)
class ReadSpec:
    """What is read, and how the readers are made.

    Attributes:
        sources: one entry per source: a dataset URL, or a list of file URLs read as one dataset.
        weights: one weight per source, a function of the step returning them, or None (one source).
        tokens_field: the column of token ids, or None when text is tokenized.
        text_field: the column of text, or None when token ids are read.
        tokenizer: what tokenizes ``text_field`` (see :mod:`petastorm.tokens._tokenize`), or None.
        prompt_field: the column of prompts (text or token ids, as the documents) put before each document and left
            out of the loss, or None.
        loss_mask_field: the column of one 0/1 per token of ``tokens_field`` (0: left out of the loss), or None.
        cur_shard: this rank, ``'auto'`` or None.
        shard_count: the world size, ``'auto'`` or None.
        seed: seeds every order (documents, packed rows, the mixture's draws).
        shuffle_documents: read documents in a seeded random order (row groups and rows shuffled).
        num_epochs: epochs per pass (None: forever).
        storage_options: the filesystem's options (credentials, endpoint).
        reader_pool_type: the readers' pool kind.
        workers_count: each reader's workers (tokenization runs in them).
        reader_options: more keyword arguments of ``make_batch_reader``.
        equal_steps: make every rank of a ``torch.distributed`` run stop a pass at the same step: True, False or
            ``'auto'`` (when the run is sharded over the whole world).
    """

    sources: tuple[Any, ...]
    weights: tuple[float, ...] | Callable[[int], Sequence[float]] | None = None
    tokens_field: str | None = None
    text_field: str | None = None
    tokenizer: Any = None
    prompt_field: str | None = None
    loss_mask_field: str | None = None
    cur_shard: Any = None
    shard_count: Any = None
    seed: int = 0
    shuffle_documents: bool = True
    num_epochs: int | None = 1
    storage_options: Mapping[str, Any] | None = None
    reader_pool_type: PoolType = 'thread'
    workers_count: int = 2
    reader_options: Mapping[str, Any] | None = None
    equal_steps: bool | Literal['auto'] = 'auto'


@dataclass(frozen=True)
class TokenOptions:
    """The checked arguments of a token loader."""

    read: ReadSpec
    pack: PackSpec
    batch: BatchSpec


def token_options(url_or_urls: Any, *, seq_len: Any, batch_size: Any = None, max_tokens: Any = None,
                  tokens_field: Any = None, text_field: Any = None, tokenizer: Any = None, eos_id: Any = None,
                  bos_id: Any = None, packing: Any = 'concat', pad_id: Any = 0, labels: Any = 'hf',
                  long_documents: Any = 'split', pack_window: Any = 64, return_cu_seqlens: Any = False,
                  return_document_ids: Any = False, return_attention_mask: Any = False, weights: Any = None,
                  cur_shard: Any = None, shard_count: Any = None, seed: Any = 0, shuffle_documents: Any = True,
                  shuffle_buffer: Any = 0, steps_per_epoch: Any = None, num_epochs: Any = 1, equal_steps: Any = 'auto',
                  storage_options: Any = None, reader_pool_type: Any = 'thread', workers_count: Any = 2,
                  reader_options: Any = None, prompt_field: Any = None, loss_mask_field: Any = None) -> TokenOptions:
    """Check every argument of :func:`~petastorm.tokens.make_token_loader` (documented there) into options.

    Raises:
        ValueError: an argument is out of range or does not fit the others; the message names it and the fix.
        TypeError: an argument is of the wrong kind (a tokenizer that is not callable, weights that are not numbers).
    """
    pack = _pack_spec(seq_len, packing, pad_id, bos_id, eos_id, long_documents, pack_window)
    batch = _batch_spec(pack, batch_size, max_tokens, labels, return_cu_seqlens, return_document_ids,
                        return_attention_mask, shuffle_buffer, steps_per_epoch,
                        loss_mask=prompt_field is not None or loss_mask_field is not None)
    sources = _sources(url_or_urls, weights)
    read = ReadSpec(
        sources=sources, weights=_weights(weights, len(sources)),
        tokens_field=_optional_name('tokens_field', tokens_field), text_field=_optional_name('text_field', text_field),
        tokenizer=_tokenizer(tokenizer), prompt_field=_optional_name('prompt_field', prompt_field),
        loss_mask_field=_optional_name('loss_mask_field', loss_mask_field), cur_shard=cur_shard,
        shard_count=shard_count, seed=_seed(seed),
        shuffle_documents=_flag('shuffle_documents', shuffle_documents),
        num_epochs=None if num_epochs is None else check_positive_int('num_epochs', num_epochs),
        storage_options=storage_options, reader_pool_type=_pool_type(reader_pool_type),
        workers_count=check_positive_int('workers_count', workers_count),
        reader_options=_reader_options(reader_options), equal_steps=_equal_steps(equal_steps))
    _check_fields(read)
    _check_loss_fields(read, batch)
    return TokenOptions(read=read, pack=pack, batch=batch)


#: The keys of ``reader_options`` a :func:`document_options` source takes: the others would change which rows are
#: read or their order, and records are numbered by the rows in file order.
DOCUMENT_READER_OPTIONS = ('table_version', 'table_format', 'filesystem', 'split')


def document_options(url: Any, *, tokens_field: Any = None, text_field: Any = None, tokenizer: Any = None,
                     eos_id: Any = None, bos_id: Any = None, prompt_field: Any = None, loss_mask_field: Any = None,
                     storage_options: Any = None, reader_options: Any = None) -> TokenOptions:
    """Check the arguments of :func:`~petastorm.tokens.make_document_source` (documented there) into options.

    The documents are read as a loader's are (the same checks of every column and the tokenizer), in file order,
    by one reader without workers; no rows are cut (the pack's ``seq_len`` is only a bound).

    Raises:
        ValueError: an argument is out of range or does not fit the others; the message names it and the fix.
    """
    unknown = sorted(set(reader_options or {}) - set(DOCUMENT_READER_OPTIONS))
    if unknown:
        raise ValueError(f'reader_options {unknown} are not taken by make_document_source: records are numbered by '
                         f'the rows in file order, so only {list(DOCUMENT_READER_OPTIONS)} may be given (filter, '
                         f'shard and shuffle with Grain)')
    return token_options(url, seq_len=sys.maxsize, batch_size=1, tokens_field=tokens_field, text_field=text_field,
                         tokenizer=tokenizer, eos_id=eos_id, bos_id=bos_id, shuffle_documents=False,
                         storage_options=storage_options, reader_pool_type='dummy', workers_count=1,
                         reader_options=reader_options, prompt_field=prompt_field, loss_mask_field=loss_mask_field)


def _pack_spec(seq_len: Any, packing: Any, pad_id: Any, bos_id: Any, eos_id: Any, long_documents: Any,
               window: Any) -> PackSpec:
    if not is_integer(seq_len) or seq_len < 1:
        raise ValueError(f'seq_len must be a positive integer (the tokens of a row), got {seq_len!r}')
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {', '.join(map(repr, PACKINGS))}, got {packing!r}")
    if long_documents not in LONG_DOCUMENTS:
        raise ValueError(f"long_documents must be one of {', '.join(map(repr, LONG_DOCUMENTS))}, got "
                         f'{long_documents!r}')
    if long_documents != 'split' and packing != 'none':
        raise ValueError(f"long_documents={long_documents!r} applies to packing='none' only: packing={packing!r} "
                         f'splits documents longer than seq_len across rows')
    added = int(bos_id is not None) + int(eos_id is not None)
    if added >= seq_len:
        raise ValueError(f'seq_len={seq_len} leaves no room for a token beside bos_id and eos_id')
    return PackSpec(seq_len=int(seq_len), packing=packing, pad_id=_token('pad_id', pad_id),
                    bos_id=None if bos_id is None else _token('bos_id', bos_id),
                    eos_id=None if eos_id is None else _token('eos_id', eos_id), long_documents=long_documents,
                    window=check_positive_int('pack_window', window))


def _token(name: str, value: Any) -> int:
    if not is_integer(value) or value < 0:
        raise ValueError(f'{name} must be a token id (an integer >= 0), got {value!r}')
    return int(value)


def _batch_spec(pack: PackSpec, batch_size: Any, max_tokens: Any, labels: Any, cu_seqlens: Any, document_ids: Any,
                attention_mask: Any, shuffle_buffer: Any, steps_per_epoch: Any, loss_mask: bool) -> BatchSpec:
    if (batch_size is None) == (max_tokens is None):
        raise ValueError(f'give make_token_loader either batch_size= (rows per batch) or max_tokens= (tokens per '
                         f'batch), got batch_size={batch_size!r}, max_tokens={max_tokens!r}')
    if batch_size is not None:
        batch_size = check_positive_int('batch_size', batch_size)
    if max_tokens is not None:
        max_tokens = check_positive_int('max_tokens', max_tokens)
        if max_tokens < pack.seq_len:
            raise ValueError(f'max_tokens={max_tokens} is below seq_len={pack.seq_len}: a batch must hold at least '
                             f'one row')
    if labels not in LABELS:
        raise ValueError(f"labels must be 'hf' (the input ids, which Hugging Face models shift themselves), "
                         f"'shifted' (the next token) or None, got {labels!r}")
    if not is_integer(shuffle_buffer) or shuffle_buffer < 0:
        raise ValueError(f'shuffle_buffer must be an integer >= 0 (packed rows), got {shuffle_buffer!r}')
    return BatchSpec(batch_size=batch_size, max_tokens=max_tokens, labels=labels,
                     cu_seqlens=_flag('return_cu_seqlens', cu_seqlens),
                     document_ids=_flag('return_document_ids', document_ids),
                     attention_mask=_flag('return_attention_mask', attention_mask),
                     shuffle_buffer=int(shuffle_buffer), loss_mask=loss_mask,
                     steps_per_epoch=None if steps_per_epoch is None else check_positive_int('steps_per_epoch',
                                                                                             steps_per_epoch))


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f'{name} must be True or False, got {value!r}')
    return bool(value)


def _seed(seed: Any) -> int:
    if not is_integer(seed) or seed < 0:
        raise ValueError(f'seed must be an integer >= 0 (token loaders are always seeded, so that every rank and '
                         f'every restore computes the same order), got {seed!r}')
    return int(seed)


def _equal_steps(value: Any) -> bool | Literal['auto']:
    if value == 'auto' and isinstance(value, str):
        return 'auto'
    return _flag('equal_steps', value)


def _pool_type(value: Any) -> PoolType:
    if value not in ('thread', 'process', 'dummy'):
        raise ValueError(f"reader_pool_type must be 'thread', 'process' or 'dummy', got {value!r}")
    return value  # type: ignore[no-any-return]


def _optional_name(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f'{name} must be a column name, got {value!r}')
    return value


def _tokenizer(tokenizer: Any) -> Any:
    if tokenizer is not None and not callable(tokenizer) and not hasattr(tokenizer, 'encode_batch'):
        raise TypeError(f'tokenizer must be a tokenizers.Tokenizer, a transformers tokenizer or a function from a '
                        f'list of strings to a list of token id lists, got {type(tokenizer).__name__}')
    return tokenizer


def _sources(url_or_urls: Any, weights: Any) -> tuple[Any, ...]:
    """One entry per source: the URLs of a mixture (``weights`` given), else the one dataset."""
    if isinstance(url_or_urls, (list, tuple)) and not url_or_urls:
        raise ValueError('make_token_loader needs a dataset URL or a non-empty list of URLs, got an empty list')
    if weights is None:
        return (list(url_or_urls) if isinstance(url_or_urls, (list, tuple)) else url_or_urls,)
    if not isinstance(url_or_urls, (list, tuple)) or len(url_or_urls) < 2:
        raise ValueError(f'weights= mixes several sources: pass a list of two or more dataset URLs (each may '
                         f'itself be a list of files), got {url_or_urls!r}')
    return tuple(list(url) if isinstance(url, (list, tuple)) else url for url in url_or_urls)


def _weights(weights: Any, count: int) -> tuple[float, ...] | Callable[[int], Sequence[float]] | None:
    if weights is None or callable(weights):
        return weights
    values = check_weights(weights, count, 'weights')
    return tuple(float(v) for v in values)


def check_weights(weights: Any, count: int, where: str) -> np.ndarray:
    """``weights`` as float64: one finite, non-negative number per source, not all 0.

    Raises:
        ValueError: naming ``where`` and what is wrong.
    """
    if isinstance(weights, (str, bytes)) or not isinstance(weights, (Sequence, np.ndarray)) or not all(
            isinstance(w, numbers.Real) and not isinstance(w, bool) for w in weights):
        raise ValueError(f'{where} must be a list of numbers (one per source), got {weights!r}')
    values = np.asarray(weights, dtype=np.float64)
    if values.shape != (count,):
        raise ValueError(f'{where} must hold one weight per source ({count}), got {len(values)}: {list(weights)!r}')
    if not np.all(np.isfinite(values)) or np.any(values < 0) or values.sum() <= 0:
        raise ValueError(f'{where} must be finite and non-negative with a positive sum, got {list(weights)!r}')
    return values


def _reader_options(options: Any) -> Mapping[str, Any] | None:
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ValueError(f'reader_options must be a dict of make_batch_reader arguments, got {options!r}')
    taken = sorted(set(options) & _OWN_READER_ARGUMENTS)
    if taken:
        raise ValueError(f'reader_options may not set {taken}: the token loader sets them (pass its own arguments '
                         f'instead, e.g. seed=, num_epochs=, cur_shard=)')
    return dict(options)


def _check_fields(read: ReadSpec) -> None:
    if read.tokens_field is not None and read.text_field is not None:
        raise ValueError(f'give tokens_field= (a column of token ids) or text_field= (a column of text, with a '
                         f'tokenizer), not both: got tokens_field={read.tokens_field!r}, '
                         f'text_field={read.text_field!r}')
    if read.text_field is not None and read.tokenizer is None:
        raise ValueError(f'text_field={read.text_field!r} needs tokenizer= (a tokenizers.Tokenizer, a transformers '
                         f'tokenizer, or a function from a list of strings to a list of token id lists); for a '
                         f'column of token ids pass tokens_field= instead')
    if read.tokens_field is not None and read.tokenizer is not None:
        raise ValueError(f'tokenizer= tokenizes text_field=; tokens_field={read.tokens_field!r} is already token '
                         f'ids: pass text_field= for the text column, or leave the tokenizer out')


def _check_loss_fields(read: ReadSpec, batch: BatchSpec) -> None:
    given = [f'{name}={value!r}' for name, value in (('prompt_field', read.prompt_field),
                                                      ('loss_mask_field', read.loss_mask_field)) if value is not None]
    if given and batch.labels is None:
        raise ValueError(f"{' and '.join(given)} leave tokens out of the labels, and labels=None makes none; pass "
                         f"labels='hf' or 'shifted'")
    if read.loss_mask_field is not None and read.tokenizer is not None:
        raise ValueError(f'loss_mask_field={read.loss_mask_field!r} holds one 0/1 per token id of tokens_field=, '
                         f'and text tokenized on the fly has no such column; for prompts and responses in text '
                         f'columns pass prompt_field= (its tokens are left out of the loss)')
    names = [name for name in (read.tokens_field, read.text_field, read.prompt_field, read.loss_mask_field)
             if name is not None]
    if len(set(names)) < len(names):
        raise ValueError(f'tokens_field/text_field, prompt_field and loss_mask_field must be different columns, got '
                         f'{names}')
