"""What a reader is given, checked before planning: the fields selected, the options an NGram allows.

Each check raises as early as possible with a message naming what was passed and what was expected; the
warnings name the user's line that led to them (:func:`petastorm._warnings.warn_user`).
"""

from __future__ import annotations

import re
from typing import Any

from petastorm._warnings import warn_user
from petastorm.codecs import AudioCodec, ScalarCodec, VideoCodec
from petastorm.errors import NoMatchingFieldsError, PetastormMetadataError, SchemaError
from petastorm.ngram import NGram
from petastorm.reading.options import ReaderOptions
from petastorm.store.model import ParquetStore
from petastorm.unischema import Unischema, UnischemaField, prune_struct_field, struct_leaf_field

__all__ = ['PLAIN_PARQUET_NOTE', 'check_columns_exist', 'check_ngram_options', 'select_fields']


#: What ``make_reader`` logs (INFO) of a store without Petastorm metadata, which it reads with the schema inferred
#: from the files (Petastorm warned ``Currently make_reader supports reading only Petastorm datasets``).
PLAIN_PARQUET_NOTE = ('make_reader: %s has no Petastorm metadata; reading it with the schema of its Parquet files '
                      '(make_batch_reader reads such stores a row group at a time)')


def select_fields(schema: Unischema, schema_fields: Any, url: Any) -> Unischema:
    """The view of ``schema`` that ``schema_fields`` (fields, regular expressions or an NGram) selects.

    A field given with an :class:`~petastorm.codecs.AudioCodec` or :class:`~petastorm.codecs.VideoCodec` is
    decoded with that codec (and delivered with its type and shape) when the stored field is an audio or video
    field, or a column of bytes: that is how frames are sampled from a Hugging Face ``Video`` column, audio
    resampled, or a plain binary column of files decoded.

    Raises:
        ValueError: ``schema_fields`` is not a collection of fields or an NGram.
        NoMatchingFieldsError: nothing matches (a ``RuntimeError``, Petastorm's type, and a ``ValueError``).
    """
    if schema_fields is None:
        return schema
    if isinstance(schema_fields, NGram):
        schema_fields.resolve_regex_field_names(schema)
        return schema.create_schema_view([schema.fields[n] for n in schema_fields.get_field_names_at_all_timesteps()])
    if isinstance(schema_fields, (str, bytes)) or not hasattr(schema_fields, '__iter__'):
        hint = f'; for one field pass a list: schema_fields=[{schema_fields!r}]' if isinstance(
            schema_fields, (str, bytes)) else ''
        raise ValueError(f'Fields must be either None, an iterable collection of Unischema fields or an NGram '
                         f'object; got {type(schema_fields).__name__} {schema_fields!r}{hint}')
    schema_fields = list(schema_fields)
    leaves, schema_fields = _struct_leaves(schema, schema_fields)
    view = _media_overrides(schema.create_schema_view(schema_fields), schema_fields)
    if leaves:
        view = _with_struct_leaves(schema, view, leaves)
    if not view.fields:
        raise NoMatchingFieldsError(f"No fields matching the criteria '{schema_fields}' were found in the dataset "
                                    f"{url}. The dataset's fields: {', '.join(schema.fields)}")
    unmatched = [item for item in schema_fields
                 if isinstance(item, str) and not any(re.fullmatch(item, name) for name in schema.fields)]
    if unmatched:
        warn_user(f'schema_fields {unmatched} match no field of the dataset {url} and are ignored (names and '
                  f"regular expressions must match a whole field name). The dataset's fields: "
                  f'{", ".join(schema.fields)}')
    return view


def _media_overrides(view: Unischema, schema_fields: list[Any]) -> Unischema:
    """``view`` with the fields of ``schema_fields`` that carry a media codec in place of the stored ones.

    A stored field is replaced when it is an audio or video field of the same kind, or has no codec but its
    stored type (a binary column, a struct of bytes and path): the codec refuses other columns when it decodes them.

    Raises:
        SchemaError: the stored field has another codec (naming the field and both codecs).
    """
    given = {item.name: item for item in schema_fields if isinstance(item, UnischemaField)
             and isinstance(item.codec, (AudioCodec, VideoCodec)) and item.name in view.fields}
    if not given:
        return view
    fields = []
    for name, stored in view.fields.items():
        field = given.get(name)
        if field is not None and not (stored.codec is None or type(stored.codec) is type(field.codec)
                                      or type(stored.codec) is ScalarCodec):
            raise SchemaError(f'schema_fields gives {name!r} with {field.codec}, but the dataset stores it with '
                             f'{stored.codec}: only audio, video and plain columns of files take a media codec')
        fields.append(stored if field is None else field)
    return Unischema(view._name, fields)


def _struct_leaves(schema: Unischema, schema_fields: list[Any]) -> tuple[dict[str, list[list[str]]], list[Any]]:
    """The items of ``schema_fields`` that name leaves of struct fields (``'st.a'``), and the other items.

    An item is a leaf path when it names no field (as a name or a regular expression) and starts with the name of
    a struct field followed by a dot.

    Raises:
        ValueError: the path starts with a struct field but names nothing that struct holds.
    """
    leaves: dict[str, list[list[str]]] = {}
    rest = []
    for item in schema_fields:
        if isinstance(item, str) and '.' in item and not any(re.fullmatch(item, name) for name in schema.fields):
            found = struct_leaf_field(schema, item)
            if found is not None:
                leaves.setdefault(found[0].name, []).append(found[1])
                continue
        rest.append(item)
    return leaves, rest


def _with_struct_leaves(schema: Unischema, view: Unischema, leaves: dict[str, list[list[str]]]) -> Unischema:
    """``view`` plus the struct fields of ``leaves``, each holding only its leaves (a whole struct asked for wins)."""
    chosen = dict(view.fields)
    for name, paths in leaves.items():
        if name not in chosen:
            chosen[name] = prune_struct_field(schema.fields[name], paths)
    order = [name for name in schema.fields if name in chosen and name not in view.fields]
    return Unischema(view._name, [*view.fields.values(), *(chosen[name] for name in order)])


def check_columns_exist(store: ParquetStore, fields: list[UnischemaField]) -> None:
    """Refuse fields that are not columns of the store's files (metadata that does not match the data).

    Raises:
        PetastormMetadataError: naming the missing fields and the first file's columns.
    """
    if not store.files:
        return
    file_columns = store.column_names()
    partitions = set(store.partition_names)
    missing = [f.name for f in fields if f.name not in file_columns and f.name not in partitions]
    if missing:
        raise PetastormMetadataError(f'fields {missing} of the dataset schema are not columns of '
                                     f'{store.url_of(store.files[0])} '
                                     f'(columns: {sorted(file_columns)}); the metadata does not match the files')


def check_ngram_options(ngram: NGram | None, options: ReaderOptions) -> None:
    """Refuse options an NGram cannot be read with (a transform, ``shard_mode='rows'``, some drop partitions)."""
    if ngram is None:
        return
    if options.transform_spec is not None:
        raise ValueError('transform_spec cannot be combined with an NGram: transform the windows after reading')
    if options.shard_mode == 'rows':
        raise ValueError("shard_mode='rows' splits row groups at any row and would cut NGram windows; use "
                         "shard_mode='row_groups' with an NGram")
    if not ngram.timestamp_overlap and options.shuffle_row_drop_partitions > 1:
        raise NotImplementedError('An NGram with timestamp_overlap=False cannot be combined with '
                                  'shuffle_row_drop_partitions > 1')
