"""JAX: numpy batches of a reader for a JAX training loop, placed on devices if asked, and a Grain dataset.

* :class:`DataLoader` cuts batches of ``batch_size`` rows from a reader's columns (optionally shuffled in a
  buffer) and yields them as dicts of numpy arrays, or placed with ``jax.device_put`` (``device=``) or made into
  global arrays with ``jax.make_array_from_process_local_data`` (``sharding=``). Every JAX process reads its own
  shard: make the reader with ``cur_shard='auto'``, which is ``jax.process_index()`` of ``jax.process_count()``
  once ``jax.distributed.initialize()`` was called. ``state_dict()``/``load_state_dict()`` save and restore the
  position exactly, as the torch loaders do.
* :class:`ReaderIterDataset` is a ``grain.IterDataset`` whose iterator has ``get_state``/``set_state``, so
  Grain's own checkpoint handler (``grain.checkpoint.CheckpointHandler``, also through Orbax) saves and restores
  the reader's position with the rest of a pipeline built on it (``.map``, ``.batch``, ...).

The iteration rules are those of :class:`petastorm.reading.BatchStream`: each ``iter()`` (each epoch) starts
the reader's next pass, an endless reader (``num_epochs=None``) continues, ``len()`` is the batches of a pass.

Importing this module imports jax; :class:`ReaderIterDataset` needs grain (``pip install 'neo-petastorm[jax]'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from petastorm._checks import check_positive_int
from petastorm._optional import import_optional
from petastorm.reading.batch_stream import ROW_IDS, BatchStream, check_capacity
from petastorm.reading.source import as_column_source
from petastorm.shuffle import Table

__all__ = ['DataLoader', 'ReaderIterDataset']

jax = import_optional('jax', 'petastorm.jax')
try:  # Grain is optional beside jax: only ReaderIterDataset needs it.
    import grain as _grain
except ImportError:
    _grain = None
_IterDataset: Any = object if _grain is None else _grain.IterDataset
_DatasetIterator: Any = object if _grain is None else _grain.DatasetIterator


def _columns(table: Table, as_tuple: bool) -> dict[str, np.ndarray]:
    return {name: values for name, values in table.items() if name != ROW_IDS}


class DataLoader:
    """Batches of a reader's rows as dicts of numpy arrays (or JAX arrays), for JAX training loops.

    Args:
        reader: a reader from ``make_reader`` or ``make_batch_reader`` (stopped and joined when the loader's
            with-block ends); ``cur_shard='auto'`` gives each JAX process its shard.
        batch_size: rows per batch (the last batch of a pass may be smaller).
        shuffling_queue_capacity: 0 keeps the reader's order; otherwise rows are drawn at random from a buffer of
            that many, seeded from the reader's ``seed``.
        device: a ``jax.Device`` (or a ``jax.sharding.Sharding``) each batch is put on with ``jax.device_put``.
        sharding: a ``jax.sharding.Sharding`` of the global batch: each process's batch becomes its part of
            global arrays (``jax.make_array_from_process_local_data``); give either ``device`` or ``sharding``.

    Example:
        >>> with DataLoader(make_batch_reader(url, cur_shard='auto', shard_mode='rows', seed=0), 64) as loader:
        ...     for batch in loader:
        ...         params = train_step(params, batch['x'], batch['y'])
    """

    def __init__(self, reader: Any, batch_size: int, shuffling_queue_capacity: int = 0, *, device: Any = None,
                 sharding: Any = None) -> None:
        source = as_column_source(type(self).__name__, reader)
        try:
            if device is not None and sharding is not None:
                raise ValueError('give DataLoader either device= or sharding=, not both')
            self.reader = reader
            self.batch_size = check_positive_int('batch_size', batch_size)
            self.shuffling_queue_capacity = check_capacity(shuffling_queue_capacity)
            self.device = device
            self.sharding = sharding
            self._stream = BatchStream(source, self.batch_size, self.shuffling_queue_capacity, finish=self._finish,
                                       name='petastorm.jax.DataLoader')
        except BaseException:
            source.stop()
            source.join()
            raise
        self._source = source

    def _finish(self, table: Table, as_tuple: bool) -> Any:
        batch = _columns(table, as_tuple)
        if self.sharding is not None:
            return {name: jax.make_array_from_process_local_data(self.sharding, np.asarray(values))
                    for name, values in batch.items()}
        if self.device is not None:
            return jax.device_put(batch, self.device)
        return batch

    def __iter__(self) -> Iterator[Any]:
        return iter(self._stream)

    def __len__(self) -> int:
        batches = self._stream.num_batches()
        if batches is None:
            raise TypeError('len() of a petastorm.jax.DataLoader needs a reader whose row count is known in advance '
                            '(num_epochs set, no predicate, no filters)')
        return batches

    def state_dict(self) -> dict[str, Any]:
        """The position: plain ints, lists and strings (fits JSON and every checkpoint format).

        This process's own; with several JAX processes save each one's (as Grain's checkpoints do, one file per
        process) and restore each process from its own.
        """
        return self._stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration delivers exactly the rows not delivered yet."""
        self._stream.load_state_dict(state)

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._source.stop()
        self._source.join()

    def __repr__(self) -> str:
        return (f'<petastorm.jax.DataLoader batch_size={self.batch_size}, '
                f'shuffling_queue_capacity={self.shuffling_queue_capacity}, reader={self.reader!r}>')


def _rows(table: Table, as_tuple: bool) -> Any:
    row = {name: values[0] for name, values in table.items() if name != ROW_IDS}
    return tuple(row.values()) if as_tuple else row


class ReaderIterDataset(_IterDataset):
    """A ``grain.IterDataset`` of a reader's rows (or batches of numpy columns) with an exact, saveable position.

    Its iterator's ``get_state()`` is the reader's position (a JSON-able dict), ``set_state()`` continues from one,
    so ``grain.checkpoint.CheckpointHandler`` (one file per JAX process) restores exactly the rows not delivered
    yet, also through the transformations of a pipeline built on it. Each ``iter()`` starts the reader's next
    pass (an endless reader continues).

    Args:
        reader: a reader from ``make_reader``/``make_batch_reader`` (``cur_shard='auto'`` shards per JAX process).
        batch_size: None yields one dict of numpy values per row (batch them with ``.batch(n)``); a number yields
            dicts of numpy columns of that many rows, without any per-row object.
        shuffling_queue_capacity: rows drawn at random from a buffer of that many (0: the reader's order).
    """

    def __init__(self, reader: Any, batch_size: int | None = None, shuffling_queue_capacity: int = 0) -> None:
        if _grain is None:
            import_optional('grain', 'petastorm.jax.ReaderIterDataset')
        super().__init__()
        source = as_column_source(type(self).__name__, reader)
        rows = batch_size is None
        self.reader = reader
        self._stream = BatchStream(source, 1 if rows else check_positive_int('batch_size', batch_size),
                                   check_capacity(shuffling_queue_capacity), finish=_rows if rows else _columns,
                                   name='petastorm.jax.ReaderIterDataset')

    def __iter__(self) -> Any:
        return _ReaderIterator(self._stream)

    def __str__(self) -> str:
        return f'ReaderIterDataset(reader={self.reader!r})'


class _ReaderIterator(_DatasetIterator):
    """The iterator of a :class:`ReaderIterDataset`: its state is the stream's."""

    def __init__(self, stream: BatchStream) -> None:
        super().__init__()
        self._stream = stream
        self._batches = iter(stream)

    def __next__(self) -> Any:
        return next(self._batches)

    def get_state(self) -> dict[str, Any]:
        return self._stream.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state)
        self._batches = iter(self._stream)
