"""Row-group indexers: which row groups hold which values of a column."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from petastorm.etl import RowGroupIndexerBase


def _column_values(decoded_rows: Any, column: str) -> Iterable[Any]:
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

    def __init__(self, index_name: str, index_field: str):
        self._index_name = index_name
        self._column_name = index_field

    def _check_mergeable(self, other: Any) -> None:
        if type(other) is not type(self):
            raise TypeError(f'cannot merge {type(self).__name__} with {type(other).__name__}')
        if other._column_name != self._column_name:
            raise ValueError(f'cannot merge indexes of different columns ({self._column_name!r} and '
                             f'{other._column_name!r})')

    @property
    def index_name(self) -> str:
        return self._index_name

    @property
    def column_names(self) -> list[str]:
        return [self._column_name]


class SingleFieldIndexer(_ColumnIndexer):
    """Indexes every non-null value of one field (each element, for array fields).

    Args:
        index_name: the name selectors use.
        index_field: the field to index.
    """

    kind = 'single_field'

    def __init__(self, index_name: str, index_field: str):
        super().__init__(index_name, index_field)
        self._index_data: defaultdict[Any, set[int]] = defaultdict(set)

    def __add__(self, other: Any) -> SingleFieldIndexer:
        self._check_mergeable(other)
        merged = SingleFieldIndexer(self._index_name, self._column_name)
        for source in (self, other):
            for value, pieces in source._index_data.items():
                merged._index_data[value] |= pieces
        return merged

    @property
    def indexed_values(self) -> list[Any]:
        return list(self._index_data)

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        return set(self._index_data.get(_plain(value_key), set()))

    def build_index(self, decoded_rows: Any, piece_index: int) -> SingleFieldIndexer:
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
        indexer = cls(description['name'], description['column'])
        for value, pieces in description['values']:
            indexer._index_data[value] = {int(p) for p in pieces}
        return indexer


class FieldNotNullIndexer(_ColumnIndexer):
    """Indexes the row groups in which a field has at least one non-null value."""

    kind = 'field_not_null'

    def __init__(self, index_name: str, index_field: str):
        super().__init__(index_name, index_field)
        self._index_data: set[int] = set()

    def __add__(self, other: Any) -> FieldNotNullIndexer:
        self._check_mergeable(other)
        merged = FieldNotNullIndexer(self._index_name, self._column_name)
        merged._index_data = self._index_data | other._index_data
        return merged

    @property
    def indexed_values(self) -> list[Any]:
        return ['Field is Not Null']

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        return set(self._index_data)

    def build_index(self, decoded_rows: Any, piece_index: int) -> FieldNotNullIndexer:
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
        indexer = cls(description['name'], description['column'])
        indexer._index_data = {int(p) for p in description['pieces']}
        return indexer


#: Indexer classes by their stored kind.
INDEXERS_BY_KIND: dict[str, Any] = {cls.kind: cls for cls in (SingleFieldIndexer, FieldNotNullIndexer)}
