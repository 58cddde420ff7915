"""What the loaders read: a :class:`ColumnSource`, and :func:`as_column_source` for anything given as a reader.

The torch, TensorFlow and Spark adapters take "a reader": one made by ``make_reader``/``make_batch_reader`` (a
:class:`~petastorm.reader.Reader`, which is a column source), or an object that behaves like one (is iterated and
has ``stop()`` and ``join()``: a :class:`~petastorm.weighted_sampling_reader.WeightedSamplingReader`, a test
mock, a user's own). :func:`as_column_source` checks what was given once and returns a column source, wrapping a
reader-like object so that the adapters never probe readers for what they can do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from petastorm.columns import from_batch_column, num_rows
from petastorm.ngram import NGram
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.column_transform import column_from_values
from petastorm.transform import TransformSpec
from petastorm.unischema import Unischema

__all__ = ['ColumnSource', 'as_column_source', 'check_reader']

# Rows of a row-yielding reader-like object gathered into one batch of columns.
_ROWS_PER_BATCH = 1024


@runtime_checkable
class ColumnSource(Protocol):
    """A reader as the loaders see it: decoded column batches of one pass at a time, and its position."""

    @property
    def schema(self) -> Unischema:
        """The schema of what is delivered (after field selection and the transform)."""
        ...

    @property
    def ngram(self) -> NGram | None:
        """The NGram read, or None."""
        ...

    @property
    def batched_output(self) -> bool:
        """True for ``make_batch_reader`` semantics (a batch per work item)."""
        ...

    @property
    def seed(self) -> int | None:
        """The seed the order was made with (None: unseeded); loaders seed their own shuffles from it."""
        ...

    @property
    def transform_spec(self) -> TransformSpec | None:
        """The transform applied in the workers, or None."""
        ...

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        ...

    @property
    def last_row_consumed(self) -> bool:
        """True once a pass was read to its end."""
        ...

    @property
    def resumable(self) -> bool:
        """:meth:`state_dict` can name every delivered row (column batches carry ``row_ids``)."""
        ...

    @property
    def endless(self) -> bool:
        """One pass that never ends (``num_epochs=None``): a new iteration continues it instead of starting over."""
        ...

    @property
    def num_rows_per_pass(self) -> int | None:
        """Rows of a whole pass, when known in advance (else None)."""
        ...

    @property
    def num_rows_this_pass(self) -> int | None:
        """Rows the current pass delivers from its start (after a restore: what is left), or None."""
        ...

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """The next pass, one batch of decoded columns per work item (at least one row each).

        ``first_rows``: the rows the consumer needs first (a loader's batch); a source may deliver them sooner
        than a whole work item, in a batch of their own, without changing the rows or their order.
        """
        ...

    def reset(self) -> None:
        """Start another pass after the last one ran out."""
        ...

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """Abandon the pass being read and start another now: the next one, or from ``state``.

        ``new_pass``: the state was saved between passes, start the pass after it.
        """
        ...

    def stop(self) -> None:
        """Stop reading (non-blocking)."""
        ...

    def join(self) -> None:
        """Wait until every worker is gone."""
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


def as_column_source(consumer: str, reader: Any) -> ColumnSource:
    """``reader`` itself when it is a column source, else a column source over the items it yields.

    Raises:
        TypeError: ``reader`` is not a reader (see :func:`check_reader`).
    """
    check_reader(consumer, reader)
    if isinstance(reader, ColumnSource):
        return reader
    return ItemSource(reader)


class ItemSource:
    """A column source over a reader-like object that only yields items: rows, or namedtuples of columns.

    Rows are gathered into batches of columns as they come; nothing is known in advance (no row count) and no
    position can be saved. What the object does not have takes the value a plain reader would give: no NGram, no
    seed, no transform, not batched.
    """

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    @property
    def wrapped(self) -> Any:
        """The reader-like object."""
        return self._reader

    @property
    def schema(self) -> Unischema:
        """The object's ``schema`` (one without fields when it has none: nothing is known of its fields)."""
        schema = getattr(self._reader, 'schema', None)
        return schema if isinstance(schema, Unischema) else Unischema('items', [])

    @property
    def ngram(self) -> NGram | None:
        """The object's ``ngram`` (None when it has none)."""
        return getattr(self._reader, 'ngram', None)

    @property
    def batched_output(self) -> bool:
        """Whether the object yields batches (its ``batched_output`` or ``is_batched_reader``)."""
        return bool(getattr(self._reader, 'batched_output', getattr(self._reader, 'is_batched_reader', False)))

    @property
    def seed(self) -> int | None:
        """The object's ``seed`` (None when it has none)."""
        return getattr(self._reader, 'seed', None)

    @property
    def transform_spec(self) -> TransformSpec | None:
        """The object's ``transform_spec`` (None when it has none)."""
        return getattr(self._reader, 'transform_spec', None)

    @property
    def stopped(self) -> bool:
        """The object's ``stopped`` (False when it does not say)."""
        return bool(getattr(self._reader, 'stopped', False))

    @property
    def last_row_consumed(self) -> bool:
        """The object's ``last_row_consumed`` (False when it does not say)."""
        return bool(getattr(self._reader, 'last_row_consumed', False))

    @property
    def resumable(self) -> bool:
        """Always False: rows of items carry no numbers."""
        return False

    @property
    def endless(self) -> bool:
        """True: such an object cannot be restarted in the middle, so a new iteration continues what it yields."""
        return True

    @property
    def num_rows_per_pass(self) -> int | None:
        """Unknown (None)."""
        return None

    @property
    def num_rows_this_pass(self) -> int | None:
        """Unknown (None)."""
        return None

    def column_batches(self, first_rows: int | None = None) -> Iterator[ColumnBatch]:
        """The items of the object's next pass as batches of columns (``first_rows`` changes nothing here)."""
        if self.batched_output:
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

    def reset(self) -> None:
        """The object's ``reset()``."""
        self._reader.reset()

    def restart(self, state: Any = None, *, new_pass: bool = False) -> None:
        """The object's ``reset()`` (refused with a state: rows of items carry no numbers)."""
        if state is not None:
            self.state_dict()
        self._reader.reset()

    def stop(self) -> None:
        """The object's ``stop()``."""
        self._reader.stop()

    def join(self) -> None:
        """The object's ``join()``."""
        self._reader.join()

    def state_dict(self) -> dict[str, Any]:
        """Refused: the rows of items carry no numbers.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(f'positions need a reader from make_reader/make_batch_reader, got '
                                  f'{type(self._reader).__name__}')

    def state_holding(self, held_rows: np.ndarray, held_in_order: bool = False) -> dict[str, Any]:
        """Refused, as :meth:`state_dict`.

        Raises:
            NotImplementedError: always.
        """
        return self.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Refused, as :meth:`state_dict`.

        Raises:
            NotImplementedError: always.
        """
        self.state_dict()


def _rows_to_batch(rows: list[Any]) -> ColumnBatch:
    first = rows[0]
    if isinstance(first, dict) or hasattr(first, '_asdict'):
        dicts = [r if isinstance(r, dict) else r._asdict() for r in rows]
        return ColumnBatch({name: column_from_values([d[name] for d in dicts]) for name in dicts[0]}, len(rows))
    return ColumnBatch({str(i): column_from_values([r[i] for r in rows]) for i in range(len(first))}, len(rows),
                       rows_are_tuples=True)
