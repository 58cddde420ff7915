"""``make_petastorm_dataset``: a reader as a ``tf.data.Dataset``, fed with whole decoded columns.

The Python generator behind the dataset hands TensorFlow one batch of columns per work item (a row group or
part of one), never one Python object per row: a batch reader's batches go through as they are, and a row
reader's column batches are cut into rows by ``Dataset.unbatch()`` inside TensorFlow. Only a batch whose rows
have different shapes (a variable-shape field of a row reader) is handed over as one-row batches, and only a
row source without column batches (a :class:`~petastorm.weighted_sampling_reader.WeightedSamplingReader` of row
readers, which picks a reader per row) is read row by row.

The dataset is built with ``tf.compat.v1.data``: it is a ``tf.data.Dataset`` like any other for TF2 code
(iteration, ``map``/``batch``/``prefetch``, Keras) and also keeps the TF1 methods (``make_one_shot_iterator()``,
``output_shapes``) that graph-mode code written for the original Petastorm calls. Every transformation of such a
dataset returns one of the same kind, so the converter's batched pipeline keeps them too. Built in graph mode, the
dataset also leaves out the prefetch TF2 would add at its end, so that a session reads nothing it did not ask for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from petastorm._optional import import_optional
from petastorm._warnings import warn_user
from petastorm.columns import ListColumn, MaskedColumn, densified, num_rows
from petastorm.reading.source import ColumnSource, as_column_source, is_column_source
from petastorm.tf_utils._convert import (
    RaggedColumnError,
    column_for_tf,
    none_error,
    ragged_list_error,
    value_for_tf,
    values_for_tf,
)
from petastorm.tf_utils._layout import ElementLayout
from petastorm.tf_utils._nested import value_of

# The first sentence is the original's, which users filter on.
_RESET_WARNING = ('Running multiple iterations over make_petastorm_dataset is not recommend for performance issue. '
                  'Each new iteration restarts the reader (reader.reset()); ask for several passes with the '
                  "reader's num_epochs, or call .cache() on the dataset before .repeat().")


def make_petastorm_dataset(reader: Any, *, ragged: bool = False) -> Any:
    """A ``tf.data.Dataset`` of what ``reader`` yields.

    Elements are the reader's namedtuples (``'<schema>_view'``) of tensors: one row each for :func:`make_reader`,
    one batch each for :func:`make_batch_reader` (every tensor then has a leading batch dimension of unknown
    size). With an NGram, an element is a dict ``{offset: namedtuple}``. Tensors have the schema's TensorFlow
    dtypes (:meth:`petastorm.unischema.Unischema.as_tf_dtypes`) and the schema's shapes as static shapes
    (``None`` where a dimension varies). Strings and ``Decimal`` values arrive as ``tf.string`` (a Decimal as
    its normalized text), times as int64 nanoseconds since the epoch (durations and times of day as int64
    counts of their unit), uint16/uint32 widened to int32/int64. List fields with a varying dimension below
    another (lists of lists) and lists of structs arrive as ``tf.RaggedTensor`` s, struct fields as dicts of
    their fields, maps as ``{'key': ragged, 'value': ragged}`` (``docs/types.md``). A ``None`` value stops
    iteration with an error naming the field.

    The reader stays owned by the caller: stop and join it (use it as a context manager) when done. Iterating
    the dataset again after the reader ran out restarts the reader with a warning; prefer the reader's
    ``num_epochs``. Prefer the reader's ``predicate``, ``cur_shard``/``shard_count`` and ``shuffle_*`` arguments
    over ``Dataset.filter``/``shard``/``shuffle``: they skip unneeded data before it is read.

    Args:
        reader: a :class:`petastorm.reader.Reader`.
        ragged: one-level list fields of numbers (shape ``(None,)``) arrive as ``tf.RaggedTensor`` s too; by
            default they are dense tensors, as in Petastorm, and a batch whose lists differ in length raises
            an error naming the field.

    Returns:
        A ``tf.data.Dataset`` made through ``tf.compat.v1.data``, so that it also has the TF1 API: in graph mode
        ``dataset.make_one_shot_iterator().get_next()`` run in a ``tf.compat.v1.Session`` works as with the
        original Petastorm (and so does ``tf.compat.v1.data.make_one_shot_iterator(dataset)``).

    Example:
        >>> with make_reader('file:///tmp/mnist', num_epochs=1) as reader:
        ...     dataset = make_petastorm_dataset(reader).map(lambda row: (row.image, row.digit)).batch(64)
        ...     model.fit(dataset)
    """
    # Refuse a URL or a list before anything starts.
    source = as_column_source('make_petastorm_dataset', reader)
    tf = import_optional('tensorflow', 'petastorm.tf_utils.make_petastorm_dataset')
    layout = ElementLayout(source.info.schema, source.info.ngram, ragged=ragged)
    layout.warn_about_unicode()

    # A reader-like object without column batches of its own (a WeightedSamplingReader, which picks a reader per
    # element) is read element by element, so that TensorFlow never makes it read ahead.
    own_columns = is_column_source(reader)

    def generate() -> Iterator[Any]:
        if source.last_row_consumed:
            warn_user(_RESET_WARNING, UserWarning)
            source.restart()  # the last pass ran out: the next one
        try:
            flats = column_batches(source, layout) if own_columns else element_values(reader, layout,
                                                                                       source.info.batched_output)
            for flat in flats:
                yield layout.pack(flat)
        except RuntimeError:
            # TF's prefetch thread may still pull after the caller stopped the reader (e.g. leaving a
            # ``with`` block over an endless dataset): end quietly then; any other failure propagates.
            if not source.stopped:
                raise

    batched = own_columns or source.info.batched_output
    # tf.compat.v1.data.Dataset is the tf.data.Dataset class plus the TF1 methods; its transformations keep them.
    dataset = tf.compat.v1.data.Dataset.from_generator(generate, output_signature=layout.signature(batched=batched))
    if batched and not source.info.batched_output:
        dataset = dataset.unbatch()
    if not tf.executing_eagerly():
        dataset = dataset.with_options(_graph_mode_options(tf))
    return dataset


def _graph_mode_options(tf: Any) -> Any:
    """``tf.data`` options for a dataset built in graph mode: TF1's pipeline, without an injected prefetch.

    TF2 adds a prefetch after a pipeline's last step, which reads one element ahead of the session. Across the end
    of the reader's data that restarts the reader (and warns) before the session asked for another pass; graph
    code written for TF1, where nothing was read ahead unasked, sees the restart when it asks for it. Eager code
    keeps TF2's defaults.
    """
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return options


def element_values(reader: Any, layout: ElementLayout, batched: bool) -> Iterator[list[Any]]:
    """The elements of a reader-like object, each as TensorFlow-ready values in ``layout``'s flat order."""
    for element in reader:
        values = layout.flatten(element)
        if not batched:
            yield values_for_tf(layout.names, values)
            continue
        yield [value_of(name, _internal(value)) if name in layout.nested else column_for_tf(name, value)
               for name, value in zip(layout.names, values, strict=True)]


def _internal(column: Any) -> Any:
    """A masked array as a batch reader hands it out, as the reader's masked column (nested fields' leaves)."""
    if isinstance(column, np.ma.MaskedArray) and column.ndim == 1:
        return MaskedColumn(column.data, ~np.ma.getmaskarray(column))
    return column


def column_batches(source: ColumnSource, layout: ElementLayout) -> Iterator[list[np.ndarray]]:
    """The source's data as batches of TensorFlow-ready columns, in ``layout``'s flat order.

    Raises:
        RaggedColumnError: a batch reader's column holds rows of different shapes.
    """
    for batch in source.column_batches():
        flat = layout.batch_columns(batch)
        if source.info.batched_output:
            yield [value_of(name, column) if name in layout.nested else _plain_column(name, column)
                   for name, column in zip(layout.names, flat, strict=True)]
            continue
        converted: list[Any] = []
        for name, column in zip(layout.names, flat, strict=True):
            try:
                converted.append(value_of(name, column) if name in layout.nested else _plain_column(name, column))
            except RaggedColumnError:
                converted.append(None)  # converted row by row below
        if all(column is not None for column in converted):
            yield [column for column in converted if column is not None]
        else:
            yield from _one_row_batches(layout.names, flat, converted)


def _plain_column(name: str, column: Any) -> np.ndarray:
    """A decoded column of a field TensorFlow gets as one dense tensor.

    Raises:
        RuntimeError: the column holds a null.
        RaggedColumnError: a list column whose rows differ in length.
    """
    if isinstance(column, MaskedColumn):
        raise none_error(name)
    if isinstance(column, ListColumn):
        dense = densified(column)
        if not isinstance(dense, np.ndarray):
            if column.valid is not None and not column.valid.all():
                raise none_error(name)
            raise ragged_list_error(name, column)
        column = dense
    return column_for_tf(name, column)


def _row_of(value: Any, i: int) -> Any:
    if isinstance(value, dict):
        return {key: _row_of(child, i) for key, child in value.items()}
    return value[i:i + 1]


def _one_row_batches(names: Sequence[str], flat: Sequence[Any],
                     converted: Sequence[Any]) -> Iterator[list[Any]]:
    """A batch with a variable-shape field, as batches of one row: its rows cannot be stacked into one tensor.

    ``converted`` holds each column already made ready for TensorFlow, or None for a ragged one, whose values
    are converted here one at a time. A row of a converted column goes through ``expand_dims`` of its element
    (not a slice) so that it has the dtype the value would have on its own (a ``str`` becomes a unicode array).
    """
    for i in range(num_rows(flat[0])):
        yield [np.expand_dims(value_for_tf(name, column[i]), 0) if ready is None else
               _row_of(ready, i) if isinstance(ready, dict) or not isinstance(ready, np.ndarray) else
               np.expand_dims(ready[i], 0)
               for name, column, ready in zip(names, flat, converted, strict=True)]
