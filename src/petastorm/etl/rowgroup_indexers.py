"""Petastorm's ``petastorm.etl.rowgroup_indexers`` module path. Re-exports only.

Row-group indexers say which row groups hold which values of a column; they live in
:mod:`petastorm.metadata.row_group_indexes`.
"""

from petastorm.metadata.row_group_indexes import INDEXERS_BY_KIND, FieldNotNullIndexer, SingleFieldIndexer

__all__ = ['INDEXERS_BY_KIND', 'FieldNotNullIndexer', 'SingleFieldIndexer']
