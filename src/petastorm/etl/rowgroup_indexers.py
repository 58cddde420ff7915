"""Row-group indexers: which row groups hold which values of a column (re-exports).

The classes are defined in :mod:`petastorm.metadata.row_group_indexes`; this is their public path.
"""

from petastorm.metadata.row_group_indexes import INDEXERS_BY_KIND, FieldNotNullIndexer, SingleFieldIndexer

__all__ = ['INDEXERS_BY_KIND', 'FieldNotNullIndexer', 'SingleFieldIndexer']
