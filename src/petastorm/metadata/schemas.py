"""A store's schema: the one stored in its metadata, else one inferred from its Parquet files.

Every caller that opens a dataset for its schema (the readers, ``petastorm-inspect``, Petastorm's
``infer_or_load_unischema``) goes through :func:`stored_or_inferred_schema`, so the fallback rule is written
once: a store without Petastorm metadata is plain Parquet and gets an inferred schema, but metadata that is there
and cannot be read is an error, never silently replaced by an inferred schema.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from petastorm._warnings import warn_user
from petastorm.errors import PetastormMetadataError
from petastorm.fs import resolve_location
from petastorm.metadata.legacy import unischema_from_legacy_pickle
from petastorm.metadata.schema_json import unischema_from_json
from petastorm.store import keys
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_store
from petastorm.unischema import Unischema, infer_unischema

__all__ = ['DatasetSchema', 'has_petastorm_metadata', 'inferred_schema', 'stored_or_inferred_schema', 'stored_schema',
           'stored_schema_at']

#: Key prefixes of Petastorm metadata (ours and Petastorm's): a store holding one has a schema meant to be read.
_PETASTORM_KEY_PREFIXES = (b'petastorm.', b'dataset-toolkit.')


class DatasetSchema(NamedTuple):
    """A store's schema and where it came from."""

    #: the Unischema.
    schema: Unischema
    #: True when it was inferred from the Parquet schema (the store has no Petastorm metadata).
    inferred: bool


def stored_or_inferred_schema(store: ParquetStore) -> DatasetSchema:
    """The store's stored Unischema, or one inferred from its Parquet schema when it has no Petastorm metadata.

    Raises:
        PetastormMetadataError: Petastorm metadata is there but cannot be read or is refused (never silently
            inferred then), or a plain store has no readable data file to infer from.
        SchemaError: the files' schemas cannot be unified.
    """
    try:
        return DatasetSchema(stored_schema(store), False)
    except PetastormMetadataError:
        if has_petastorm_metadata(store):
            raise
    return DatasetSchema(inferred_schema(store), True)


def has_petastorm_metadata(store: ParquetStore) -> bool:
    """True when the store's metadata file holds Petastorm metadata (ours or Petastorm's), readable or not."""
    return store.metadata_path is not None and any(key.startswith(_PETASTORM_KEY_PREFIXES)
                                                   for key in store.metadata_kv)


def stored_schema_at(url_or_urls: Any, storage_options: dict[str, Any] | None = None,
                     filesystem: Any = None) -> Unischema:
    """The Unischema stored in the dataset at ``url_or_urls`` (see :func:`stored_schema`).

    Args:
        url_or_urls: the dataset's URL, or a list of its files' URLs.
        storage_options: fsspec options (credentials, endpoint) for remote URLs.
        filesystem: a ready filesystem instead of resolving the URL.
    """
    return stored_schema(open_store(resolve_location(url_or_urls, storage_options, filesystem)))


def stored_schema(store: ParquetStore) -> Unischema:
    """The Unischema stored in the store's metadata: our JSON, else Petastorm's legacy pickle.

    Raises:
        PetastormMetadataError: there is no metadata file, no schema in it, or the schema is unreadable/refused.
    """
    if store.metadata_path is None:
        raise PetastormMetadataError(
            f'Could not find _common_metadata file in {store.url}. Use materialize_dataset(..) in '
            f'petastorm.etl.dataset_metadata.py to generate this file in your ETL code or use '
            f'petastorm.write_dataset(...). You can generate it on an existing dataset using '
            f'petastorm-generate-metadata.py')
    where = f'{store.metadata_path}'
    if keys.SCHEMA_JSON_KEY in store.metadata_kv:
        return unischema_from_json(store.metadata_kv[keys.SCHEMA_JSON_KEY],
                                   f'{where} (key {keys.SCHEMA_JSON_KEY.decode()})')
    if keys.UNISCHEMA_KEY in store.metadata_kv:
        return unischema_from_legacy_pickle(store.metadata_kv[keys.UNISCHEMA_KEY],
                                            f'{where} (key {keys.UNISCHEMA_KEY.decode()})')
    raise PetastormMetadataError(
        f'Could not find the unischema in the dataset common metadata file {where}. Please provide or generate '
        f'dataset with the unischema attached. Common Metadata file might not be generated properly. Make sure '
        f'to use materialize_dataset(..) in petastorm.etl.dataset_metadata to properly generate this file in '
        f'your ETL code. You can generate it on an existing dataset using petastorm-generate-metadata.py')


def inferred_schema(store: ParquetStore) -> Unischema:
    """A Unischema inferred from the store's Arrow schema (:meth:`~petastorm.store.model.Store.logical_schema`).

    Plain Parquet files whose schemas differ are unified by the rules of :mod:`petastorm.store.unify`, with a
    warning that names the files and columns; their partition columns are typed by their directories' values. A
    table's is inferred from its logical schema (partition columns typed as the table says).

    Raises:
        PetastormMetadataError: no data file, or one that is not readable Parquet.
        SchemaError: the files' schemas cannot be unified.
    """
    found = store.logical_schema()
    if found.differences:
        warn_user(f'the files of {store.url} differ in their schemas, and are read as one: {found.differences}')
    return infer_unischema(found.arrow, partitions=dict(found.partition_values))

