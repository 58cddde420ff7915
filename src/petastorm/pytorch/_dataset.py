"""``ReaderIterableDataset``: a reader as a ``torch.utils.data.IterableDataset`` with a position.

For torch's ``DataLoader`` and torchdata's ``StatefulDataLoader``, which iterate a dataset (in worker processes
when ``num_workers > 0``) and save its ``state_dict()``. Batches are cut from the reader's columns by the same
:class:`~petastorm.reading.batch_stream.BatchStream` as the petastorm loaders, so a saved position names the rows not
delivered yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from petastorm._checks import check_positive_int
from petastorm.pytorch._tensors import torch
from petastorm.reading.batch_stream import ROW_IDS, BatchStream, check_capacity
from petastorm.reading.source import ColumnSource, as_column_source
from petastorm.shuffle import Table

_IterableDataset: Any = torch.utils.data.IterableDataset


def _rows(table: Table, as_tuple: bool) -> Any:
    row = {name: values[0] for name, values in table.items() if name != ROW_IDS}
    return tuple(row.values()) if as_tuple else row


def _columns(table: Table, as_tuple: bool) -> Any:
    columns = {name: values for name, values in table.items() if name != ROW_IDS}
    return tuple(columns.values()) if as_tuple else columns


class ReaderIterableDataset(_IterableDataset):
    """A reader's rows (or batches of numpy columns) as an ``IterableDataset`` whose ``state_dict()`` is exact.

    With torchdata's ``StatefulDataLoader`` the dataset's ``state_dict``/``load_state_dict`` are saved and restored
    with the loader's, so a restored loader continues with exactly the rows not delivered yet. Iteration follows
    :class:`petastorm.reading.batch_stream.BatchStream`: each ``iter()`` (each epoch) starts the reader's next pass, an
    endless reader (``num_epochs=None``) continues.

    Args:
        reader: a reader from ``make_reader``/``make_batch_reader`` (for ``num_workers=0``), or a function
            ``reader(cur_shard, shard_count)`` making one, called in each worker process with the worker's number
            and the number of workers (``num_workers > 0``; every worker reads its own shard).
        batch_size: None yields one dict of values per row (collated by the loader's ``batch_size``); a number
            yields dicts of numpy columns of that many rows (give the loader ``batch_size=None``): no row objects.
        shuffling_queue_capacity: rows drawn at random from a buffer of that many (0: the reader's order).

    Example:
        >>> from torchdata.stateful_dataloader import StatefulDataLoader
        >>> dataset = ReaderIterableDataset(make_batch_reader(url, seed=0, shuffle_rows=True), batch_size=64)
        >>> loader = StatefulDataLoader(dataset, batch_size=None)
        >>> state = loader.state_dict()  # at any step; a new loader's load_state_dict(state) continues from it
    """

    def __init__(self, reader: Any, batch_size: int | None = None, shuffling_queue_capacity: int = 0) -> None:
        self._factory: Callable[[int, int], Any] | None = None
        self._source: ColumnSource | None = None
        if callable(reader) and not hasattr(reader, 'column_batches') and not hasattr(reader, '__iter__'):
            self._factory = reader
        else:
            self._source = as_column_source(type(self).__name__, reader)
        self.batch_size = None if batch_size is None else check_positive_int('batch_size', batch_size)
        self.shuffling_queue_capacity = check_capacity(shuffling_queue_capacity)
        self._stream_core: BatchStream | None = None
        self._pending_state: dict[str, Any] | None = None

    def _stream(self) -> BatchStream:
        if self._stream_core is None:
            source = self._source
            if source is None:
                info = torch.utils.data.get_worker_info()
                shard, count = (0, 1) if info is None else (info.id, info.num_workers)
                assert self._factory is not None
                source = self._source = as_column_source(type(self).__name__, self._factory(shard, count))
            elif torch.utils.data.get_worker_info() is not None:
                raise RuntimeError('a ReaderIterableDataset made of one reader is read in the main process only '
                                   '(num_workers=0); for worker processes, pass a function making a reader of a '
                                   'shard: ReaderIterableDataset(lambda shard, count: make_reader(url, '
                                   'cur_shard=shard, shard_count=count, ...))')
            rows = self.batch_size is None
            self._stream_core = BatchStream(source, self.batch_size or 1, self.shuffling_queue_capacity,
                                            finish=_rows if rows else _columns, name=type(self).__name__)
            if self._pending_state is not None:
                self._stream_core.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._stream_core

    def __iter__(self) -> Iterator[Any]:
        return iter(self._stream())

    def __len__(self) -> int:
        stream = self._stream()
        rows = stream.rows_per_pass if self.batch_size is None else stream.num_batches()
        if rows is None:
            raise TypeError('len() of a ReaderIterableDataset needs a reader whose row count is known in advance')
        return rows

    def state_dict(self) -> dict[str, Any]:
        """The position (see :meth:`petastorm.reading.batch_stream.BatchStream.state_dict`)."""
        if self._stream_core is None and self._pending_state is not None:
            return self._pending_state
        return self._stream().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration delivers exactly the rows not delivered yet."""
        if self._stream_core is None and self._source is None:
            self._pending_state = state  # the reader is made in the worker, at the first iteration
            return
        self._stream().load_state_dict(state)

    def close(self) -> None:
        """Stop and join the reader."""
        if self._source is not None:
            self._source.stop()
            self._source.join()

    def __enter__(self) -> ReaderIterableDataset:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
