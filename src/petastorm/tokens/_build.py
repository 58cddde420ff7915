"""Making the readers of a token loader's sources, and the stream over them.

Each source is read by its own ``make_batch_reader``: only the token column (or the text column, tokenized in the
reader's workers by :func:`~petastorm.tokens._tokenize.tokenizing_transform`), equal shares of rows per rank
(``shard_mode='rows'``; the few rows left over go to the first ranks, ``shard_remainder='spread'``, so that every
document is read once a pass, also after a restore on another number of ranks), every order seeded. The readers
take URLs as every reader does: local paths, ``s3://`` and the other filesystems, Delta and Iceberg tables, lists
of files.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import numpy as np

from petastorm._describe import describe_urls
from petastorm.errors import NoMatchingFieldsError
from petastorm.reader import Reader, make_batch_reader
from petastorm.reading import as_column_source
from petastorm.tokens._documents import DocumentFields, TokenColumnError
from petastorm.tokens._feed import Feed
from petastorm.tokens._options import ReadSpec, TokenOptions
from petastorm.tokens._source import DocumentSource
from petastorm.tokens._stream import TokenStream
from petastorm.tokens._tokenize import TOKENS_COLUMN, tokenizing_transform

__all__ = ['open_document_source', 'open_stream', 'stop_readers']

#: The columns a Hugging Face Hub dataset names its token ids and its text, taken when no field is given.
_HUB_TOKENS = 'input_ids'
_HUB_TEXT = 'text'


def open_stream(options: TokenOptions, name: str) -> tuple[TokenStream, list[Reader]]:
    """The stream of the options' sources, and the readers it owns (stopped here when anything fails)."""
    readers: list[Reader] = []
    try:
        feeds = []
        for index, url in enumerate(options.read.sources):
            reader, fields = _open_reader(url, options.read)
            readers.append(reader)
            feeds.append(Feed(index, as_column_source(name, reader), fields, options.pack,
                              f'{name} source {index} ({describe_urls(url)})'))
        return TokenStream(feeds, options, name), readers
    except BaseException:
        stop_readers(readers)
        raise


def open_document_source(options: TokenOptions, cached_row_groups: int) -> DocumentSource:
    """The random-access source of the options' one dataset: planned by a reader without workers, which is then
    stopped (the source reads row groups with the reader's read context)."""
    url = options.read.sources[0]
    reader, fields = _open_reader(url, options.read)
    try:
        reader.num_rows_per_pass  # noqa: B018 - the whole plan: every row group numbered before the first record
        context = reader.read_context
    finally:
        stop_readers([reader])
    return DocumentSource(context, fields, options.pack, url, cached_row_groups)


def stop_readers(readers: list[Reader]) -> None:
    """Stop every reader, then wait for each (errors while stopping are not raised)."""
    for reader in readers:
        with contextlib.suppress(Exception):
            reader.stop()
    for reader in readers:
        with contextlib.suppress(Exception):
            reader.__exit__(None, None, None)


def _open_reader(url: Any, read: ReadSpec) -> tuple[Reader, DocumentFields]:
    """The reader of one source, and the columns its documents are made of."""
    text = read.text_field if read.text_field is not None else (_HUB_TEXT if read.tokenizer is not None else None)
    column = text if text is not None else (read.tokens_field or _HUB_TOKENS)
    read_fields = DocumentFields(column, read.prompt_field, read.loss_mask_field)
    options = dict(read.reader_options or {})
    options.setdefault('shard_remainder', 'spread')
    try:
        reader = make_batch_reader(
            url, schema_fields=[re.escape(name) for name in read_fields.names], seed=read.seed,
            shuffle_rows=read.shuffle_documents,
            shuffle_row_groups=read.shuffle_documents, num_epochs=read.num_epochs, cur_shard=read.cur_shard,
            shard_count=read.shard_count, shard_mode='rows',
            storage_options=None if read.storage_options is None else dict(read.storage_options),
            reader_pool_type=read.reader_pool_type, workers_count=read.workers_count,
            transform_spec=None if text is None else tokenizing_transform(read.tokenizer, text, read.prompt_field),
            **options)
    except NoMatchingFieldsError as err:
        option = 'text_field' if text is not None else 'tokens_field'
        raise NoMatchingFieldsError(f'{option}={column!r} is not a column of {describe_urls(url)} ({err}); pass '
                                    f'tokens_field= (a column of token ids) or text_field= with a tokenizer') from err
    try:
        if text is None:
            _check_field_set(reader, read_fields, url)
            for option, name in (('tokens_field', column), ('prompt_field', read.prompt_field),
                                 ('loss_mask_field', read.loss_mask_field)):
                if name is not None:
                    _check_tokens_field(reader, name, url, option)
    except BaseException:
        stop_readers([reader])
        raise
    return reader, DocumentFields(TOKENS_COLUMN) if text is not None else read_fields


def _check_field_set(reader: Reader, fields: DocumentFields, url: Any) -> None:
    """Refuse a prompt or loss mask column the store does not have (the reader takes the columns it finds)."""
    if fields.names[1:] and not set(fields.names) <= set(reader.schema.fields):
        missing = [name for name in fields.names if name not in reader.schema.fields]
        raise NoMatchingFieldsError(f'{missing} are not columns of {describe_urls(url)}; it has '
                                    f'{sorted(reader.schema.fields)}')


def _check_tokens_field(reader: Reader, column: str, url: Any, option: str = 'tokens_field') -> None:
    """Refuse a token column that is not lists (or arrays) of integers (or 0/1 for a loss mask), before reading."""
    field = reader.schema.fields[column]
    dtype, shape = field.numpy_dtype, tuple(field.shape)
    integer = isinstance(dtype, type) and (issubclass(dtype, np.integer) or (
        option == 'loss_mask_field' and issubclass(dtype, np.bool_)))
    if not integer or len(shape) != 1:
        kind = getattr(dtype, '__name__', str(dtype))
        hint = ('; for a column of text pass text_field= and a tokenizer' if kind in ('str_', 'str', 'bytes_')
                else '')
        wanted = ('one list of 0/1 per row, one per token (integers or bools)' if option == 'loss_mask_field' else
                  'one list of integer token ids per row (cast it to a list of int32 or int64)')
        raise TokenColumnError(f'{option}={column!r} of {describe_urls(url)} holds {kind} values of shape '
                               f'{shape}; it must hold {wanted}{hint}')
