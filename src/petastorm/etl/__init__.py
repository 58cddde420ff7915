"""Petastorm's ``petastorm.etl`` package: dataset generation helpers and the row-group indexer interface.

:class:`RowGroupIndexerBase` is defined in :mod:`petastorm.metadata.row_group_indexes`, where the reader's
storage layer loads indexes without importing this package; it is re-exported here, its public path.
"""

from petastorm.metadata.row_group_indexes import RowGroupIndexerBase

__all__ = ['RowGroupIndexerBase']
