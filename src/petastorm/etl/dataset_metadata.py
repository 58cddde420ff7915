"""Petastorm's ``petastorm.etl.dataset_metadata`` module path: schema lookup, metadata keys, ``materialize_dataset``.

Re-exports only; the implementation lives in :mod:`petastorm.metadata`, :mod:`petastorm.store` and
:mod:`petastorm.etl.materialize`.
"""

from __future__ import annotations

from typing import Any

from petastorm.errors import PetastormMetadataError, PetastormMetadataGenerationError
from petastorm.etl.materialize import materialize_dataset
from petastorm.fs import resolve_location
from petastorm.metadata.schemas import stored_or_inferred_schema, stored_schema, stored_schema_at
from petastorm.store.keys import ROW_GROUPS_PER_FILE_KEY, ROWGROUPS_INDEX_KEY, UNISCHEMA_KEY
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_store
from petastorm.store.pieces import RowGroupPiece
from petastorm.unischema import Unischema

__all__ = [
    'ROWGROUPS_INDEX_KEY',
    'ROW_GROUPS_PER_FILE_KEY',
    'UNISCHEMA_KEY',
    'PetastormMetadataError',
    'PetastormMetadataGenerationError',
    'get_schema',
    'get_schema_from_dataset_url',
    'infer_or_load_unischema',
    'load_row_groups',
    'materialize_dataset',
    'open_dataset',
]


def open_dataset(dataset_url_or_urls: Any, hdfs_driver: str = 'libhdfs3', storage_options: dict | None = None,
                 filesystem: Any = None) -> ParquetStore:
    """Open a store (list its files, read its metadata) from a URL or a list of file URLs."""
    return open_store(resolve_location(dataset_url_or_urls, storage_options, filesystem))


def _as_store(dataset: Any) -> ParquetStore:
    return dataset if isinstance(dataset, ParquetStore) else open_dataset(dataset)


def get_schema(dataset: Any) -> Unischema:
    """The Unischema stored in a dataset (a :class:`ParquetStore` or a URL).

    Raises:
        PetastormMetadataError: no ``_common_metadata``, no schema in it, or a refused/unreadable schema.
    """
    return stored_schema(_as_store(dataset))


def get_schema_from_dataset_url(dataset_url_or_urls: Any, hdfs_driver: str = 'libhdfs3',
                                storage_options: dict | None = None, filesystem: Any = None) -> Unischema:
    """The Unischema stored in the dataset at ``dataset_url_or_urls``."""
    return stored_schema_at(dataset_url_or_urls, storage_options, filesystem)


def infer_or_load_unischema(dataset: Any) -> Unischema:
    """The stored Unischema, or one inferred from the Parquet schema when the store has no Petastorm metadata."""
    return stored_or_inferred_schema(_as_store(dataset)).schema


def load_row_groups(dataset: Any) -> list[RowGroupPiece]:
    """Every row group of the dataset in piece order (sorted file path, then row-group number)."""
    return _as_store(dataset).row_groups()
