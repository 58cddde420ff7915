"""Row-group indexes: which row groups hold which values of a column, and how a store keeps them.

An index is built by an indexer (:class:`SingleFieldIndexer`, :class:`FieldNotNullIndexer`, or a user's subclass of
:class:`RowGroupIndexerBase`) one row group at a time, and the per-row-group indexers are merged with ``+``.
Indexes are stored in ``_common_metadata`` as versioned JSON under :data:`~petastorm.store.keys.INDEXES_JSON_KEY`
(see :func:`indexes_to_json`); indexes written by Petastorm (a pickle under
:data:`~petastorm.store.keys.ROWGROUPS_INDEX_KEY`) are read through the guarded unpickler.
:func:`load_row_group_indexes` reads either from an opened store; it is what the reader's row-group selection uses.

Building indexes reads and decodes data, so it lives with the dataset tools:
:func:`petastorm.etl.rowgroup_indexing.build_rowgroup_index`. The classes keep their public paths,
``petastorm.etl.RowGroupIndexerBase`` and ``petastorm.etl.rowgroup_indexers.*``.
"""

from __future__ import annotations

import copy
import json
import posixpath
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from petastorm.errors import PetastormMetadataError
from petastorm.metadata.legacy import legacy_indexes_from_pickle
from petastorm.store.keys import INDEXES_JSON_KEY, ROWGROUPS_INDEX_KEY
from petastorm.store.model import ParquetStore

__all__ = [
    'INDEXERS_BY_KIND',
    'INDEXES_FORMAT_VERSION',
    'FieldNotNullIndexer',
    'RowGroupIndexerBase',
    'SingleFieldIndexer',
    'indexes_to_json',
    'load_row_group_indexes',
    'storable_kind',
]

#: Version of the JSON document under INDEXES_JSON_KEY: ``{"format_version": 1, "indexes": {name: indexer}}``.
INDEXES_FORMAT_VERSION = 1


class RowGroupIndexerBase(ABC):
    """An index from values of a column to the row groups (piece indexes) that hold them.

    Indexers are built per row group with :meth:`build_index` and merged with ``+``. Every row group is indexed
    by its own copy of the indexer given to ``build_rowgroup_index``, so an indexer must be copyable
    (``copy.deepcopy``, and picklable to be built with Spark).
    """

    @abstractmethod
    def __add__(self, other: Any) -> RowGroupIndexerBase:
        """Merge two indexers of the same kind, name and column."""

    @property
    @abstractmethod
    def index_name(self) -> str:
        """The name selectors use to find this index."""

    @property
    @abstractmethod
    def column_names(self) -> list[str]:
        """The columns the indexer reads."""

    @property
    @abstractmethod
    def indexed_values(self) -> list[Any]:
        """The values present in the index."""

    @abstractmethod
    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        """Piece indexes of the row groups that hold ``value_key``."""

    @abstractmethod
    def build_index(self, decoded_rows: Any, piece_index: int) -> RowGroupIndexerBase:
        """Add one row group's rows (a list of row dicts or a dict of decoded columns) to the index."""


def _column_values(decoded_rows: Any, column: str) -> Collection[Any]:
    """Values of ``column`` from a dict of decoded columns or a list of row dicts."""
    if isinstance(decoded_rows, Mapping):
        return decoded_rows[column]
    return [row[column] for row in decoded_rows]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _check_empty(decoded_rows: Any, column: str) -> None:
    if len(_column_values(decoded_rows, column)) == 0:
        raise ValueError(f'Cannot build index with empty decoded_rows (column {column!r})')


class _ColumnIndexer(RowGroupIndexerBase):
    """What both indexers share: a name, one column, and the rule for which indexers can merge."""

    def __init__(self, index_name: str, index_field: str) -> None:
        self._index_name = index_name
        self._column_name = index_field

    def _merged_copy(self, other: Any, kind: type[_ColumnIndexer]) -> Any:
        """A copy of this indexer (a subclass keeps its own settings) to merge ``other`` into.

        Raises:
            TypeError: ``other`` is not a ``kind`` indexer.
            ValueError: ``other`` indexes another column.
        """
        if not isinstance(other, kind):
            raise TypeError(f'cannot merge {type(self).__name__} with {type(other).__name__}')
        if other._column_name != self._column_name:
            raise ValueError(f'cannot merge indexes of different columns ({self._column_name!r} and '
                             f'{other._column_name!r})')
        return copy.deepcopy(self)

    @property
    def index_name(self) -> str:
        """The name selectors use to find this index."""
        return self._index_name

    @property
    def column_names(self) -> list[str]:
        """The one column the indexer reads."""
        return [self._column_name]


class SingleFieldIndexer(_ColumnIndexer):
    """Indexes every non-null value of one field (each element, for array fields).

    Args:
        index_name: the name selectors use.
        index_field: the field to index.
    """

    kind = 'single_field'

    def __init__(self, index_name: str, index_field: str) -> None:
        super().__init__(index_name, index_field)
        self._index_data: defaultdict[Any, set[int]] = defaultdict(set)

    def __add__(self, other: Any) -> SingleFieldIndexer:
        """An indexer holding the row groups of both.

        Raises:
            TypeError: ``other`` is not a ``SingleFieldIndexer``.
            ValueError: ``other`` indexes another column.
        """
        merged = self._merged_copy(other, SingleFieldIndexer)
        for value, pieces in other._index_data.items():
            merged._index_data[value] |= pieces
        return merged

    @property
    def indexed_values(self) -> list[Any]:
        """Every value seen in the field."""
        return list(self._index_data)

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        """Piece indexes of the row groups holding ``value_key`` (empty for a value never seen)."""
        return set(self._index_data.get(_plain(value_key), set()))

    def build_index(self, decoded_rows: Any, piece_index: int) -> SingleFieldIndexer:
        """Record that row group ``piece_index`` holds each non-null value (or array element) of the field.

        Args:
            decoded_rows: the row group's rows: a list of row dicts, or a dict of decoded columns.
            piece_index: the row group's position in the dataset's piece order.

        Returns:
            This indexer.

        Raises:
            ValueError: ``decoded_rows`` holds no rows.
        """
        _check_empty(decoded_rows, self._column_name)
        for value in _column_values(decoded_rows, self._column_name):
            if value is None:
                continue
            if isinstance(value, np.ndarray):
                for element in value.ravel():
                    self._index_data[_plain(element)].add(piece_index)
            else:
                self._index_data[_plain(value)].add(piece_index)
        return self

    def to_json(self) -> dict[str, Any]:
        """The stored form: ``{"kind", "name", "column", "values": [[value, [pieces]], ...]}``."""
        return {'kind': self.kind, 'name': self._index_name, 'column': self._column_name,
                'values': [[value, sorted(pieces)] for value, pieces in self._index_data.items()]}

    @classmethod
    def from_json(cls, description: Mapping[str, Any]) -> SingleFieldIndexer:
        """Inverse of :meth:`to_json`."""
        indexer = cls(description['name'], description['column'])
        for value, pieces in description['values']:
            indexer._index_data[value] = {int(p) for p in pieces}
        return indexer


class FieldNotNullIndexer(_ColumnIndexer):
    """Indexes the row groups in which a field has at least one non-null value.

    Args:
        index_name: the name selectors use.
        index_field: the field to index.
    """

    kind = 'field_not_null'

    def __init__(self, index_name: str, index_field: str) -> None:
        super().__init__(index_name, index_field)
        self._index_data: set[int] = set()

    def __add__(self, other: Any) -> FieldNotNullIndexer:
        """An indexer holding the row groups of both.

        Raises:
            TypeError: ``other`` is not a ``FieldNotNullIndexer``.
            ValueError: ``other`` indexes another column.
        """
        merged = self._merged_copy(other, FieldNotNullIndexer)
        merged._index_data |= other._index_data
        return merged

    @property
    def indexed_values(self) -> list[Any]:
        """``['Field is Not Null']``: the one thing this index knows."""
        return ['Field is Not Null']

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        """Piece indexes of the row groups where the field is not always null (``value_key`` is ignored)."""
        return set(self._index_data)

    def build_index(self, decoded_rows: Any, piece_index: int) -> FieldNotNullIndexer:
        """Record row group ``piece_index`` when the field has a non-null value in it.

        Args:
            decoded_rows: the row group's rows: a list of row dicts, or a dict of decoded columns.
            piece_index: the row group's position in the dataset's piece order.

        Returns:
            This indexer.

        Raises:
            ValueError: ``decoded_rows`` holds no rows.
        """
        _check_empty(decoded_rows, self._column_name)
        if any(value is not None for value in _column_values(decoded_rows, self._column_name)):
            self._index_data.add(piece_index)
        return self

    def to_json(self) -> dict[str, Any]:
        """The stored form: ``{"kind", "name", "column", "pieces": [...]}``."""
        return {'kind': self.kind, 'name': self._index_name, 'column': self._column_name,
                'pieces': sorted(self._index_data)}

    @classmethod
    def from_json(cls, description: Mapping[str, Any]) -> FieldNotNullIndexer:
        """Inverse of :meth:`to_json`."""
        indexer = cls(description['name'], description['column'])
        indexer._index_data = {int(p) for p in description['pieces']}
        return indexer


#: Indexer classes by their stored kind.
INDEXERS_BY_KIND: dict[str, type[SingleFieldIndexer] | type[FieldNotNullIndexer]] = {
    cls.kind: cls for cls in (SingleFieldIndexer, FieldNotNullIndexer)}

# The classes are Petastorm's public names at their public paths: pickles, reprs and Petastorm's own
# references all use those.
RowGroupIndexerBase.__module__ = 'petastorm.etl'
for _cls in (SingleFieldIndexer, FieldNotNullIndexer):
    _cls.__module__ = 'petastorm.etl.rowgroup_indexers'
del _cls


def storable_kind(indexer: Any) -> str | None:
    """The stored kind an indexer is written and read back as, or None when it cannot be stored.

    Subclasses of :class:`SingleFieldIndexer` and :class:`FieldNotNullIndexer` are stored as those kinds.
    """
    kind = getattr(indexer, 'kind', None)
    return kind if kind in INDEXERS_BY_KIND and isinstance(indexer, INDEXERS_BY_KIND[kind]) else None


def indexes_to_json(indexes: Mapping[str, Any]) -> bytes:
    """The document stored under ``INDEXES_JSON_KEY`` for ``{index name: indexer}``.

    Raises:
        ValueError: an indexer is of no stored kind (see :func:`storable_kind`), or its values are not numbers,
            strings or booleans.
    """
    described = {}
    for name, indexer in indexes.items():
        if storable_kind(indexer) is None:
            raise ValueError(f'index {name!r}: a {type(indexer).__name__} cannot be stored; stored indexes are '
                             f'SingleFieldIndexer or FieldNotNullIndexer (or subclasses of them)')
        described[name] = indexer.to_json()
    document = {'format_version': INDEXES_FORMAT_VERSION, 'indexes': described}
    try:
        return json.dumps(document, sort_keys=True).encode()
    except TypeError as err:
        raise ValueError(f'index values must be numbers, strings or booleans to be stored: {err}') from err


def _from_json(raw: bytes, where: str) -> dict[str, RowGroupIndexerBase]:
    try:
        document = json.loads(raw)
        version = document['format_version']
        described = document['indexes']
    except (ValueError, KeyError, TypeError) as err:
        raise PetastormMetadataError(f'{where}: malformed row-group indexes ({err})') from err
    if not isinstance(version, int) or version > INDEXES_FORMAT_VERSION:
        raise PetastormMetadataError(f'{where}: row-group index format_version {version!r} is newer than this '
                                     f'petastorm reads (<= {INDEXES_FORMAT_VERSION}); upgrade petastorm.')
    indexes: dict[str, RowGroupIndexerBase] = {}
    for name, description in described.items():
        cls = INDEXERS_BY_KIND.get(description.get('kind'))
        if cls is None:
            raise PetastormMetadataError(f'{where}: index {name!r} has unknown kind {description.get("kind")!r}')
        indexes[name] = cls.from_json(description)
    return indexes


def _from_legacy(raw: bytes, where: str) -> dict[str, RowGroupIndexerBase]:
    indexes: dict[str, RowGroupIndexerBase] = {}
    for name, description in legacy_indexes_from_pickle(raw, where).items():
        if description['kind'] == 'SingleFieldIndexer':
            indexes[name] = SingleFieldIndexer.from_json(
                {'name': name, 'column': description['column'], 'values': list(description['data'].items())})
        elif description['kind'] == 'FieldNotNullIndexer':
            indexes[name] = FieldNotNullIndexer.from_json(
                {'name': name, 'column': description['column'], 'pieces': description['data']})
    return indexes


def load_row_group_indexes(store: ParquetStore) -> dict[str, RowGroupIndexerBase]:
    """``{index name: indexer}`` stored in an opened store's ``_common_metadata``.

    Args:
        store: the store, from :func:`petastorm.store.opening.open_store`.

    Raises:
        ValueError: the store has no ``_common_metadata``, or no row-group indexes in it (the message says how to
            build them).
        PetastormMetadataError: the stored indexes are malformed, from a newer format, or a refused pickle.
    """
    if store.metadata_path is None or posixpath.basename(store.metadata_path) != '_common_metadata':
        raise ValueError(f'Could not find _common_metadata file in {store.url}: the dataset has no row-group '
                         f'indexes. Build them with petastorm.etl.rowgroup_indexing.build_rowgroup_index(...)')
    if store.subset:
        raise ValueError(f'{store.url} names some files of the dataset at {store.root}, and its row-group indexes '
                         f'number the row groups of the whole dataset: open the dataset directory to use a '
                         f'rowgroup_selector')
    where = f'{store.metadata_path}'
    raw = store.metadata_kv.get(INDEXES_JSON_KEY)
    if raw is not None:
        return _from_json(raw, where)
    if ROWGROUPS_INDEX_KEY in store.metadata_kv:
        return _from_legacy(store.metadata_kv[ROWGROUPS_INDEX_KEY], f'{where} (key {ROWGROUPS_INDEX_KEY.decode()})')
    raise ValueError(f'Could not find row group indexes in the dataset metadata {where}. Build them with '
                     f'petastorm.etl.rowgroup_indexing.build_rowgroup_index(...)')
