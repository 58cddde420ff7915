"""The Parquet store: a dataset's data files, what their listing and footers say, and reading their row groups.

A store is the Parquet files a reader reads and what is known of them before reading any data. This package reads
data, never a dataset's description of itself (that is :mod:`petastorm.metadata`, which builds on this package;
nothing here imports it). Its modules, lowest first:

* :mod:`~petastorm.store.keys`: the keys of the key-value metadata in ``_common_metadata`` (ours and Petastorm's).
* :mod:`~petastorm.store.listing`: one look at a store's directory: its data files, their sizes and times, the
  names that are not data, glob patterns.
* :mod:`~petastorm.store.unify`: one schema for files whose schemas differ, and each file's table made to fit it.
* :mod:`~petastorm.store.data_files`: the data files read with as few requests as their filesystem allows (files
  kept open with their footers, row groups fetched ahead far from the storage).
* :mod:`~petastorm.store.model`: the store as data (:class:`~petastorm.store.model.ParquetStore`), what was read
  of it once (:class:`~petastorm.store.model.StoreReads`), its row groups
  (:class:`~petastorm.store.model.RowGroupPiece`), hive partition values.
* :mod:`~petastorm.store.footers`: the data files' footers and the ``_metadata`` summary, read once per store,
  and what they give (schemas, the unified schema, row counts).
* :mod:`~petastorm.store.row_groups`: reading one row group, for the workers and the row-group indexer.
* :mod:`~petastorm.store.filters`: ``filters`` as a pyarrow expression, and which row groups' statistics may match.
* :mod:`~petastorm.store.opening`: opening a store (its files and ``_common_metadata``) and listing its row groups.
"""

__all__: list[str] = []
