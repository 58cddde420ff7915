"""``InMemBatchedDataLoader``: read a dataset once into memory, then serve many shuffled epochs from there."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from petastorm._checks import check_positive_int, is_integer
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
from petastorm.reading.source import ColumnSource, as_column_source, check_no_ngram
from petastorm.shuffle import ColumnStore, PackedColumns, Table, num_rows, slice_rows
from petastorm.shuffle._nested import NestedColumns


class ServedPosition(NamedTuple):
    """Where an :class:`InMemBatchedDataLoader` is: an iteration (``num_epochs`` epochs) and its batches delivered."""

    iteration: int
    delivered: int


# torch is imported at run time (import_optional), so its classes are values to the type checker.
_InfiniteConstantSampler: Any = torch.utils.data.dataloader._InfiniteConstantSampler


class _EpochSampler(_InfiniteConstantSampler):
    """torch's sampler of an iterable dataset, passing ``set_epoch`` on to its loader."""

    def __init__(self, set_epoch: Callable[[], Callable[[int], None] | None]) -> None:
        super().__init__()
        self._set_epoch = set_epoch

    def set_epoch(self, epoch: int) -> None:
        method = self._set_epoch()
        if method is not None:
            method(epoch)


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
    :meth:`state_dict` is that position (the iteration and the batches it delivered, as Lightning and Accelerate save
    in checkpoints); :meth:`load_state_dict` on the same loader made again continues with exactly the batches left.

    Args:
        reader: a reader from ``make_batch_reader`` or ``make_reader`` (usually with ``num_epochs=1``).
        batch_size: rows per batch.
        transform_fn: makes a tensor of one column of a row group, as in :class:`BatchedDataLoader` (called while
            the data is loaded, once).
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
        batch_transform_fn: called on every batch served, every epoch, before it is handed over; what it returns is
            the batch (per-batch augmentation, which differs epoch to epoch).
        **torch_arguments: torch's other ``DataLoader`` arguments, accepted with torch's default values only.
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable | None = None,
                 num_epochs: int = 1, seed: int = 0, rows_capacity: int = 1024, shuffle: bool = False, *,
                 variable_length: VariableLength = 'auto', padding_value: Any = 0, nulls: Any = None,
                 drop_last: bool = False, bool_dtype: Any = torch.uint8, batch_transform_fn: Callable | None = None,
                 **torch_arguments: Any) -> None:
        with stop_reader_on_error(reader):
            check_callable('InMemBatchedDataLoader', 'transform_fn', transform_fn, optional=True)
            super().__init__(reader, batch_size, drop_last=drop_last, bool_dtype=bool_dtype,
                             torch_arguments=torch_arguments, batch_transform_fn=batch_transform_fn)
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
        self._position = ServedPosition(0, 0)  # the next batch to serve: its iteration, and the batches before it
        self._started = False  # the iterator being served has read its position
        # Trainers tell the sampler the epoch they start (Lightning at every epoch, also after a restart).
        object.__setattr__(self, 'sampler', _EpochSampler(weakref.WeakMethod(self.set_epoch)))

    def set_epoch(self, epoch: int) -> None:
        """Serve iteration ``epoch`` next (as ``DistributedSampler.set_epoch``; trainers call it at each epoch start).

        Lightning restores a loader's state only when a checkpoint was saved in the middle of an epoch; after one
        saved at an epoch's end, this is how a resumed run serves the next epochs, not the first ones again. A
        position restored in the middle of that iteration is kept; once an iteration delivers it changes nothing.
        """
        if not (self._serving and self._started) and self._position.iteration != epoch:
            if not is_integer(epoch) or epoch < 0:
                raise ValueError(f'set_epoch: epoch must be an integer >= 0, got {epoch!r}')
            self._position = ServedPosition(int(epoch), 0)

    def __iter__(self) -> Iterator[Any]:
        if self._serving:
            raise RuntimeError("InMemBatchedDataLoader couldn't be used multiple times, please specify total number "
                               'of epochs using num_epochs in constructor.')
        self._serving = True
        self._started = False
        return self._epochs()

    def _epochs(self) -> Iterator[Any]:
        # The position is read at the first next(): trainers call iter() before set_epoch().
        # Serving ends with the last batch (a trainer that takes len() batches never asks for the end), or when the
        # iterator is closed (a loop left with break, an interrupt); then another iteration serves the next
        # num_epochs epochs.
        self._started = True
        iteration, skip = self._position
        try:
            if self._nested is not None:
                yield from self._nested_epochs(iteration * self.num_epochs, skip)
            else:
                yield from self._serve_epochs(iteration * self.num_epochs, skip)
        finally:
            if self._position.iteration == iteration:
                self._position = ServedPosition(iteration + 1, 0)
            self._serving = False

    def _delivered(self) -> None:
        """Count a batch handed over; after the iteration's last one, the next iteration may start."""
        iteration, delivered = self._position
        self._position = ServedPosition(iteration, delivered + 1)
        if delivered + 1 == len(self):
            self._position = ServedPosition(iteration + 1, 0)
            self._serving = False

    def _start(self, first_epoch: int, skip: int) -> tuple[int, int]:
        """``(epoch, row)`` where an iteration that already delivered ``skip`` batches continues."""
        per_epoch = math.ceil(self._rows_per_epoch() / self.batch_size)
        return first_epoch + skip // per_epoch, (skip % per_epoch) * self.batch_size

    def _serve_epochs(self, first_epoch: int, skip: int) -> Iterator[Any]:
        n = self._num_rows
        step = _chunk_rows(self._store, self.batch_size)
        gather = _gatherer(self._store, self._keys, n)
        served = self._rows_per_epoch()  # the rows of an epoch's batches: drop_last leaves the short tail out
        start_epoch, start_row = self._start(first_epoch, skip)
        for epoch in range(start_epoch, first_epoch + self.num_epochs):
            order = None
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(n, generator=generator)
            # One gather per chunk of many batches, not per batch: batches are then views of the chunk's columns.
            for chunk_start in range(start_row if epoch == start_epoch else 0, served, step):
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
                    batch = self._hand_over(values if self._as_tuple else dict(zip(self._keys, values, strict=True)))
                    self._delivered()
                    yield batch

    def _nested_epochs(self, first_epoch: int, skip: int) -> Iterator[Any]:
        """Epochs of a table with list or struct columns: rows gathered per batch, their lists from the arenas."""
        assert self._nested is not None
        n = self._num_rows
        served = self._rows_per_epoch()
        start_epoch, start_row = self._start(first_epoch, skip)
        for epoch in range(start_epoch, first_epoch + self.num_epochs):
            order = None
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(n, generator=generator).numpy()
            for start in range(start_row if epoch == start_epoch else 0, served, self.batch_size):
                stop = min(start + self.batch_size, served)
                rows = np.arange(start, stop) if order is None else order[start:stop]
                table = self._nested.decode(self._store.take(rows))
                tensors = finish_batch(table, self._forms, torch.device('cpu'))
                batch = self._hand_over(list(tensors.values()) if self._as_tuple else tensors)
                self._delivered()
                yield batch

    @property
    def use_stateful_dataloader(self) -> bool:
        """True: :meth:`state_dict` keeps the position (Accelerate's ``save_state``/``load_state`` use it)."""
        return True

    def state_dict(self) -> dict[str, Any]:
        """The position in the served epochs: the iteration being served and the batches it delivered.

        Lightning and Accelerate save it in their checkpoints. :meth:`load_state_dict` on a loader made again with
        the same data and arguments (a new process reads the same rows) makes its next iteration continue exactly:
        the batches not delivered yet of the saved iteration, in the same order (epoch ``e`` is shuffled with
        ``seed + e`` whatever the process), then the later iterations as usual. Saved between two iterations, the
        next iteration serves the next epochs.
        """
        return {'iteration': self._position.iteration, 'batches_delivered': self._position.delivered,
                **self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next ``iter()`` serves what the saved loader had left.

        Raises:
            ValueError: the state was saved by a loader with other rows or arguments (naming what differs), or is
                not a state of this loader.
            RuntimeError: an iteration is being served.
        """
        if self._serving and self._started:
            raise RuntimeError('InMemBatchedDataLoader.load_state_dict() while an iteration is being served: '
                               'restore before iterating')
        if not isinstance(state, dict) or not {'iteration', 'batches_delivered'} <= state.keys():
            raise ValueError(f'not a state of an InMemBatchedDataLoader (expected the keys iteration, '
                             f'batches_delivered): {state!r}')
        differ = [f'{key}={state[key]!r} (this loader: {value!r})' for key, value in self._fingerprint().items()
                  if key in state and state[key] != value]
        if differ:
            raise ValueError(f'the state was saved by an InMemBatchedDataLoader with {", ".join(differ)}; restore '
                             f'it into a loader made with the same data and arguments')
        iteration, delivered = int(state['iteration']), int(state['batches_delivered'])
        if iteration < 0 or not 0 <= delivered < len(self):
            raise ValueError(f'InMemBatchedDataLoader state out of range: iteration={iteration}, '
                             f'batches_delivered={delivered} (an iteration has {len(self)} batches)')
        self._position = ServedPosition(iteration, delivered)

    def _fingerprint(self) -> dict[str, Any]:
        """What must be the same for a saved position to mean the same batches."""
        return {'rows': self._num_rows, 'batch_size': self.batch_size, 'num_epochs': self.num_epochs,
                'shuffle': self.shuffle, 'seed': self.seed, 'drop_last': bool(self.drop_last)}

    def _rows_per_epoch(self) -> int:
        return self._num_rows - self._num_rows % self.batch_size if self.drop_last else self._num_rows

    def __len__(self) -> int:
        return self.num_epochs * math.ceil(self._rows_per_epoch() / self.batch_size)

    def __repr__(self) -> str:
        from petastorm._describe import describe_names

        iterations = self._position.iteration + (1 if self._serving else 0)
        state = (', drop_last=True' if self.drop_last else '') + \
            (f', iterations={iterations}' if iterations else '')
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
    check_no_ngram('_load_rows_into_mem', source)
    keys, store, rows, _, _ = _load_columns(source, transform_fn, rows_capacity,
                                            loader_forms('_load_rows_into_mem', source, 'auto', 0, None, tensors=True))
    columns = store.slice(0, rows) if keys else {}
    return keys, [batch_tensor(columns[key]) for key in keys]
