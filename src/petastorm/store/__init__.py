"""The store: the Parquet files a reader reads, what their listing and footers say, one way to open any of them.

A store is a dataset's data files and what is known of them before reading any data: plain Parquet, or one
version of a Delta or Iceberg table (:mod:`petastorm.tables`), behind one interface
(:class:`~petastorm.store.model.Store`) that the reader's setup, the planner, the workers and the tools ask instead
of branching on the kind. This package reads data, never a dataset's description of itself (that is
:mod:`petastorm.metadata`, which builds on this package; nothing here imports it). Its modules, lowest first:

* :mod:`~petastorm.store.keys`: the keys of the key-value metadata in ``_common_metadata`` (ours and Petastorm's).
* :mod:`~petastorm.store.listing`: one look at a store's directory: its data files, their sizes and times, the
  names that are not data, glob patterns.
* :mod:`~petastorm.store.unify`: one schema for files whose schemas differ, and each file's table made to fit it.
* :mod:`~petastorm.store.sized_files`: a data file read by its listed size (on S3 and Azure: its footer in one
  request, its row groups without asking its size).
* :mod:`~petastorm.store.data_files`: the data files read with as few requests as their filesystem allows (files
  kept open with their footers, row groups fetched ahead far from the storage).
* :mod:`~petastorm.store.pieces`: a row group as the unit of work (:class:`~petastorm.store.pieces.RowGroupPiece`)
  and how its delivered rows are made from the stored ones (:class:`~petastorm.store.pieces.LogicalRows`: plain
  Parquet's hive partitions here, a table's in :mod:`petastorm.tables`).
* :mod:`~petastorm.store.model`: the store interface (:class:`~petastorm.store.model.Store`), the data every store
  has (:class:`~petastorm.store.model.ParquetStore`) and what was read of it once
  (:class:`~petastorm.store.model.StoreReads`).
* :mod:`~petastorm.store.footers`: the data files' footers and the ``_metadata`` summary, read once per store,
  and what they give (schemas, the unified schema, row counts).
* :mod:`~petastorm.store.row_groups`: reading one row group, for the workers and the row-group indexer.
* :mod:`~petastorm.store.filters`: ``filters`` as a pyarrow expression, and which row groups' statistics may match.
* :mod:`~petastorm.store.plain`: the plain Parquet store (:class:`~petastorm.store.plain.PlainStore`): its row
  groups, partitions, schema and statistics from its metadata and footers.
* :mod:`~petastorm.store.formats`: the registry of table formats: how each is recognised, what opens it.
* :mod:`~petastorm.store.opening`: opening any store (:func:`~petastorm.store.opening.open_any_store`: a table
  version, or plain Parquet opened by :func:`~petastorm.store.opening.open_store`).
"""

__all__: list[str] = []
