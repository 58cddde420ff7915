"""Train language models straight from Parquet: packed token batches with an exact, elastic position.

:func:`make_token_loader` reads documents (a column of token ids, or a column of text tokenized in the reader's
workers), packs them into rows of ``seq_len`` tokens and hands out batches of torch tensors; :func:`make_token_dataset`
gives the same batches as a ``grain.IterDataset`` for JAX, and :func:`make_document_source` the documents by number
for Grain's own pipelines. ``docs/tokens.md`` has the recipes.

The package is built from one module per step: :mod:`~petastorm.tokens._options` (the arguments),
``_build`` (the readers), ``_tokenize`` (text to token ids in the workers), ``_documents`` (a batch of
documents as one array of tokens), ``_queue``, ``_packers`` and ``_first_fit`` (documents to rows), ``_rows``
(rows to the arrays of a batch), ``_feed`` (one source), ``_draws`` (the mixture's and the shuffle's draws),
``_stream`` (passes and batches), ``_positions`` and ``_state`` (positions taken and restored, and their format),
``_distributed``, ``_torch`` and ``_grain`` (the frameworks), ``_source`` (documents by number).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from petastorm.tokens._documents import TokenColumnError
from petastorm.tokens._feed import RestoreError
from petastorm.tokens._options import document_options, token_options
from petastorm.tokens._rows import IGNORE_INDEX
from petastorm.tokens._tokenize import TokenizerOutputError

if TYPE_CHECKING:
    from petastorm.tokens._grain import TokenIterDataset
    from petastorm.tokens._source import DocumentSource
    from petastorm.tokens._torch import TokenLoader

__all__ = ['IGNORE_INDEX', 'DocumentSource', 'RestoreError', 'TokenColumnError', 'TokenIterDataset', 'TokenLoader',
           'TokenizerOutputError', 'make_document_source', 'make_token_dataset', 'make_token_loader']


def make_token_loader(url_or_urls: Any, *, seq_len: int, batch_size: int | None = None, max_tokens: int | None = None,
                      tokens_field: str | None = None, text_field: str | None = None, tokenizer: Any = None,
                      eos_id: int | None = None, bos_id: int | None = None, packing: str = 'concat',
                      pad_id: int = 0, labels: str | None = 'hf', long_documents: str = 'split',
                      pack_window: int = 64, return_cu_seqlens: bool = False, return_document_ids: bool = False,
                      return_attention_mask: bool = False, weights: Any = None, cur_shard: Any = None,
                      shard_count: Any = None, seed: int = 0, shuffle_documents: bool = True,
                      shuffle_buffer: int = 0, steps_per_epoch: int | None = None, num_epochs: int | None = 1,
                      equal_steps: Any = 'auto',
                      storage_options: dict[str, Any] | None = None, reader_pool_type: str = 'thread',
                      workers_count: int = 2, reader_options: dict[str, Any] | None = None,
                      prompt_field: str | None = None, loss_mask_field: str | None = None) -> TokenLoader:
    """A torch loader of packed token batches read from Parquet (or a Delta or Iceberg table).

    Args:
        url_or_urls: a dataset URL (a directory, a file, ``s3://...``, a Delta or Iceberg table) or a list of file
            URLs read as one dataset; with ``weights``, a list of sources to mix (each a URL or a list of files).
        seq_len: tokens per row.
        batch_size: rows per batch; or give ``max_tokens``.
        max_tokens: tokens per batch instead of ``batch_size``: ``max_tokens // seq_len`` rows; with
            ``packing='none'``, as many rows as fit at the width of the batch's longest row.
        tokens_field: the column of token ids (any integer list type); default ``'input_ids'`` when no tokenizer is
            given.
        text_field: the column of text to tokenize; default ``'text'`` when a tokenizer is given.
        tokenizer: a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or a function from a list of strings to
            a list of token id lists. It runs in the readers' workers, a row group at a time, without special tokens.
        eos_id: a token added after every document (marks document boundaries for the model).
        bos_id: a token added before every document.
        packing: ``'concat'`` (default): documents one after the other, cut every ``seq_len`` tokens (no padding
            but in the last row of a pass); ``'first_fit'``: whole documents placed into ``pack_window`` open rows
            (the fullest with room; a document longer than ``seq_len`` is split), padded; ``'none'``: one document
            per row, padded.
        pad_id: the token of padding (labels are ``-100`` there).
        labels: ``'hf'`` (default): the input ids, as Hugging Face models take them (they shift inside), with
            ``-100`` on padding and on the first token of every document in a row, so that no token is predicted
            from another document; ``'shifted'``: the next token of the same document at each position; None: no
            labels.
        long_documents: with ``packing='none'``, a document longer than ``seq_len``: ``'split'`` over several rows
            (default), ``'truncate'`` to its first ``seq_len`` tokens (the rest counted in ``stats()`` and warned
            about once), or ``'error'``.
        pack_window: with ``packing='first_fit'``, the rows open for documents at once.
        return_cu_seqlens: add ``cu_seqlens`` (int32) and ``max_seqlen``: the bounds of every segment of the
            flattened batch, as flash-attention's varlen functions take them.
        return_document_ids: add ``document_ids``: the number of each token's document within its row (-1 on
            padding).
        return_attention_mask: add ``attention_mask``: 1 on tokens, 0 on padding.
        weights: mix the sources of ``url_or_urls``: one weight per source, or a function of the step (batches
            delivered since the first pass) returning them. Each packed row comes from one source, drawn with
            these weights; the pass ends when a drawn source has nothing left (give the sources
            ``num_epochs=None`` for an endless mixture).
        cur_shard: this rank (``'auto'``: from ``torch.distributed`` or the launcher's environment); every rank reads
            an equal share of the documents.
        shard_count: the number of ranks (``'auto'``: the world size).
        seed: seeds the order of documents, the mixture's draws and the shuffle of packed rows; the same seed gives
            the same batches for any number of workers.
        shuffle_documents: read documents in a seeded random order (row groups and rows), a new one every epoch.
        shuffle_buffer: draw packed rows at random from a buffer of this many (0: in packing order).
        steps_per_epoch: hand out at most this many batches per ``iter()`` (an epoch of a trainer) and continue the
            pass in the next one; ``len()`` is then this number (Lightning reads one batch ahead of a loader without
            ``len()``, and a checkpoint taken mid-epoch would miss that batch). None: an epoch is a pass.
        num_epochs: epochs per pass; None reads forever.
        equal_steps: in a ``torch.distributed`` run, every rank stops a pass at the first step some rank cannot
            fill (an all-reduce per step): ``'auto'`` (when the readers are sharded over the world), True or False.
        storage_options: options of the filesystem (credentials, endpoint).
        reader_pool_type: the readers' workers: ``'thread'`` (default) or ``'process'``.
        workers_count: each reader's workers (reading, decoding and tokenizing).
        reader_options: other arguments of ``make_batch_reader`` (``filters``, ``table_version``, ``cache_type``...).
        prompt_field: supervised fine-tuning: a column of prompts (text tokenized like ``text_field``, or token ids
            like ``tokens_field``) put before each row's document; their tokens are in ``input_ids`` and left out of
            the loss (``labels`` is ``-100`` where the label is a prompt token).
        loss_mask_field: supervised fine-tuning on token ids: a column of one 0/1 (or bool) per token of
            ``tokens_field`` (as TRL's ``completion_mask`` or ``assistant_masks``); ``labels`` is ``-100`` where the
            label is a token marked 0.

    Returns:
        A :class:`TokenLoader` (a context manager that stops the readers).

    Raises:
        ValueError: a bad argument or column; the message names it and what to pass.
    """
    options = token_options(
        url_or_urls, seq_len=seq_len, batch_size=batch_size, max_tokens=max_tokens, tokens_field=tokens_field,
        text_field=text_field, tokenizer=tokenizer, eos_id=eos_id, bos_id=bos_id, packing=packing, pad_id=pad_id,
        labels=labels, long_documents=long_documents, pack_window=pack_window, return_cu_seqlens=return_cu_seqlens,
        return_document_ids=return_document_ids, return_attention_mask=return_attention_mask, weights=weights,
        cur_shard=cur_shard, shard_count=shard_count, seed=seed, shuffle_documents=shuffle_documents,
        shuffle_buffer=shuffle_buffer, steps_per_epoch=steps_per_epoch, num_epochs=num_epochs,
        equal_steps=equal_steps,
        storage_options=storage_options, reader_pool_type=reader_pool_type, workers_count=workers_count,
        reader_options=reader_options, prompt_field=prompt_field, loss_mask_field=loss_mask_field)
    from petastorm.tokens._build import open_stream
    from petastorm.tokens._torch import TokenLoader

    stream, readers = open_stream(options, 'petastorm.tokens.TokenLoader')
    return TokenLoader(stream, readers, options.read.equal_steps)


def make_token_dataset(url_or_urls: Any, **arguments: Any) -> TokenIterDataset:
    """The batches of :func:`make_token_loader` as a ``grain.IterDataset`` (numpy arrays), for JAX.

    Takes the arguments of :func:`make_token_loader`. ``equal_steps`` applies to the processes of a JAX run
    (``jax.distributed.initialize()``): with the readers sharded over all of them (``cur_shard='auto'``), every
    process ends a pass at the same step, agreed with a gather of one integer per step. Its iterator's
    ``get_state``/``set_state`` are the position, which Grain's checkpoint handler saves.
    """
    options = token_options(url_or_urls, **arguments)
    from petastorm.tokens._build import open_stream
    from petastorm.tokens._grain import TokenIterDataset

    stream, readers = open_stream(options, 'petastorm.tokens.TokenIterDataset')
    return TokenIterDataset(stream, readers, options.read.equal_steps)


def make_document_source(url_or_urls: Any, *, tokens_field: str | None = None, text_field: str | None = None,
                         tokenizer: Any = None, eos_id: int | None = None, bos_id: int | None = None,
                         prompt_field: str | None = None, loss_mask_field: str | None = None,
                         storage_options: dict[str, Any] | None = None, reader_options: dict[str, Any] | None = None,
                         cached_row_groups: int = 4) -> DocumentSource:
    """The documents of a dataset by number, as a Grain random-access source (``grain.MapDataset.source``).

    Record ``i`` is the dataset's ``i``-th row in file order: ``{'input_ids': int64 array}`` (with ``bos_id`` and
    ``eos_id`` added), and with ``prompt_field`` or ``loss_mask_field`` also ``loss_mask`` (int32, 0 on tokens left
    out of the loss). Grain shuffles, shards, packs and checkpoints it by record numbers. A record is read with its
    whole row group (text tokenized there, in one batch), and the last ``cached_row_groups`` row groups are kept: read
    in file order, or shuffled within windows of a few row groups (``grain.experimental.WindowShuffleMapDataset``),
    every row group is read once; a global shuffle reads one for almost every record. :func:`make_token_dataset` is
    the streaming alternative: packed batches with an exact position, reading every row group once in any order.

    Args:
        url_or_urls: a dataset URL (a directory, a file, ``s3://...``, a Delta or Iceberg table) or a list of file
            URLs read as one dataset.
        tokens_field, text_field, tokenizer, eos_id, bos_id, prompt_field, loss_mask_field, storage_options: as
            :func:`make_token_loader` takes them.
        reader_options: ``table_version``, ``table_format``, ``filesystem`` or ``split`` (of ``make_batch_reader``):
            the others would change which rows are numbered.
        cached_row_groups: row groups kept decoded (per process).

    Raises:
        ValueError: a bad argument or column; the message names it and what to pass.
    """
    options = document_options(url_or_urls, tokens_field=tokens_field, text_field=text_field, tokenizer=tokenizer,
                               eos_id=eos_id, bos_id=bos_id, prompt_field=prompt_field,
                               loss_mask_field=loss_mask_field, storage_options=storage_options,
                               reader_options=reader_options)
    from petastorm._checks import check_positive_int
    from petastorm.tokens._build import open_document_source

    return open_document_source(options, check_positive_int('cached_row_groups', cached_row_groups))


def __getattr__(name: str) -> Any:
    # The loaders' classes need their framework: imported when asked for.
    if name == 'TokenLoader':
        from petastorm.tokens._torch import TokenLoader

        return TokenLoader
    if name == 'TokenIterDataset':
        from petastorm.tokens._grain import TokenIterDataset

        return TokenIterDataset
    if name == 'DocumentSource':
        from petastorm.tokens._source import DocumentSource

        return DocumentSource
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
