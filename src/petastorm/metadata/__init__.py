"""What a dataset says about itself: its schema, its row-group map and indexes, in ``_common_metadata``.

The Parquet files and what their footers say are the store's (:mod:`petastorm.store`); this package reads and
writes the description a dataset keeps beside them, and imports the store package (never the reverse):

* :mod:`~petastorm.metadata.schema_json`: the versioned JSON form of a Unischema, as we store it.
* :mod:`~petastorm.metadata.legacy`: the guarded reader of the pickles Petastorm releases stored (schema, indexes).
* :mod:`~petastorm.metadata.legacy_write`: Petastorm's pickled schema entry written, so that its releases open
  datasets we write.
* :mod:`~petastorm.metadata.schemas`: a store's schema: the one stored in its metadata, else one inferred from its
  Parquet files.
* :mod:`~petastorm.metadata.row_group_indexes`: row-group indexes, their indexers and how a store keeps them.
* :mod:`~petastorm.metadata.write`: writing ``_common_metadata`` (the schema and the row-group map).
"""

__all__: list[str] = []
