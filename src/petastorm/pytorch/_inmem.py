"""``InMemBatchedDataLoader``: read a dataset once into memory, then serve many shuffled epochs from there."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from petastorm._checks import check_positive_int
from petastorm._warnings import warn_user
from petastorm.pytorch._arguments import check_callable
from petastorm.pytorch._base import LoaderBase, stop_reader_on_error
from petastorm.pytorch._columns import (
    batch_columns,
    batched_variable_length,
    check_tensor_fields,
    column_chunks,
    finish_batch,
    loader_forms,
)
from petastorm.pytorch._nested import TorchForms
from petastorm.pytorch._ragged import VariableLength
from petastorm.pytorch._tensors import TensorOps, batch_tensor, torch
from petastorm.reading.source import ColumnSource, as_column_source
from petastorm.shuffle import ColumnStore, PackedColumns, Table, num_rows, slice_rows
from petastorm.shuffle._nested import NestedColumns


class InMemBatchedDataLoader(LoaderBase):
    """Reads the whole dataset once into tensors, then serves ``num_epochs`` epochs of batches from memory.

    The constructor reads the reader to its end (at most ``rows_capacity`` rows: more are dropped with a
    warning), keeping each field as one tensor, then stops and joins the reader. Iterating yields
    ``num_epochs`` epochs of dicts ``{field: tensor}`` (lists by position for tuple rows), each epoch in a new
    random order when ``shuffle`` (``torch.randperm`` seeded with ``seed + epoch``); the last batch of an epoch
    may be smaller (``drop_last=True`` leaves it out, every epoch, as torch's ``DataLoader`` does). Batches are
    copies: changing one in place does not change the cached data. Field types as for :class:`BatchedDataLoader`
    (bool -> uint8 unless ``bool_dtype=torch.bool``); torch's ``DataLoader`` arguments other than ``batch_size``,
    ``shuffle`` and ``drop_last`` raise :class:`~petastorm.pytorch.LoaderArgumentError` naming what to use instead.

    One iteration at a time: ``iter()`` while another iterator is in the middle of its epochs raises
    ``RuntimeError``. Once an iteration delivered its last batch (also when the end was not asked for, as a trainer
    that takes ``len(loader)`` batches does) or was closed (a loop left with ``break``), another ``iter()`` serves
    the next ``num_epochs`` epochs (epochs ``num_epochs`` to ``2 * num_epochs - 1``, seeded the same way).

    Args:
        reader: a reader from ``make_batch_reader`` or ``make_reader`` (usually with ``num_epochs=1``).
        batch_size: rows per batch.
        transform_fn: makes a tensor of one column of a row group, as in :class:`BatchedDataLoader`.
        num_epochs: epochs one iteration serves.
        seed: seeds the per-epoch shuffles.
        rows_capacity: the most rows kept in memory.
        shuffle: shuffle the rows every epoch.
        variable_length: the form of list fields, as for :class:`BatchedDataLoader` (default ``'auto'``).
        padding_value: the value ``'pad'`` fills in.
        nulls: what a null becomes, as for :class:`BatchedDataLoader`.
        drop_last: leave out the last batch of every epoch when it is short (the rows left out change from epoch
            to epoch when shuffled). With equal shares of rows per DDP rank (``shard_mode='rows'``), every rank
            gets the same number of full batches.
        bool_dtype: ``torch.uint8`` (default, as Petastorm) or ``torch.bool`` for bool fields.
        **torch_arguments: torch's other ``DataLoader`` arguments, accepted with torch's default values only.
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable | None = None,
                 num_epochs: int = 1, seed: int = 0, rows_capacity: int = 1024, shuffle: bool = False, *,
                 variable_length: VariableLength = 'auto', padding_value: Any = 0, nulls: Any = None,
                 drop_last: bool = False, bool_dtype: Any = torch.uint8, **torch_arguments: Any) -> None:
        with stop_reader_on_error(reader):
            check_callable('InMemBatchedDataLoader', 'transform_fn', transform_fn, optional=True)
            super().__init__(reader, batch_size, drop_last=drop_last, bool_dtype=bool_dtype,
                             torch_arguments=torch_arguments)
            check_positive_int('num_epochs', num_epochs)
            check_positive_int('rows_capacity', rows_capacity)
            check_tensor_fields(type(self).__name__, self._source)
            self._forms = loader_forms(type(self).__name__, self._source, batched_variable_length(variable_length),
                                       padding_value, nulls, tensors=True,
                                       bool_to_uint8=self._bool_to_uint8)
        self.transform_fn = transform_fn
        self.num_epochs = int(num_epochs)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rows_capacity = int(rows_capacity)
        try:
            loaded = _load_columns(self._source, transform_fn, self.rows_capacity, self._forms, self._bool_to_uint8)
            self._keys, self._store, self._num_rows, self._as_tuple, self._nested = loaded
        finally:
            reader.stop()
            reader.join()
        self._serving = False
        self._iterations = 0

    def __iter__(self) -> Iterator[Any]:
        if self._serving:
            raise RuntimeError("InMemBatchedDataLoader couldn't be used multiple times, please specify total number "
                               'of epochs using num_epochs in constructor.')
        self._serving = True
        first_epoch = self._iterations * self.num_epochs
        self._iterations += 1
        return self._epochs(first_epoch)

    def _epochs(self, first_epoch: int) -> Iterator[Any]:
        # Serving ends with the last batch (a trainer that takes len() batches never asks for the end), or when the
        # iterator is closed (a loop left with break, an interrupt); then another iteration may serve the next
        # num_epochs epochs.
        try:
            if self._nested is not None:
                yield from self._nested_epochs(first_epoch)
            else:
                yield from self._serve_epochs(first_epoch)
        finally:
            self._serving = False

    def _serve_epochs(self, first_epoch: int) -> Iterator[Any]:
        n = self._num_rows
        step = _chunk_rows(self._store, self.batch_size)
        gather = _gatherer(self._store, self._keys, n)
        remaining = len(self)
        served = self._rows_per_epoch()  # the rows of an epoch's batches: drop_last leaves the short tail out
        for epoch in range(first_epoch, first_epoch + self.num_epochs):
            order = None
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(n, generator=generator)
            # One gather per chunk of many batches, not per batch: batches are then views of the chunk's columns.
            for chunk_start in range(0, served, step):
                chunk_stop = min(chunk_start + step, served)
                if order is None:
                    chunk = self._store.slice(chunk_start, chunk_stop)
                    columns = [batch_tensor(chunk[key]) for key in self._keys]
                else:
                    columns = gather(order[chunk_start:chunk_stop])
                if chunk_stop - chunk_start <= self.batch_size:
                    batches: Iterator[list[Any]] = iter((columns,))
                else:
                    batches = ([column[start:start + self.batch_size] for column in columns]
                               for start in range(0, chunk_stop - chunk_start, self.batch_size))
                for values in batches:
                    remaining -= 1
                    if not remaining:
                        self._serving = False
                    yield values if self._as_tuple else dict(zip(self._keys, values, strict=True))

    def _nested_epochs(self, first_epoch: int) -> Iterator[Any]:
        """Epochs of a table with list or struct columns: rows gathered per batch, their lists from the arenas."""
        assert self._nested is not None
        n = self._num_rows
        remaining = len(self)
        served = self._rows_per_epoch()
        for epoch in range(first_epoch, first_epoch + self.num_epochs):
            order = None
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(n, generator=generator).numpy()
            for start in range(0, served, self.batch_size):
                stop = min(start + self.batch_size, served)
                rows = np.arange(start, stop) if order is None else order[start:stop]
                table = self._nested.decode(self._store.take(rows))
                tensors = finish_batch(table, self._forms, torch.device('cpu'))
                remaining -= 1
                if not remaining:
                    self._serving = False
                yield list(tensors.values()) if self._as_tuple else tensors

    def _rows_per_epoch(self) -> int:
        return self._num_rows - self._num_rows % self.batch_size if self.drop_last else self._num_rows

    def __len__(self) -> int:
        return self.num_epochs * math.ceil(self._rows_per_epoch() / self.batch_size)

    def __repr__(self) -> str:
        from petastorm._describe import describe_names

        state = (', drop_last=True' if self.drop_last else '') + \
            (f', iterations={self._iterations}' if self._iterations else '')
        return (f'<InMemBatchedDataLoader batch_size={self.batch_size}, rows_in_memory={self._num_rows}, '
                f'fields={describe_names(self._keys)}, num_epochs={self.num_epochs}, shuffle={self.shuffle}, '
                f'seed={self.seed}, batches={len(self)}{state}, reader={self.reader!r}>')

    def __exit__(self, *exc_info: Any) -> None:
        """Nothing to release: the reader was stopped once the data was in memory."""


def _pack_rows(table: Table) -> bool:
    """Keep rows packed (:class:`PackedColumns`) when numbers, one per row and column, are most of a row's bytes.

    Packed records cost one memory access per row where separate columns cost one per column: a win for tables
    of many scalar columns. Rows dominated by arrays (images) gain nothing from it and gather faster as separate
    tensors, with torch's gathers.
    """
    if not PackedColumns.can_hold(table):
        return False
    scalar_bytes = sum(array.dtype.itemsize for array in table.values() if array.ndim == 1)
    row_bytes = sum(array[:1].nbytes for array in table.values())
    return 2 * scalar_bytes > row_bytes


def _gatherer(store: Any, keys: list[str], rows: int) -> Callable[[Any], list[Any]]:
    """A function of a tensor of row positions returning new tensors of those rows, one per column of ``keys``.

    The reader is stopped once the data is loaded, so torch's gathers may use its intra-op threads: on images
    they run about twice as fast as numpy's single-threaded ones. Packed records are gathered by numpy, which
    moves opaque fixed-size items fastest.
    """
    if isinstance(store, PackedColumns):
        def gather_packed(index: Any) -> list[Any]:
            chunk = store.take(index.numpy(), take_rows=_gather_rows)
            return [batch_tensor(chunk[key]) for key in keys]
        return gather_packed
    tensors = [batch_tensor(store.column(key, rows)) for key in keys]
    return lambda index: [tensor.index_select(0, index) for tensor in tensors]


def _gather_rows(array: np.ndarray, index: np.ndarray) -> Any:
    """The rows of a numpy array at ``index``, gathered by torch into a new tensor."""
    return torch.from_numpy(array).index_select(0, torch.from_numpy(index))


# About the size of a core's cache: gathered rows are split into columns while they are still in it.
_CHUNK_BYTES = 1 << 20


def _chunk_rows(store: Any, batch_size: int) -> int:
    """Rows gathered at once when serving an epoch: whole batches, about ``_CHUNK_BYTES`` of data."""
    row_nbytes = max(1, store.row_nbytes)
    return max(1, _CHUNK_BYTES // row_nbytes // batch_size) * batch_size


class _TensorColumns(ColumnStore):
    """Loaded columns as one array or tensor each: rows dominated by arrays, or columns of dtypes numpy lacks."""

    def __init__(self, columns: Table | None = None, allocated: int = 0) -> None:
        super().__init__(TensorOps(), columns, allocated)

    def slice(self, start: int, stop: int) -> Table:
        return {name: column[start:stop].copy() if isinstance(column, np.ndarray) else column[start:stop].clone()
                for name, column in self._columns.items()}


def _load_columns(source: ColumnSource, transform_fn: Callable | None, rows_capacity: int,
                  forms: TorchForms,
                  bool_to_uint8: bool = True) -> tuple[list[str], Any, int, bool, NestedColumns | None]:
    """Read the reader to its end (or ``rows_capacity`` rows): ``(names, storage, rows, rows are tuples)``.

    Each chunk is written into preallocated storage as it arrives (while the reader's workers go on reading):
    :class:`PackedColumns` when scalar numpy columns make most of a row (:func:`_pack_rows`), else one array or
    tensor per column. The storage is sized from the reader's announced row count, and grows by doubling when that
    is unknown; :func:`_gatherer` and its ``slice`` give the columns of the rows asked for. List, struct and masked
    columns are kept as the row columns of :class:`~petastorm.shuffle._nested.NestedColumns` (whose arenas hold
    the lists' elements), returned last.
    """
    known = source.num_rows_per_pass
    store: Any = None
    keys: list[str] = []
    loaded = 0
    as_tuple = False
    dropped = 0
    nested: NestedColumns | None = None
    for columns, chunk_is_tuple in column_chunks(source):
        as_tuple = chunk_is_tuple
        table = batch_columns('InMemBatchedDataLoader', columns, transform_fn, torch.device('cpu'), forms,
                              bool_to_uint8)
        rows = num_rows(table)
        take = min(rows, rows_capacity - loaded)
        dropped += rows - take
        if take <= 0:
            continue
        if take < rows:
            table = slice_rows(table, 0, take)
        if nested is not None or NestedColumns.needed(table):
            nested = nested or NestedColumns()
            table = nested.encode(table)
        if store is None:
            keys = list(table)
            store = PackedColumns(table, 0) if _pack_rows(table) else _TensorColumns()
            expected = known if known is not None else 4 * take
            store = store.grown(table, max(take, min(rows_capacity, expected)), 0)
        elif not store.fits(table, loaded + take):
            store = store.grown(table, min(rows_capacity, max(2 * loaded, loaded + take)), loaded)
        store.write(loaded, table)
        loaded += take
    if dropped:
        warn_user(f'InMemBatchedDataLoader kept the first {rows_capacity} rows (rows_capacity) and dropped '
                      f'{dropped} more; pass a larger rows_capacity to keep them all', UserWarning)
    if store is None:
        store = _TensorColumns()
    return keys, store, loaded, as_tuple, nested


def _load_rows_into_mem(reader: Any, transform_fn: Callable | None, rows_capacity: int) -> tuple[list[str], list]:
    """``(field names, one tensor per field)`` of up to ``rows_capacity`` rows read from ``reader``."""
    source = as_column_source('_load_rows_into_mem', reader)
    keys, store, rows, _, _ = _load_columns(source, transform_fn, rows_capacity,
                                            loader_forms('_load_rows_into_mem', source, 'auto', 0, None, tensors=True))
    columns = store.slice(0, rows) if keys else {}
    return keys, [batch_tensor(columns[key]) for key in keys]
