"""Row-group selectors: choose row groups with the dataset's row-group indexes (``rowgroup_selector=``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ['IntersectIndexSelector', 'RowGroupSelectorBase', 'SingleIndexSelector', 'UnionIndexSelector']


class RowGroupSelectorBase(ABC):
    """Selects row groups (piece indexes) from the dataset's indexes."""

    @abstractmethod
    def get_index_names(self) -> list[str]:
        """Names of the indexes the selector needs."""

    @abstractmethod
    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        """Piece indexes of the selected row groups, given ``{index name: indexer}``."""


class SingleIndexSelector(RowGroupSelectorBase):
    """Row groups holding any of ``values_list`` in the index ``index_name``."""

    def __init__(self, index_name: str, values_list: Iterable[Any]) -> None:
        self._index_name = index_name
        self._values = list(values_list)

    def get_index_names(self) -> list[str]:
        """``[index_name]``."""
        return [self._index_name]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        """The union of the row groups the index lists for each value.

        Raises:
            KeyError: ``index_dict`` has no index named ``index_name``.
        """
        indexer = index_dict[self._index_name]
        selected: set[int] = set()
        for value in self._values:
            selected |= indexer.get_row_group_indexes(value)
        return selected


class IntersectIndexSelector(RowGroupSelectorBase):
    """Row groups selected by every one of the given selectors."""

    def __init__(self, single_index_selectors: Iterable[RowGroupSelectorBase]) -> None:
        self._selectors = list(single_index_selectors)

    def get_index_names(self) -> list[str]:
        """The indexes every combined selector needs, in order."""
        return [name for selector in self._selectors for name in selector.get_index_names()]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        """The row groups every combined selector selects (none when there are no selectors)."""
        if not self._selectors:
            return set()
        result = self._selectors[0].select_row_groups(index_dict)
        for selector in self._selectors[1:]:
            result &= selector.select_row_groups(index_dict)
        return result


class UnionIndexSelector(RowGroupSelectorBase):
    """Row groups selected by any of the given selectors."""

    def __init__(self, single_index_selectors: Iterable[RowGroupSelectorBase]) -> None:
        self._selectors = list(single_index_selectors)

    def get_index_names(self) -> list[str]:
        """The indexes every combined selector needs, in order."""
        return [name for selector in self._selectors for name in selector.get_index_names()]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        """The row groups any combined selector selects."""
        result: set[int] = set()
        for selector in self._selectors:
            result |= selector.select_row_groups(index_dict)
        return result
