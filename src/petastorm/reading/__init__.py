"""The reader pipeline: from a reader's arguments to the batches and rows it hands out.

:mod:`petastorm.reader` (Petastorm's module path, kept there) holds ``make_reader``, ``make_batch_reader`` and the
:class:`~petastorm.reader.Reader`; everything they are built from lives here, one module per step, in the order
a batch travels:

* :mod:`~petastorm.reading.options`: every reader argument, its default and type, declared once in
  :class:`ReaderOptions` and checked once by :func:`validate_options`.
* :mod:`~petastorm.reading.inputs`: the checks of what a reader is given (the fields selected, NGram options).
* :mod:`~petastorm.reading.setup`: :func:`set_up_reader` opens the store, selects the fields, plans the shard's
  epochs and builds the one :class:`ReadContext` every worker receives.
* :mod:`~petastorm.reading.counting`: whether the rows of an epoch are known before reading, counted when asked.
* :mod:`~petastorm.reading.worker`: :func:`read_item`, the worker function: read one work item, filter, decode,
  transform, in named stages.
* :mod:`~petastorm.reading.column_transform`: a ``TransformSpec`` applied to decoded columns.
* :mod:`~petastorm.reading.batch`: :class:`ColumnBatch`, the one unit that travels from the workers to the
  loaders.
* :mod:`~petastorm.reading.delivery`: rows, batches or NGram windows cut from the batches at the very end.
* :mod:`~petastorm.reading.passes`: the rules of a reader's pass: delivery from the pool, its length, reset and
  restart, resuming from a state, rows a consumer holds; where the reader is.
* :mod:`~petastorm.reading.source`: the seam the loaders read: :class:`ColumnSource` (iteration, described by a
  :class:`SourceInfo`) and :class:`PositionSource` (positions), and :func:`as_column_source` for anything given
  as a reader.
* :mod:`~petastorm.reading.batch_stream`: :class:`BatchStream`, the pass, length and position rules every loader
  shares.
* :mod:`~petastorm.reading.legacy`: Petastorm's ``Reader(filesystem, path, reader_pool=...)`` arguments.

The execution modules (``worker``, ``column_transform``, ``batch``) sit a layer below the others: a pool runs the
worker without anything of the API above it (see ``docs/architecture.md``). This package exports what the
authors of a loader or another executor use.
"""

from __future__ import annotations

from petastorm.reading.batch import ColumnBatch
from petastorm.reading.batch_stream import ROW_IDS, BatchStream, check_capacity
from petastorm.reading.options import ReaderOptions, validate_options
from petastorm.reading.setup import ReaderSetup, set_up_reader
from petastorm.reading.source import (
    ColumnSource,
    PositionSource,
    SourceInfo,
    as_column_source,
    check_reader,
    positions_of,
)
from petastorm.reading.worker import ReadContext, read_item

__all__ = ['ROW_IDS', 'BatchStream', 'ColumnBatch', 'ColumnSource', 'PositionSource', 'ReadContext', 'ReaderOptions',
           'ReaderSetup', 'SourceInfo', 'as_column_source', 'check_capacity', 'check_reader', 'positions_of',
           'read_item', 'set_up_reader', 'validate_options']
