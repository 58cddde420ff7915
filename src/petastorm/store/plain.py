"""A plain Parquet store: a directory of Parquet files (or some files of one), described by its own metadata.

:class:`PlainStore` answers the store interface (:class:`~petastorm.store.model.Store`) from what the files and
the directory say: its row groups from our row-group map of ``_common_metadata``, else the ``_metadata`` summary,
else the footers; its partition columns from hive directories (``name=value``); its schema from the files' schemas
unified; its statistics from the footers. Every row a file stores is delivered, and a plain store has no versions.
It is opened by :func:`petastorm.store.opening.open_store`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from petastorm._describe import display_url
from petastorm._warnings import warn_user
from petastorm.errors import PetastormMetadataError
from petastorm.store import keys
from petastorm.store.filters import filter_statistics
from petastorm.store.footers import data_file_schema, metadata_row_counts, store_footer_row_counts, unified_file_schema
from petastorm.store.model import FilterStatistics, ParquetStore, StoreSchema, check_no_missing_files
from petastorm.store.pieces import RowGroupPiece, partition_keys_of

__all__ = ['SUMMARY_HINT_FILES', 'PlainStore', 'warn_if_deprecated_metadata']

logger = logging.getLogger(__name__)

#: data files from which a store planned from its footers is told, once, that a ``_metadata`` summary would help.
SUMMARY_HINT_FILES = 1000
_TOLD: set[str] = set()


@dataclass(frozen=True)
class PlainStore(ParquetStore):
    """A plain Parquet store (see the module docstring); its fields are :class:`ParquetStore`'s."""

    @property
    def partition_names(self) -> list[str]:
        """Hive partition column names (``name=value`` directories), outermost first."""
        names: list[str] = []
        for path in self.files:
            if '=' not in path:
                continue  # in no partition directory (100,000 files are looked at without parsing each)
            for name, _ in partition_keys_of(self.relpath(path)):
                if name not in names:
                    names.append(name)
        return names

    def row_groups(self) -> list[RowGroupPiece]:
        """Every row group of the store, in piece order (sorted path, then row-group number).

        Row counts come from a saved plan adopted by the store (:mod:`petastorm.store.saved_plan`), else from our
        metadata when it lists every file, else from ``_metadata``, else from the file footers, read in parallel. A
        store whose metadata names files that are gone is refused here, before any row is read, rather than read
        as a smaller (or empty) dataset.

        Raises:
            MissingDataFilesError: the metadata names data files that are not in the store.
            CorruptFooterError: a footer that had to be read is not readable Parquet.
        """
        check_no_missing_files(self, _metadata_file_names(self), self.metadata_path)
        counts = self.reads.row_counts or metadata_row_counts(self)
        if counts is None:
            warn_if_deprecated_metadata(self)
            _tell_a_summary_would_help(self)
            counts = store_footer_row_counts(self)
        pieces: list[RowGroupPiece] = []
        for path in self.files:
            pieces.extend(self.file_pieces(path, counts[path]))
        return pieces

    def file_pieces(self, path: str, row_counts: list[int]) -> list[RowGroupPiece]:
        """The pieces of one data file, whose row groups have ``row_counts`` rows (see :meth:`row_groups`)."""
        # (a path without '=' is in no partition directory: 100,000 files are listed without asking each)
        partition = partition_keys_of(self.relpath(path)) if self.root and '=' in path else ()
        return [RowGroupPiece(path, i, n, partition) for i, n in enumerate(row_counts)]

    def logical_schema(self) -> StoreSchema:
        """The data files' Arrow schemas unified (:mod:`petastorm.store.unify`), and the hive directories' values.

        Raises:
            PetastormMetadataError: no data file, or one that is not readable Parquet.
            SchemaError: the files' schemas cannot be unified.
        """
        if not self.files:
            raise PetastormMetadataError(f'{self.url} holds no Parquet data files to infer a schema from')
        unified = unified_file_schema(self)
        partitions: dict[str, list[str]] = {}
        if self.root:
            for path in self.files:
                if '=' not in path:
                    continue
                for name, value in partition_keys_of(self.relpath(path)):
                    partitions.setdefault(name, []).append(value)
        return StoreSchema(unified.schema, partitions, unified.describe() if unified.differs else '')

    def column_names(self) -> set[str]:
        """Those of the unified schema when it was made (its schema was inferred), else the first file's footer's."""
        unified = self.reads.unified
        if unified is not None:
            return set(unified.schema.names)
        return set(data_file_schema(self, self.files[0]).names)

    def filter_statistics(self, expression: Any, whole: bool = True) -> FilterStatistics:
        """What the footers' statistics (or the summary's) and the hive directories say of ``expression``."""
        return filter_statistics(self, expression, whole)

    def deleted_rows_by_file(self) -> dict[str, int]:
        """Empty: every row a file stores is delivered."""
        return {}

    def version_key(self) -> None:
        """None: a plain store has no versions."""
        return None

    def describe_version(self) -> None:
        """None: a plain store has no versions."""
        return None

    def metadata_source(self) -> str | None:
        """The metadata file, relative to the store's directory."""
        return None if self.metadata_path is None else self.relpath(self.metadata_path)


def _metadata_file_names(store: ParquetStore) -> set[str]:
    """The data files (relative paths) that the store's key-value metadata says it has: ours and Petastorm's maps."""
    names: set[str] = set()
    for key in (keys.ROW_GROUPS_JSON_KEY, keys.ROW_GROUPS_PER_FILE_KEY):
        raw = store.metadata_kv.get(key)
        if raw is None:
            continue
        try:
            document = json.loads(raw)
            files = document['files'] if key == keys.ROW_GROUPS_JSON_KEY else document
        except (ValueError, KeyError, TypeError):
            continue  # reported where the map is read for its row counts (ours), or never used (Petastorm's)
        if isinstance(files, dict):
            names.update(str(name) for name in files)
    return names


def _tell_a_summary_would_help(store: ParquetStore) -> None:
    """Log once per store URL and process that a large store's footers are read where a summary would do."""
    url = str(store.url)
    if len(store.files) < SUMMARY_HINT_FILES or store.root is None or store.subset or url in _TOLD:
        return
    _TOLD.add(url)
    logger.warning('%s has %d data files and no _metadata summary: planning reads every footer (a request or two '
                   'per file). With a summary it takes two requests: write one with petastorm-generate-metadata.py '
                   '%s (or write_dataset(..., write_summary=True)), or share one plan between runs with plan_file=',
                   display_url(url), len(store.files), display_url(url))


def warn_if_deprecated_metadata(store: ParquetStore) -> None:
    """Petastorm datasets from before row-group maps carry a schema but no row-group information."""
    has_schema = keys.SCHEMA_JSON_KEY in store.metadata_kv or keys.UNISCHEMA_KEY in store.metadata_kv
    has_row_groups = keys.ROW_GROUPS_JSON_KEY in store.metadata_kv or keys.ROW_GROUPS_PER_FILE_KEY in \
        store.metadata_kv
    if has_schema and not has_row_groups:
        warn_user(f'You are using a deprecated metadata version. Please run petastorm-generate-metadata.py on '
                  f'spark to update. (petastorm-generate-metadata.py --dataset_url {store.url}); row groups are '
                  f'read from the file footers meanwhile.')
