"""The three loaders: ``DataLoader``, ``BatchedDataLoader`` and ``InMemBatchedDataLoader``.

All of them take the reader's decoded columns a row group at a time (:meth:`Reader.column_batches`) and
build batches by slicing, concatenating and gathering whole columns; no per-row object is made unless the user
asks for rows (a custom ``collate_fn``) or a column holds values torch has no tensor for.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from petastorm._checks import check_positive_int
from petastorm._warnings import warn_user
from petastorm.columns import is_nested
from petastorm.pytorch._arguments import check_callable, check_torch_arguments
from petastorm.pytorch._collate import (
    MASK_SUFFIX,
    VariableLength,
    collate_columns,
    decimal_friendly_collate,
    prepare_columns,
    rows_of,
)
from petastorm.pytorch._nested import VALID_SUFFIX, VARIABLE_LENGTHS, NullOption, TorchForms, check_forms
from petastorm.pytorch._tensors import (
    TensorOps,
    TorchTypeError,
    accelerator_available,
    as_numpy_view,
    batch_tensor,
    check_no_none,
    pin,
    stack_values,
    to_tensor,
    torch,
)
from petastorm.reading.batch_stream import ROW_IDS as _ROW_IDS
from petastorm.reading.batch_stream import BatchStream
from petastorm.reading.source import ColumnSource, as_column_source
from petastorm.shuffle import NumpyOps, Table

logger = logging.getLogger(__name__)

_FALLBACK_CHUNK_ROWS = 1024


# torch is imported at run time (import_optional), so its classes are values to the type checker.
_IterableDataset: Any = torch.utils.data.IterableDataset
_TorchDataLoader: Any = torch.utils.data.DataLoader


class _ReaderDataset(_IterableDataset):
    """The dataset torch's DataLoader machinery sees; iteration goes through the loader itself."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __iter__(self) -> Iterator[Any]:
        raise TypeError('iterate the petastorm loader itself, not its .dataset')


class _SizedReaderDataset(_ReaderDataset):
    """The dataset of a reader whose rows per pass are known in advance: its ``len()`` is them.

    Trainers read the batches of an epoch from the dataset's length: Keras (torch backend) counts ``len(loader)``
    batches per epoch only when ``loader.dataset`` has a length, and otherwise keeps one iterator across epochs
    until it runs out, which loses an epoch.
    """

    def __init__(self, reader: Any, source: ColumnSource) -> None:
        super().__init__(reader)
        self._source = source

    def __len__(self) -> int:
        rows = self._source.num_rows_per_pass
        if rows is None:
            raise TypeError('the rows of a pass of this reader are not known in advance')
        return rows


def _check_bool_dtype(loader: str, bool_dtype: Any) -> bool:
    """True when bool columns become ``torch.uint8`` (Petastorm's rule), False for real ``torch.bool`` tensors."""
    if bool_dtype is torch.uint8:
        return True
    if bool_dtype is torch.bool:
        return False
    raise ValueError(f'{loader}: bool_dtype must be torch.uint8 (the default, as Petastorm) or torch.bool, got '
                     f'{bool_dtype!r}')


def _check_capacity(shuffling_queue_capacity: Any) -> int:
    if isinstance(shuffling_queue_capacity, bool) or not isinstance(shuffling_queue_capacity, (int, np.integer)) \
            or shuffling_queue_capacity < 0:
        raise ValueError(f'shuffling_queue_capacity must be an integer >= 0, got {shuffling_queue_capacity!r}')
    return int(shuffling_queue_capacity)


@contextlib.contextmanager
def _stop_reader_on_error(reader: Any) -> Iterator[None]:
    """A loader owns its reader: when the loader cannot be made, stop and join the reader before raising."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            reader.stop()
            reader.join()
        raise


def _with_every_rank(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the reader states of every rank in place of this rank's, in a distributed run.

    Checkpoints are written by rank 0 alone (Lightning, Accelerate), and every rank restores from that one file:
    each finds its own position in the list, and with ``shard_mode='rows'`` another world size splits the rest.
    Only when the reader is sharded over the whole world (one shard per rank); otherwise the state is this rank's.
    """
    dist = torch.distributed
    reader_state = state['reader']
    if not (dist.is_available() and dist.is_initialized()) or not isinstance(reader_state, dict):
        return state
    world = dist.get_world_size()
    if world < 2 or reader_state.get('shard_count') != world:
        return state
    states: list[Any] = [None] * world
    dist.all_gather_object(states, reader_state)
    return {**state, 'reader': sorted(states, key=lambda one: int(one['shard']))}


def _column_chunks(source: ColumnSource, with_row_ids: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """``(columns, rows_are_tuples)`` per batch of the source's next pass (plus ``_ROW_IDS`` if asked)."""
    if source.ngram is not None:
        raise NotImplementedError('petastorm.pytorch loaders do not read NGram windows; iterate the reader itself')
    for batch in source.column_batches():
        columns = dict(batch.columns)
        if with_row_ids:
            row_ids = batch.row_ids
            columns[_ROW_IDS] = row_ids if row_ids is not None else np.full(batch.num_rows, -1, np.int64)
        yield columns, batch.rows_are_tuples


class _LoaderBase(_TorchDataLoader):
    """Iteration rules shared by the loaders that stream from a reader (:class:`petastorm.reading.BatchStream`).

    One pass of the loader is one pass of the reader (its ``num_epochs`` epochs). A new ``iter()`` starts over, as
    torch's ``DataLoader`` does: after a finished pass, a pass left with ``break``, a pass a trainer stopped after
    ``len(loader)`` batches, or an interrupted one, the reader starts its next ``num_epochs`` epochs; with
    ``num_epochs=None`` the endless pass continues where it stopped. After a pass failed, ``iter()`` raises
    ``RuntimeError``. With ``drop_last`` the pass's last batch is left out when it is short.
    """

    # Hugging Face Accelerate's prepare() hands back unchanged a loader carrying this flag (it is how it recognises
    # the loaders it made). Re-making ours as its own loader would lose our sharding and batching; the loader
    # already shards by rank, and with use_stateful_dataloader its save_state/load_state keep our position.
    _is_accelerate_prepared = True

    def __init__(self, reader: Any, batch_size: int, collate_fn: Callable | None = None,
                 pin_memory: bool = False, drop_last: bool = False, bool_dtype: Any = None,
                 torch_arguments: dict[str, Any] | None = None) -> None:
        torch_arguments = dict(torch_arguments or {})
        dataset = torch_arguments.pop('dataset', None)
        if dataset is not None and not (isinstance(dataset, _ReaderDataset) and dataset.reader is reader):
            # A trainer re-creating the loader from its attributes passes this loader's own .dataset back.
            torch_arguments['dataset'] = dataset
        check_torch_arguments(type(self).__name__, torch_arguments)
        self._source = as_column_source(type(self).__name__, reader)
        batch_size = check_positive_int('batch_size', batch_size)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ValueError(f'drop_last must be True or False, got {drop_last!r}')
        self._bool_to_uint8 = _check_bool_dtype(type(self).__name__, torch.uint8 if bool_dtype is None
                                                else bool_dtype)
        sized = self._source.num_rows_per_pass is not None
        super().__init__(_SizedReaderDataset(reader, self._source) if sized else _ReaderDataset(reader),
                         batch_size=batch_size, collate_fn=collate_fn,
                         pin_memory=bool(pin_memory), drop_last=bool(drop_last))
        self.reader = reader
        self.bool_dtype = torch.uint8 if self._bool_to_uint8 else torch.bool
        self._pin = bool(pin_memory) and accelerator_available()
        if pin_memory and not self._pin:
            warn_user('pin_memory=True needs an accelerator, and none is available: batches stay in ordinary '
                          'memory', UserWarning)
        self._core: BatchStream | None = None  # made at first use: subclasses set their options after this

    def _stream(self) -> BatchStream:
        if self._core is None:
            ops, prepare, finish, packed = self._stream_settings()
            self._core = BatchStream(self._source, self.batch_size,
                                     getattr(self, 'shuffling_queue_capacity', 0), ops=ops, prepare=prepare,
                                     finish=finish, packed=packed, drop_last=self.drop_last,
                                     name='Petastorm DataLoader')
        return self._core

    def _stream_settings(self) -> tuple[Any, Callable[[Table], Table], Callable[[Table, bool], Any], bool]:
        """``(ops, prepare, finish, packed)`` of the loader's batches (see :class:`BatchStream`)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return iter(self._stream())

    def _check_resumable(self, method: str) -> None:
        if type(self)._stream_settings is _LoaderBase._stream_settings:  # reads its reader at construction
            raise NotImplementedError(f'{type(self).__name__} has no {method}(): it reads its reader at construction')
        self._stream().check_resumable(method)

    @property
    def use_stateful_dataloader(self) -> bool:
        """True when :meth:`state_dict` works: Accelerate's ``save_state``/``load_state`` then keep the position."""
        if type(self)._stream_settings is _LoaderBase._stream_settings:
            return False
        return self._source.resumable

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: the reader's, with the rows waiting in the loader's buffers counted as not read.

        Save it between batches; :meth:`load_state_dict` on a new loader (over a new reader made with the same
        arguments) then delivers exactly the batches' rows not delivered yet: rows that were in the shuffling
        buffer or waiting for a batch are read again, the rest continues where the reader stopped.

        In a distributed run (``torch.distributed`` initialized, the reader sharded over the world), the state holds
        every rank's position (gathered with ``all_gather_object``), so that any rank, or a run with another world
        size, continues from it: call it on every rank at the same step, as Lightning and Accelerate do when they
        save a checkpoint.
        """
        self._check_resumable('state_dict')
        return _with_every_rank(self._stream().state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration delivers exactly the rows not delivered yet.

        ``state['reader']`` may also be a list: the reader states of every rank of a distributed run (see
        :meth:`petastorm.reader.Reader.load_state_dict`, which allows another world size with
        ``shard_mode='rows'``). A pass being read is abandoned.
        """
        self._check_resumable('load_state_dict')
        self._stream().load_state_dict(state)

    def __len__(self) -> int:
        # The batches of a whole pass, also after load_state_dict: trainers count an epoch's batches from its start.
        batches = self._stream().num_batches()
        if batches is None:
            raise TypeError(f'len() of a {type(self).__name__} needs a reader whose row count is known in advance '
                            f'(num_epochs set; a predicate or filters on stored columns need '
                            f'make_reader(..., count_rows=True)); this one has no len()')
        return batches

    def __repr__(self) -> str:
        parts = [f'batch_size={self.batch_size}',
                 f'shuffling_queue_capacity={getattr(self, "shuffling_queue_capacity", 0)}']
        if self.drop_last:
            parts.append('drop_last=True')
        if not self._bool_to_uint8:
            parts.append('bool_dtype=torch.bool')
        device = getattr(self, 'device', None)
        if device is not None:
            parts.append(f'device={str(device)!r}')
        try:
            parts.append(f'batches_per_pass={len(self)}')
        except TypeError:
            parts.append('batches_per_pass=unknown')
        stream = self._stream()
        parts.append(f'passes_done={stream.passes_done}')
        if stream.in_progress:
            parts.append('pass in progress')
        if stream.error is not None:
            parts.append(f'failed with {type(stream.error).__name__}')
        return f'<{type(self).__name__} {", ".join(parts)}, reader={self.reader!r}>'

    def __enter__(self) -> _LoaderBase:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._source.stop()
        self._source.join()


class DataLoader(_LoaderBase):
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
                 bool_dtype: Any = torch.uint8, **torch_arguments: Any) -> None:
        with _stop_reader_on_error(reader):
            check_callable('DataLoader', 'collate_fn', collate_fn, optional=False)
            super().__init__(reader, batch_size, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                             bool_dtype=bool_dtype, torch_arguments=torch_arguments)
            self._configure(shuffling_queue_capacity, variable_length, padding_value, nulls)

    def _configure(self, shuffling_queue_capacity: int, variable_length: VariableLength, padding_value: Any,
                   nulls: Any) -> None:
        if variable_length not in VARIABLE_LENGTHS:
            raise ValueError(f"variable_length must be one of {', '.join(map(repr, VARIABLE_LENGTHS))}, got "
                             f"{variable_length!r}")
        self.shuffling_queue_capacity = _check_capacity(shuffling_queue_capacity)
        self.variable_length = variable_length
        self.padding_value = padding_value
        self.nulls = nulls
        self._forms = _forms(type(self).__name__, self._source, variable_length, padding_value, nulls, tensors=False,
                             bool_to_uint8=self._bool_to_uint8)
        fields = self._source.schema.fields
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
        columns = {name: values for name, values in columns.items() if name != _ROW_IDS}
        if self.collate_fn is decimal_friendly_collate:
            batch = collate_columns(columns, as_tuple, self.variable_length, self._variable_fields,
                                    self.padding_value, self._forms, self._bool_to_uint8)
        else:
            batch = self.collate_fn(rows_of(columns, as_tuple, self._bool_to_uint8))
        return pin(batch) if self._pin else batch


class BatchedDataLoader(_LoaderBase):
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
        transform_fn: makes a tensor of one column of a row group (a writable numpy array, rows first);
            default: ``torch.from_numpy`` (zero-copy when the reader's array is writable).
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
        **torch_arguments: torch's other ``DataLoader`` arguments, accepted with torch's default values only.
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable | None = None,
                 shuffling_queue_capacity: int = 0, *, device: Any = None, pin_memory: bool = False,
                 variable_length: VariableLength = 'auto', padding_value: Any = 0, nulls: Any = None,
                 drop_last: bool = False, bool_dtype: Any = torch.uint8, **torch_arguments: Any) -> None:
        with _stop_reader_on_error(reader):
            check_callable('BatchedDataLoader', 'transform_fn', transform_fn, optional=True)
            super().__init__(reader, batch_size, pin_memory=pin_memory, drop_last=drop_last, bool_dtype=bool_dtype,
                             torch_arguments=torch_arguments)
            self.transform_fn = transform_fn
            self.shuffling_queue_capacity = _check_capacity(shuffling_queue_capacity)
            self.device = torch.device('cpu') if device is None else torch.device(device)
            _check_tensor_fields(type(self).__name__, self._source)
            self.variable_length = _batched_variable_length(variable_length)
            self.padding_value = padding_value
            self.nulls = nulls
            self._forms = _forms(type(self).__name__, self._source, variable_length, padding_value, nulls,
                                 tensors=True, bool_to_uint8=self._bool_to_uint8)

    def _stream_settings(self) -> tuple[Any, Callable[[Table], Table], Callable[[Table, bool], Any], bool]:
        # Numeric CPU columns are shuffled as packed records: a drawn row is one memory access instead of one per
        # column. With the reader's threads running, that made the main thread's shuffling ~20% cheaper per row
        # on the 5M-row scalar store (capacity 100000) than one array per column.
        return TensorOps(self.device), self._prepare, self._finish, True

    def _prepare(self, columns: Table) -> Table:
        row_ids = columns.pop(_ROW_IDS, None)
        table = _batch_columns(type(self).__name__, columns, self.transform_fn, self.device, self._forms,
                               self._bool_to_uint8)
        if row_ids is not None:
            table[_ROW_IDS] = row_ids
        return table

    def _finish(self, batch: Table, as_tuple: bool) -> Any:
        tensors = finish_batch(batch, self._forms, self.device)
        out: Any = list(tensors.values()) if as_tuple else tensors
        return pin(out) if self._pin else out


def finish_batch(batch: Table, forms: TorchForms, device: Any) -> dict[str, Any]:
    """The tensors of a batched loader's batch: plain columns as they are, nested ones in their forms."""
    tensors: dict[str, Any] = {}
    for name, values in batch.items():
        if name == _ROW_IDS:
            continue
        if is_nested(values):
            forms.finish(name, values, tensors)
            if device.type != 'cpu':
                for key in [name, name + VALID_SUFFIX, name + MASK_SUFFIX]:
                    if key in tensors:
                        tensors[key] = _to_device(tensors[key], device)
        else:
            tensors[name] = batch_tensor(values)
    return tensors


def _to_device(value: Any, device: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value.to(device)


def _batched_variable_length(variable_length: Any) -> VariableLength:
    if variable_length not in ('auto', 'jagged', 'nested', 'pad'):
        raise ValueError(f"variable_length must be 'auto', 'jagged', 'nested' or 'pad' in the batched loaders "
                         f"(per-row lists are petastorm.pytorch.DataLoader's 'list'), got {variable_length!r}")
    return variable_length  # type: ignore[no-any-return]


def _forms(loader: str, source: ColumnSource, variable_length: Any, padding_value: Any, nulls: Any,
           tensors: bool, bool_to_uint8: bool = True) -> TorchForms:
    """The checked forms of a loader's columns (see :mod:`petastorm.pytorch._nested`)."""
    forms = TorchForms(source.schema, variable_length, padding_value, NullOption.of(nulls, source.schema),
                       bool_to_uint8)
    check_forms(loader, forms, tensors)
    return forms


def _check_tensor_fields(loader: str, source: ColumnSource) -> None:
    """Refuse, before reading, fields whose schema type has no tensor (strings, Decimals, objects).

    A transform function may change a field's type without declaring it in ``edit_fields`` (a string field turned
    into an int): such fields are judged by the values it returns, in the first batch, not by the stored type.
    """
    import decimal

    fields = dict(source.schema.fields)
    spec = source.transform_spec
    if spec is not None and spec.func is not None:
        declared = {edit[0] for edit in spec.edit_fields}  # (name, dtype, shape[, nullable]) or a UnischemaField
        fields = {name: field for name, field in fields.items() if name in declared}
    bad = []
    for name, field in fields.items():
        dtype = field.numpy_dtype
        if dtype in (np.str_, np.bytes_, str, bytes, decimal.Decimal, object) or (
                isinstance(dtype, type) and issubclass(dtype, (np.str_, np.bytes_, decimal.Decimal))):
            bad.append(f'{name} ({getattr(dtype, "__name__", dtype)})')
    if bad:
        raise TorchTypeError(f'{loader} makes tensors of every field and does not support string or Decimal fields: '
                             f'{", ".join(bad)}. Leave them out (schema_fields=... or TransformSpec('
                             f'removed_fields=...)) or use petastorm.pytorch.DataLoader, which collates them as '
                             f'lists.')


def _batch_columns(loader: str, columns: dict[str, Any], transform_fn: Callable | None,
                   device: Any, forms: TorchForms, bool_to_uint8: bool = True) -> Table:
    """The columns of a chunk made ready for a batched loader.

    Dtypes are promoted as the original loaders did, nulls, times and lists as ``forms`` say, and ``transform_fn``
    (if any) makes a tensor of each plain column. On the CPU the result keeps numpy arrays (the reader's, or views
    of the tensors ``transform_fn`` made): the buffers work on them and tensors are made per batch. On another
    device every plain column becomes a tensor there; list, struct and masked columns stay numpy until a batch of
    them is finished.
    """
    out: Table = {}
    for name, column in prepare_columns(columns, forms, bool_to_uint8).items():
        if is_nested(column):
            out[name] = column
            continue
        if column.dtype == object:
            check_no_none(name, column)
            stacked = stack_values(list(column))
            if stacked is None:
                kinds = sorted({type(v).__name__ for v in column})
                raise TorchTypeError(f'{loader} cannot make a tensor of field {name!r}: its values are '
                                     f'{", ".join(kinds)} of different shapes or types (strings, Decimals and '
                                     f'variable-shape arrays need petastorm.pytorch.DataLoader)')
            column = as_numpy_view(stacked)
        elif column.dtype.kind in 'USMmV':
            raise TorchTypeError(f'{loader} cannot make a tensor of field {name!r} ({column.dtype}); '
                                 f'use petastorm.pytorch.DataLoader, which collates such fields as lists')
        value: Any = column
        if transform_fn is not None:
            if isinstance(column, np.ndarray) and not column.flags.writeable:
                column = np.array(column)  # so that a zero-copy transform gets memory torch may write
            value = transform_fn(column)
            if not isinstance(value, torch.Tensor):
                raise TorchTypeError(f'transform_fn must return a tensor, got {type(value).__name__} for field '
                                     f'{name!r}')
        if device.type == 'cpu':
            out[name] = as_numpy_view(value.cpu() if isinstance(value, torch.Tensor) else value)
        else:
            out[name] = (to_tensor(value) if isinstance(value, np.ndarray) else value).to(device)
    return out
