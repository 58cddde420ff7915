"""Dataset generation helpers (Petastorm's ``petastorm.etl`` package) and the row-group indexer interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class RowGroupIndexerBase(ABC):
    """An index from values of a column to the row groups (piece indexes) that hold them.

    Indexers are built per row group with :meth:`build_index` and merged with ``+``; the result is stored in the
    dataset metadata as JSON (see :mod:`petastorm.etl.rowgroup_indexing`).
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
