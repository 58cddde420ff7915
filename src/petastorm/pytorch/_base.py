"""What every streaming loader shares: :class:`LoaderBase`, the torch ``DataLoader`` over a reader's passes.

A loader owns its reader (stopped and joined when the loader is left or cannot be made), is a
``torch.utils.data.DataLoader`` (trainers check the type; its ``.dataset`` has the rows of a pass as its length
when the reader knows them), and cuts its batches with a :class:`petastorm.reading.BatchStream`: the rules of a new
``iter()``, ``len()`` and the position are the stream's. In a distributed run its state holds every rank's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from petastorm._checks import check_positive_int
from petastorm._warnings import warn_user
from petastorm.plan import every_rank
from petastorm.pytorch._arguments import check_callable, check_torch_arguments
from petastorm.pytorch._tensors import accelerator_available, pin, torch
from petastorm.reading.batch_stream import BatchStream
from petastorm.reading.source import ColumnSource, as_column_source, check_no_ngram, positions_of
from petastorm.shuffle import Table

logger = logging.getLogger(__name__)


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


@contextlib.contextmanager
def stop_reader_on_error(reader: Any) -> Iterator[None]:
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
    if not (dist.is_available() and dist.is_initialized()):
        return state
    world = dist.get_world_size()

    def gather(one: Any) -> list[Any]:
        states: list[Any] = [None] * world
        dist.all_gather_object(states, one)
        return states

    reader_state = every_rank(state['reader'], world, gather)
    return state if reader_state is state['reader'] else {**state, 'reader': reader_state}


class LoaderBase(_TorchDataLoader):
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
                 torch_arguments: dict[str, Any] | None = None, batch_transform_fn: Callable | None = None) -> None:
        check_callable(type(self).__name__, 'batch_transform_fn', batch_transform_fn, optional=True)
        torch_arguments = dict(torch_arguments or {})
        dataset = torch_arguments.pop('dataset', None)
        if dataset is not None and not (isinstance(dataset, _ReaderDataset) and dataset.reader is reader):
            # A trainer re-creating the loader from its attributes passes this loader's own .dataset back.
            torch_arguments['dataset'] = dataset
        check_torch_arguments(type(self).__name__, torch_arguments)
        self._source = as_column_source(type(self).__name__, reader)
        check_no_ngram(type(self).__name__, self._source)
        batch_size = check_positive_int('batch_size', batch_size)
        if not isinstance(drop_last, (bool, np.bool_)):
            raise ValueError(f'drop_last must be True or False, got {drop_last!r}')
        self._bool_to_uint8 = _check_bool_dtype(type(self).__name__, torch.uint8 if bool_dtype is None
                                                else bool_dtype)
        # Told by the source where it can: a reader planning as its footers arrive knows its count only then, and
        # making the loader must not wait for that (its first batch does not).
        sized = self._source.info.sized
        if sized is None:
            sized = self._source.num_rows_per_pass is not None
        super().__init__(_SizedReaderDataset(reader, self._source) if sized else _ReaderDataset(reader),
                         batch_size=batch_size, collate_fn=collate_fn,
                         pin_memory=bool(pin_memory), drop_last=bool(drop_last))
        self.reader = reader
        self.batch_transform_fn = batch_transform_fn
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
                                     name=type(self).__name__)
        return self._core

    def _stream_settings(self) -> tuple[Any, Callable[[Table], Table], Callable[[Table, bool], Any], bool]:
        """``(ops, prepare, finish, packed)`` of the loader's batches (see :class:`BatchStream`)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return iter(self._stream())

    def _hand_over(self, batch: Any) -> Any:
        """A collated batch as the user receives it: through ``batch_transform_fn``, then pinned if asked."""
        if self.batch_transform_fn is not None:
            batch = self.batch_transform_fn(batch)
        return pin(batch) if self._pin else batch

    def _check_resumable(self, method: str) -> None:
        if type(self)._stream_settings is LoaderBase._stream_settings:  # reads its reader at construction
            raise NotImplementedError(f'{type(self).__name__} has no {method}(): it reads its reader at construction')
        self._stream().check_resumable(method)

    @property
    def use_stateful_dataloader(self) -> bool:
        """True when :meth:`state_dict` works: Accelerate's ``save_state``/``load_state`` then keep the position."""
        if type(self)._stream_settings is LoaderBase._stream_settings:
            return False
        return positions_of(self._source) is not None

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
        if batches is None and self._source.info.endless:
            raise TypeError(f'len() of a {type(self).__name__} needs a reader with an end: this one repeats forever '
                            f'(num_epochs=None, also the default of a Spark converter\'s make_torch_dataloader). '
                            f'Pass num_epochs=1 (make_torch_dataloader(num_epochs=1), make_reader(..., num_epochs=1)) '
                            f'for len() to count the batches of one epoch')
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

    def __enter__(self) -> LoaderBase:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._source.stop()
        self._source.join()
