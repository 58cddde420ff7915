"""What the loaders read: a :class:`ColumnSource`, its positions (:class:`PositionSource`), and what makes one.

The seam between a reader and the loaders is two small contracts, as torchdata's ``BaseNode`` beside ``Stateful``
and grain's ``DatasetIterator`` are:

* :class:`ColumnSource`, the iteration: what the source delivers (one frozen :class:`SourceInfo`), the rows of a
  pass when known in advance, decoded column batches of one pass at a time, starting another pass, stopping.
* :class:`PositionSource`, the positions: the state of what was delivered (also while a consumer holds rows it
  took), and continuing from one. :func:`positions_of` is how a loader asks for them; a source that has none
  is read all the same, and a loader refuses only what needs a position.

The torch, TensorFlow, JAX and Spark adapters take "a reader": one made by ``make_reader``/``make_batch_reader``
(a :class:`~petastorm.reader.Reader`, which is both), or an object that behaves like one (is iterated and has
``stop()`` and ``join()``: a :class:`~petastorm.weighted_sampling_reader.WeightedSamplingReader`, a test mock, a
user's own). :func:`as_column_source` checks what was given once and returns a column source, wrapping a
reader-like object that is not one (:class:`ItemSource`, which has no positions), so that the adapters never
probe readers for what they can do.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from petastorm.columns import from_batch_column, num_rows
from petastorm.ngram import NGram
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.column_transform import column_from_values
from petastorm.transform import TransformSpec
from petastorm.unischema import Unischema

__all__ = ['ColumnSource', 'ItemSource', 'PositionSource', 'SourceInfo', 'as_column_source', 'check_no_ngram',
           'check_reader', 'is_column_source', 'positions_of']

# Rows of a row-yielding reader-like object gathered into one batch of columns.
_ROWS_PER_BATCH = 1024


@dataclass(frozen=True)
class SourceInfo:
    """What a column source delivers, fixed when it is made.

    Attributes:
        schema: the schema of what is delivered (after field selection and the transform).
        ngram: the NGram read, or None.
        batched_output: True for ``make_batch_reader`` semantics (a batch per work item).
        seed: the seed the order was made with (None: unseeded); loaders seed their own shuffles from it.
        transform_spec: the transform applied in the workers, or None.
        endless: one pass that never ends (``num_epochs=None``): a new iteration continues it instead of
            starting over.
        sized: whether :attr:`ColumnSource.num_rows_per_pass` is known (not None), told without computing it: a
            reader whose plan is made as its footers arrive knows the count only then. None: ask it.
    """

    schema: Unischema
    ngram: NGram | None = None
    batched_output: bool = False
    seed: int | None = None
    transform_spec: TransformSpec | None = None
    endless: bool = False
    sized: bool | None = None


@runtime_checkable
class ColumnSource(Protocol):
    """A reader as the loaders iterate it: decoded column batches of one pass at a time."""

    @property
    def info(self) -> SourceInfo:
        """What the source delivers."""
        ...

    @property
    def num_rows_per_pass(self) -> int | None:
        """Rows of a whole pass, when known in advance (else None)."""
        ...

    @property
    def num_rows_this_pass(self) -> int | None:
        """Rows the current pass delivers from its start (after a restore: what is left), or None."""
        ...

    @property
    def last_row_consumed(self) -> bool:
        """True once a pass was read to its end (:meth:`restart` then starts the next one)."""
        ...

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        ...

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """The next pass, one batch of decoded columns per work item (at least one row each).

        ``first_rows``: the rows the consumer needs first (a loader's batch); a source may deliver them sooner
        than a whole work item, in a batch of their own, without changing the rows or their order.
        """
        ...

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """Abandon the pass being read, if any, and start another now: the next one, or from ``state``.

        ``state`` (a :class:`PositionSource`'s only; others refuse one): continue from it. ``new_pass``: the
        state was saved between passes, start the pass after it.
        """
        ...

    def stop(self) -> None:
        """Stop reading (non-blocking)."""
        ...

    def join(self) -> None:
        """Wait until every worker is gone."""
        ...


@runtime_checkable
class PositionSource(Protocol):
    """A source that saves what it delivered and continues from it (a reader, a mix of readers)."""

    @property
    def resumable(self) -> bool:
        """:meth:`state_dict` can name every delivered row (column batches carry ``row_ids``)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The delivered position (see :meth:`petastorm.reader.Reader.state_dict`)."""
        ...

    def state_holding(self, held_rows: np.ndarray, held_in_order: bool = False) -> dict[str, Any]:
        """The position when the consumer still holds these rows (by ``row_ids``) undelivered.

        ``held_in_order``: they are the last rows taken, in the order taken (no shuffling buffer).
        """
        ...

    def load_state_dict(self, state: Any) -> None:
        """Continue from a saved position, before reading."""
        ...


def positions_of(source: Any) -> PositionSource | None:
    """``source`` as a :class:`PositionSource` when it can name every row it delivers, else None."""
    if _has_members(source, PositionSource) and source.resumable:
        return source
    return None


def is_column_source(obj: Any) -> bool:
    """``isinstance(obj, ColumnSource)``, without reading its properties.

    Python before 3.12 reads every member of a protocol to check an instance against it: a reader's
    ``num_rows_this_pass`` would wait for the whole plan of a store planned as its footers arrive.
    """
    return _has_members(obj, ColumnSource)


def _has_members(obj: Any, protocol: type) -> bool:
    """Whether ``obj`` has every member of ``protocol``, looked up as Python 3.12 does (no property is run)."""
    missing = object()
    return all(inspect.getattr_static(obj, name, missing) is not missing for name in _members(protocol))


def _members(protocol: type) -> frozenset[str]:
    return frozenset(name for name in vars(protocol) if not name.startswith('_')) | \
        frozenset(getattr(protocol, '__annotations__', {}))


def check_reader(consumer: str, reader: Any) -> None:
    """Refuse, before anything is read, what is not a reader: a URL, a path, a list, a torch dataset...

    A reader is what ``make_reader``/``make_batch_reader`` return, or an object that behaves like one (it is
    iterated and has ``stop()`` and ``join()``, as :class:`~petastorm.weighted_sampling_reader.WeightedSamplingReader`).

    Raises:
        TypeError: naming what was passed and how to make a reader of it.
    """
    if isinstance(reader, (str, bytes, os.PathLike)):
        raise TypeError(f'{consumer} takes a reader, not a dataset URL or path: got {reader!r}. Open the dataset '
                        f'first, for example {consumer}(make_reader({os.fsdecode(reader)!r})) (make_batch_reader '
                        f'for a Parquet store without Petastorm metadata)')
    missing = [name for name in ('__iter__', 'stop', 'join') if not callable(getattr(reader, name, None))]
    if missing:
        raise TypeError(f'{consumer} takes a reader made by make_reader or make_batch_reader (an object that is '
                        f'iterated and has stop() and join()), got {type(reader).__name__} (it has no '
                        f'{", ".join(missing)})')


def check_no_ngram(consumer: str, source: ColumnSource) -> None:
    """Refuse, when ``consumer`` is made, a source of NGram windows: batches of rows cannot hold them.

    Raises:
        NotImplementedError: the reader was made with ``schema_fields=NGram(...)`` (Petastorm's type).
    """
    if source.info.ngram is not None:
        raise NotImplementedError(f'{consumer} does not read NGram windows (the reader was made with '
                                  f'schema_fields=NGram(...)); iterate the reader itself, which yields one dict of '
                                  f'rows per timestep, or use petastorm.tf_utils.make_petastorm_dataset')


def as_column_source(consumer: str, reader: Any) -> ColumnSource:
    """``reader`` itself when it is a column source, else a column source over the items it yields.

    Raises:
        TypeError: ``reader`` is not a reader (see :func:`check_reader`).
    """
    check_reader(consumer, reader)
    if is_column_source(reader):
        return reader
    return ItemSource(reader)


class ItemSource:
    """A column source over a reader-like object that only yields items: rows, or namedtuples of columns.

    Rows are gathered into batches of columns as they come; nothing is known in advance (no row count) and it has
    no positions (it is not a :class:`PositionSource`). What the object does not have takes the value a plain
    reader would give: no NGram, no seed, no transform, not batched; a new iteration continues what it yields.
    """

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    @property
    def wrapped(self) -> Any:
        """The reader-like object."""
        return self._reader

    @property
    def info(self) -> SourceInfo:
        """What the object says of itself; what it does not say takes a plain reader's value.

        Its ``schema`` (one without fields when it has none), ``ngram``, ``batched_output`` (or
        ``is_batched_reader``), ``seed`` and ``transform_spec``. Endless: such an object cannot be restarted in
        the middle, so a new iteration continues what it yields.
        """
        reader = self._reader
        schema = getattr(reader, 'schema', None)
        return SourceInfo(schema=schema if isinstance(schema, Unischema) else Unischema('items', []),
                          ngram=getattr(reader, 'ngram', None),
                          batched_output=bool(getattr(reader, 'batched_output',
                                                      getattr(reader, 'is_batched_reader', False))),
                          seed=getattr(reader, 'seed', None), transform_spec=getattr(reader, 'transform_spec', None),
                          endless=True)

    @property
    def num_rows_per_pass(self) -> int | None:
        """Unknown (None)."""
        return None

    @property
    def num_rows_this_pass(self) -> int | None:
        """Unknown (None)."""
        return None

    @property
    def last_row_consumed(self) -> bool:
        """The object's ``last_row_consumed`` (False when it does not say)."""
        return bool(getattr(self._reader, 'last_row_consumed', False))

    @property
    def stopped(self) -> bool:
        """The object's ``stopped`` (False when it does not say)."""
        return bool(getattr(self._reader, 'stopped', False))

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """The items of the object's next pass as batches of columns (``first_rows`` changes nothing here)."""
        if self.info.batched_output:
            for item in self._reader:
                # A batch reader's masked arrays, list and struct columns are the reader's columns again.
                columns = {name: from_batch_column(values) for name, values in item._asdict().items()}
                yield ColumnBatch(columns, num_rows(next(iter(columns.values()))) if columns else 0)
            return
        rows: list[Any] = []
        for row in self._reader:
            rows.append(row)
            if len(rows) == _ROWS_PER_BATCH:
                yield _rows_to_batch(rows)
                rows = []
        if rows:
            yield _rows_to_batch(rows)

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """The object's ``reset()``.

        Raises:
            NotImplementedError: with a state: rows of items carry no numbers.
        """
        if state is not None:
            raise NotImplementedError(f'positions need a reader from make_reader/make_batch_reader, got '
                                      f'{type(self._reader).__name__}')
        self._reader.reset()

    def stop(self) -> None:
        """The object's ``stop()``."""
        self._reader.stop()

    def join(self) -> None:
        """The object's ``join()``."""
        self._reader.join()


def _rows_to_batch(rows: list[Any]) -> ColumnBatch:
    first = rows[0]
    if isinstance(first, dict) or hasattr(first, '_asdict'):
        dicts = [r if isinstance(r, dict) else r._asdict() for r in rows]
        return ColumnBatch({name: column_from_values([d[name] for d in dicts]) for name in dicts[0]}, len(rows))
    return ColumnBatch({str(i): column_from_values([r[i] for r in rows]) for i in range(len(first))}, len(rows),
                       rows_are_tuples=True)
