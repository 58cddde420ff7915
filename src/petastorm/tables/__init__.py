"""Tables: Delta Lake and Apache Iceberg versions read as the reader's store, exactly the rows of one version.

A table is Parquet files plus a log saying which files (and which rows of them) make up each version. The
reader reads the log at the version asked for (the latest, a pinned version, snapshot, tag or timestamp) and
turns it into the same planned row groups it reads from plain Parquet (:class:`TableStore`, a store of
:mod:`petastorm.store`), with what the files alone cannot say: which files are in the version, which of their rows
were deleted (Delta deletion vectors, Iceberg position and equality deletes, applied as masks of the row groups),
the partition values, the logical column names (Delta column mapping, Iceberg field ids) and the columns added
since a file was written (nulls).

Each format is one module, which the registry of :mod:`petastorm.store.formats` names (that is where a directory
holding a ``_delta_log`` is recognised as a Delta table and one holding ``metadata/*.metadata.json`` as an Iceberg
table; :func:`petastorm.store.opening.open_any_store` opens either, or plain Parquet):

* :mod:`~petastorm.tables.delta`: Delta tables, through ``deltalake`` (the ``delta`` extra);
  :mod:`~petastorm.tables.delta_write` appends to them.
* :mod:`~petastorm.tables.iceberg`: Iceberg tables, through ``pyiceberg`` (the ``iceberg`` extra);
  ``_iceberg_deletes`` resolves their position and equality deletes to rows.

What both formats share:

* ``_files``: from the data files a log lists to the row-group pieces, with their deletes (``StoredColumn`` says
  where a logical column is stored).
* ``_model``: which version (:class:`TableVersion`) and how a data file's columns are read (:class:`TableFile`).
* :mod:`~petastorm.tables.read`: a row group of a version as the workers read it (:class:`TableRowGroup`).
* ``_pruning``: what the log's and the footers' statistics guarantee of a row group, for ``filters``.
* ``_store``: the version as a store (:class:`TableStore`).

The table libraries get the reader's ``storage_options`` translated by :mod:`petastorm.fs.settings`.
"""

from __future__ import annotations

from petastorm.store.formats import TABLE_FORMATS, TableFormat, is_iceberg_table
from petastorm.tables._model import TableFile, TableVersion
from petastorm.tables._store import TableStore
from petastorm.tables.read import TableRowGroup

__all__ = ['TABLE_FORMATS', 'TableFile', 'TableFormat', 'TableRowGroup', 'TableStore', 'TableVersion',
           'is_iceberg_table']
