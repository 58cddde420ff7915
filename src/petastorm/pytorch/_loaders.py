"""The two streaming loaders: ``DataLoader`` (rows, any ``collate_fn``) and ``BatchedDataLoader`` (tensors).

Both take the reader's decoded columns a row group at a time (:meth:`Reader.column_batches`) and build batches by
slicing, concatenating and gathering whole columns; no per-row object is made unless the user asks for rows (a
custom ``collate_fn``) or a column holds values torch has no tensor for. Their iteration, length and position
rules are :class:`~petastorm.pytorch._base.LoaderBase`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from petastorm.pytorch._arguments import check_callable
from petastorm.pytorch._base import LoaderBase, stop_reader_on_error
from petastorm.pytorch._collate import (
    collate_columns,
    decimal_friendly_collate,
    prepare_columns,
    rows_of,
)
from petastorm.pytorch._columns import (
    batch_columns,
    batched_variable_length,
    check_tensor_fields,
    finish_batch,
    loader_forms,
)
from petastorm.pytorch._ragged import MASK_SUFFIX, VARIABLE_LENGTHS, VariableLength
from petastorm.pytorch._tensors import TensorOps, torch
from petastorm.reading.batch_stream import ROW_IDS, check_capacity
from petastorm.shuffle import NumpyOps, Table


class DataLoader(LoaderBase):
    """Batches of rows from a ``make_reader`` or ``make_batch_reader`` reader, for PyTorch training loops.

    A batch is what ``collate_fn`` makes of ``batch_size`` rows: with the default
    :func:`decimal_friendly_collate`, a dict ``{field: tensor}`` (rows of a ``TransformSpec`` function returning
    tuples give a list of tensors by position); numbers and arrays become tensors (uint16 -> int32,
    uint32 -> int64, and bool -> uint8 as in Petastorm unless ``bool_dtype=torch.bool``), while Decimals and
    strings become lists. The last batch of a pass may be smaller (``drop_last=True`` leaves it out). The default
    collation works on whole columns and gives the same result as collating the rows.

    Torch's ``DataLoader`` arguments that apply: ``batch_size``, ``collate_fn``, ``pin_memory``, ``drop_last``.
    The reader does the parallel reading, choosing and shuffling, so ``num_workers``, ``sampler``, ``shuffle`` and
    the like raise :class:`~petastorm.pytorch.LoaderArgumentError` naming what to use instead (torch's default
    values are accepted): shuffle with the reader (``shuffle_row_groups``, ``shuffle_rows``) and
    ``shuffling_queue_capacity``, read in parallel with its ``reader_pool_type`` and ``workers_count``.

    Args:
        reader: a reader from ``make_reader`` or ``make_batch_reader``; the loader owns it (leaving the loader's
            with-block stops and joins it).
        batch_size: rows per batch.
        collate_fn: makes a batch from a list of rows (dicts, or tuples for tuple rows). Leave the default for
            the columnar fast path; any other function receives the rows, made only for its batch.
        shuffling_queue_capacity: 0 keeps the reader's order; otherwise rows are drawn at random from a buffer
            holding at least this many rows (minus one) while data keeps coming. Seeded from the reader's
            ``seed``: the same seed gives the same batches on every install, with or without the compiled
            shuffling kernel (``PETASTORM_NO_COMPILED_SHUFFLE=1`` turns it off; see
            :func:`petastorm.shuffle.compiled_shuffle_in_use`).
        variable_length: what a batch of arrays with different shapes (ragged and nested lists) becomes:
            ``'list'`` (default) a list of per-row tensors (a batch whose shapes agree is stacked, as torch would);
            ``'pad'`` a tensor zero-padded (``padding_value``) to the largest shape, plus a bool mask of the real
            elements under the key ``'<field>_mask'`` (for fields whose schema shape has a ``None`` dimension, in
            every batch) or, for tuple rows, a ``(padded, mask)`` pair in place of the value; ``'jagged'`` a
            :class:`~petastorm.pytorch.JaggedTensor` (``values`` and int64 ``offsets`` straight from the column,
            at any depth); ``'nested'`` a ``torch.nested`` jagged tensor (one ragged dimension; torch 2.4 and later).
        padding_value: the value ``'pad'`` fills in.
        pin_memory: copy batches to pinned memory (when an accelerator is available).
        nulls: what a null becomes. None (default): a ``TypeError`` naming the field, as Petastorm raised;
            ``'mask'``: the values (0 where null) plus a bool tensor ``'<field>_valid'`` (True where not null) for
            every nullable field, in every batch (struct fields and list elements get theirs inside); a number:
            nulls become it; a dict ``{field or 'struct.leaf': 'mask' or a number}`` chooses per field (fields
            not named refuse nulls, unless the key ``'*'`` says what every other field does). Null elements of
            a list field are masked only when named, ``{'ids[]': 'mask'}`` (``JaggedTensor.values_valid``).
            Struct fields arrive as dicts of their fields' tensors, times as int64 counts of their unit since the
            epoch (``docs/types.md``).
        drop_last: leave out the last batch of a pass when it has fewer than ``batch_size`` rows (for BatchNorm,
            fixed-shape compiled models, and DDP). Every rank of a DDP run then gets the same number of full
            batches when the ranks read equal shares: ``make_reader(..., cur_shard='auto', shard_mode='rows',
            seed=...)`` (``docs/distributed.md``); with shards of whole row groups the ranks' row counts, and so
            their batch counts, may differ.
        bool_dtype: the tensor type of bool fields: ``torch.uint8`` (default, as Petastorm) or ``torch.bool``.
        batch_transform_fn: called on every collated batch (what ``collate_fn`` made) before it is handed over
            (and before pinning); what it returns is the batch. The place for per-batch normalisation and
            augmentation (see ``docs/pytorch.md``).
        **torch_arguments: torch's other ``DataLoader`` arguments, accepted with torch's default values only.

    Example:
        >>> with DataLoader(make_reader(url, num_epochs=2), batch_size=64, drop_last=True) as loader:
        ...     for batch in loader:
        ...         train_step(batch['image'], batch['label'])

    Each ``iter()`` starts over, as torch's ``DataLoader`` does: the reader's next ``num_epochs`` epochs, whether the
    last pass ended, was left with ``break`` or was stopped by a trainer (``num_epochs=None``: the endless pass
    continues where it stopped; see ``docs/trainers.md``). ``len(loader)`` is the number of batches of a pass when
    the reader knows its row count (``rows // batch_size`` with ``drop_last``, else rounded up), else ``TypeError``.
    """

    def __init__(self, reader: Any, batch_size: int = 1, collate_fn: Callable = decimal_friendly_collate,
                 shuffling_queue_capacity: int = 0, *, variable_length: VariableLength = 'list',
                 padding_value: Any = 0, pin_memory: bool = False, nulls: Any = None, drop_last: bool = False,
                 bool_dtype: Any = torch.uint8, batch_transform_fn: Callable | None = None,
                 **torch_arguments: Any) -> None:
        with stop_reader_on_error(reader):
            check_callable('DataLoader', 'collate_fn', collate_fn, optional=False)
            super().__init__(reader, batch_size, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                             bool_dtype=bool_dtype, torch_arguments=torch_arguments,
                             batch_transform_fn=batch_transform_fn)
            self._configure(shuffling_queue_capacity, variable_length, padding_value, nulls)

    def _configure(self, shuffling_queue_capacity: int, variable_length: VariableLength, padding_value: Any,
                   nulls: Any) -> None:
        if variable_length not in VARIABLE_LENGTHS:
            raise ValueError(f"variable_length must be one of {', '.join(map(repr, VARIABLE_LENGTHS))}, got "
                             f"{variable_length!r}")
        self.shuffling_queue_capacity = check_capacity(shuffling_queue_capacity)
        self.variable_length = variable_length
        self.padding_value = padding_value
        self.nulls = nulls
        self._forms = loader_forms(type(self).__name__, self._source, variable_length, padding_value, nulls,
                                   tensors=False, bool_to_uint8=self._bool_to_uint8)
        fields = self._source.info.schema.fields
        self._variable_fields = frozenset(name for name, field in fields.items()
                                          if field.shape is not None and None in tuple(field.shape))
        if variable_length == 'pad':
            clashes = sorted(n for n in self._variable_fields if n + MASK_SUFFIX in fields)
            if clashes:
                raise ValueError(f"variable_length='pad' adds '<field>{MASK_SUFFIX}' keys, but the schema already "
                                 f"has {[n + MASK_SUFFIX for n in clashes]}")

    def _stream_settings(self) -> tuple[Any, Callable[[Table], Table], Callable[[Table, bool], Any], bool]:
        return NumpyOps(), self._prepare, self._collate, False

    def _prepare(self, columns: Table) -> Table:
        return prepare_columns(columns, self._forms, self._bool_to_uint8)

    def _collate(self, columns: Table, as_tuple: bool) -> Any:
        columns = {name: values for name, values in columns.items() if name != ROW_IDS}
        if self.collate_fn is decimal_friendly_collate:
            batch = collate_columns(columns, as_tuple, self.variable_length, self._variable_fields,
                                    self.padding_value, self._forms, self._bool_to_uint8)
        else:
            batch = self.collate_fn(rows_of(columns, as_tuple, self._bool_to_uint8))
        return self._hand_over(batch)


class BatchedDataLoader(LoaderBase):
    """Large batches of tensors from whole columns: the fast loader for numeric columns.

    Built for ``make_batch_reader`` (works with ``make_reader`` too). Each column of each row group becomes one
    tensor (``transform_fn``); batches are slices of those columns, or gathers from a shuffling buffer (on the
    CPU, numeric columns packed into one record per row, so that a random row is one memory access; on another
    ``device``, one tensor per column there). A batch is a dict ``{field: tensor}`` (a list by position for rows
    of a transform returning tuples); the last batch of a pass may be smaller (``drop_last=True`` leaves it out).
    Ragged and nested lists come as :class:`~petastorm.pytorch.JaggedTensor` s (``variable_length``), structs as
    dicts of tensors, times as int64 counts of their unit; nulls are refused unless ``nulls`` says what to make of
    them. Dtypes as for :class:`DataLoader` (uint16 -> int32, uint32 -> int64, bool -> uint8 unless
    ``bool_dtype=torch.bool``). Strings and Decimals are not supported (use :class:`DataLoader`); the error names
    the fields.

    Torch's ``DataLoader`` arguments that apply: ``batch_size``, ``pin_memory``, ``drop_last``; the others raise
    :class:`~petastorm.pytorch.LoaderArgumentError` naming what to use instead (as for :class:`DataLoader`).

    Args:
        reader: a reader from ``make_batch_reader`` or ``make_reader`` (stopped and joined on exit).
        batch_size: rows per batch.
        transform_fn: makes a tensor of one column (a writable numpy array of a row group's values, rows first),
            called once per column per row group, before batches are cut (Petastorm's meaning); default:
            ``torch.from_numpy`` (zero-copy when the reader's array is writable). For a hook on whole batches,
            ``batch_transform_fn``.
        shuffling_queue_capacity: 0 keeps the reader's order; otherwise rows are drawn at random from a buffer
            holding at least this many rows (minus one) while data keeps coming, seeded from the reader's
            ``seed`` (the same batches with or without the compiled shuffling kernel, as for :class:`DataLoader`).
        device: where the buffer and the batches live (``'cpu'`` default, ``'cuda'``...): each row group is
            moved once, and slicing and shuffling happen on the device (list and struct columns are buffered on
            the CPU and moved per batch).
        pin_memory: copy batches to pinned memory (CPU tensors, when an accelerator is available).
        variable_length: the form of list fields: ``'jagged'`` a :class:`~petastorm.pytorch.JaggedTensor` of the
            column's values and int64 offsets, at any depth (wrap them in TorchRec's ``KeyedJaggedTensor`` as they
            are); ``'nested'`` a ``torch.nested`` jagged tensor (one ragged dimension; torch 2.4+); ``'pad'`` a
            padded tensor plus a ``'<field>_mask'`` of the real elements; ``'auto'`` (default) ``'jagged'``, except
            that a one-level list field (shape ``(None,)``) is one ``(rows, length)`` tensor as in Petastorm (an
            error names the other forms when its rows differ in length). ``transform_fn`` is applied to the other
            columns only.
        padding_value: the value ``'pad'`` fills in.
        nulls: what a null becomes, as for :class:`DataLoader`: None (default) refuses them with Petastorm's
            error, ``'mask'`` adds ``'<field>_valid'`` bool tensors, a number fills them in, a dict chooses per
            field.
        drop_last: leave out the last batch of a pass when it is short; with equal shares of rows per DDP rank
            (``shard_mode='rows'``) every rank gets the same number of full batches (see :class:`DataLoader`).
        bool_dtype: ``torch.uint8`` (default, as Petastorm) or ``torch.bool`` for bool fields.
        batch_transform_fn: called on every batch (the dict, or list, of tensors on ``device``) before it is handed
            over (and before pinning); what it returns is the batch: per-batch normalisation and augmentation.
        **torch_arguments: torch's other ``DataLoader`` arguments, accepted with torch's default values only.
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable | None = None,
                 shuffling_queue_capacity: int = 0, *, device: Any = None, pin_memory: bool = False,
                 variable_length: VariableLength = 'auto', padding_value: Any = 0, nulls: Any = None,
                 drop_last: bool = False, bool_dtype: Any = torch.uint8, batch_transform_fn: Callable | None = None,
                 **torch_arguments: Any) -> None:
        with stop_reader_on_error(reader):
            check_callable('BatchedDataLoader', 'transform_fn', transform_fn, optional=True)
            super().__init__(reader, batch_size, pin_memory=pin_memory, drop_last=drop_last, bool_dtype=bool_dtype,
                             torch_arguments=torch_arguments, batch_transform_fn=batch_transform_fn)
            self.transform_fn = transform_fn
            self.shuffling_queue_capacity = check_capacity(shuffling_queue_capacity)
            self.device = torch.device('cpu') if device is None else torch.device(device)
            check_tensor_fields(type(self).__name__, self._source)
            self.variable_length = batched_variable_length(variable_length)
            self.padding_value = padding_value
            self.nulls = nulls
            self._forms = loader_forms(type(self).__name__, self._source, variable_length, padding_value, nulls,
                                       tensors=True, bool_to_uint8=self._bool_to_uint8)

    def _stream_settings(self) -> tuple[Any, Callable[[Table], Table], Callable[[Table, bool], Any], bool]:
        # Numeric CPU columns are shuffled as packed records: a drawn row is one memory access instead of one per
        # column. With the reader's threads running, that made the main thread's shuffling ~20% cheaper per row
        # on the 5M-row scalar store (capacity 100000) than one array per column.
        return TensorOps(self.device), self._prepare, self._finish, True

    def _prepare(self, columns: Table) -> Table:
        row_ids = columns.pop(ROW_IDS, None)
        table = batch_columns(type(self).__name__, columns, self.transform_fn, self.device, self._forms,
                              self._bool_to_uint8)
        if row_ids is not None:
            table[ROW_IDS] = row_ids
        return table

    def _finish(self, batch: Table, as_tuple: bool) -> Any:
        tensors = finish_batch(batch, self._forms, self.device)
        return self._hand_over(list(tensors.values()) if as_tuple else tensors)
