"""Shuffling and batching buffers: rows in and out as columns, never one Python object per row.

The loaders of :mod:`petastorm.pytorch` build their batches with these pieces; they use no framework themselves:

* tables (``{column name: array}``, all arrays with the same number of rows) are what goes in and out;
* :class:`Batcher` cuts a stream of tables into batches of a fixed number of rows, first in, first out;
* :class:`ShufflingBuffer` holds rows and hands out uniformly random ones (a classic shuffling queue, a chunk of
  rows at a time). Its rows live in a store: :class:`ColumnStore` (one array per column) or
  :class:`PackedColumns` (numeric numpy columns packed into one fixed-width record per row, so that a random row is
  one place in memory);
* an *ops* object (:class:`ArrayOps`; :class:`NumpyOps` for numpy, ``TensorOps`` in the torch adapter for tensors)
  supplies the few array operations that differ between array types;
* :func:`take_rows` gives an Arrow table's rows in a shuffled order (what a reader's ``shuffle_rows`` does to a row
  group), ragged number lists gathered by the compiled kernel a row's range at a time, and :func:`ramps` the
  positions of the pieces of a packed token row (``petastorm.tokens``), one kernel pass;
* every draw follows from random words of the buffer's ``numpy.random.Generator``; a small compiled kernel, built
  at install time where a C compiler is available, carries out the draws of packed records (and writes them)
  fastest, and numpy replays exactly the same draws where the kernel is not built or switched off, so the rows
  handed out and their order are the same with and without it for the same seed.

The environment variable ``PETASTORM_NO_COMPILED_SHUFFLE=1`` turns the kernel off (for buffers made after it is
set); :func:`compiled_shuffle_in_use` tells whether buffers made now use it.
"""

from __future__ import annotations

from petastorm.shuffle._batcher import Batcher
from petastorm.shuffle._buffer import ColumnStore, ShufflingBuffer, Store
from petastorm.shuffle._compiled import NO_COMPILED_SHUFFLE_ENV, compiled_shuffle_in_use
from petastorm.shuffle._ops import ArrayOps, NumpyOps
from petastorm.shuffle._ramps import ramps
from petastorm.shuffle._records import PackedColumns
from petastorm.shuffle._tables import Table, num_rows, slice_rows
from petastorm.shuffle._take import take_rows

__all__ = ['NO_COMPILED_SHUFFLE_ENV', 'ArrayOps', 'Batcher', 'ColumnStore', 'NumpyOps', 'PackedColumns',
           'ShufflingBuffer', 'Store', 'Table', 'compiled_shuffle_in_use', 'num_rows', 'ramps', 'slice_rows',
           'take_rows']
