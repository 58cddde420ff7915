"""``make_petastorm_dataset``: a reader as a ``tf.data.Dataset``, fed with whole decoded columns.

The Python generator behind the dataset hands TensorFlow one batch of columns per work item (a row group or
part of one), never one Python object per row: a batch reader's batches go through as they are, and a row
reader's column batches are cut into rows by ``Dataset.unbatch()`` inside TensorFlow. Only a batch whose rows
have different shapes (a variable-shape field of a row reader) is handed over as one-row batches.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from petastorm._optional import import_optional
from petastorm.tf_utils._convert import RaggedColumnError, column_for_tf, columns_for_tf, value_for_tf
from petastorm.tf_utils._layout import ElementLayout

# The first sentence is the original's, which users filter on.
_RESET_WARNING = ('Running multiple iterations over make_petastorm_dataset is not recommend for performance issue. '
                  'Each new iteration restarts the reader (reader.reset()); ask for several passes with the '
                  "reader's num_epochs, or call .cache() on the dataset before .repeat().")


def make_petastorm_dataset(reader: Any) -> Any:
    """A ``tf.data.Dataset`` of what ``reader`` yields.

    Elements are the reader's namedtuples (``'<schema>_view'``) of tensors: one row each for :func:`make_reader`,
    one batch each for :func:`make_batch_reader` (every tensor then has a leading batch dimension of unknown
    size). With an NGram, an element is a dict ``{offset: namedtuple}``. Tensors have the schema's TensorFlow
    dtypes (:meth:`petastorm.unischema.Unischema.as_tf_dtypes`) and the schema's shapes as static shapes
    (``None`` where a dimension varies). Strings and ``Decimal`` values arrive as ``tf.string`` (a Decimal as
    its normalized text), times as int64 nanoseconds since the epoch, uint16/uint32 widened to int32/int64.
    A ``None`` value stops iteration with an error naming the field.

    The reader stays owned by the caller: stop and join it (use it as a context manager) when done. Iterating
    the dataset again after the reader ran out restarts the reader with a warning; prefer the reader's
    ``num_epochs``. Prefer the reader's ``predicate``, ``cur_shard``/``shard_count`` and ``shuffle_*`` arguments
    over ``Dataset.filter``/``shard``/``shuffle``: they skip unneeded data before it is read.

    Args:
        reader: a :class:`petastorm.reader.Reader`.

    Returns:
        A ``tf.data.Dataset``.

    Example:
        >>> with make_reader('file:///tmp/mnist', num_epochs=1) as reader:
        ...     dataset = make_petastorm_dataset(reader).map(lambda row: (row.image, row.digit)).batch(64)
        ...     model.fit(dataset)
    """
    from petastorm.reader_inputs import check_reader  # refuse a URL or a list before anything starts
    check_reader('make_petastorm_dataset', reader)
    tf = import_optional('tensorflow', 'petastorm.tf_utils.make_petastorm_dataset')
    layout = ElementLayout.of(reader)
    layout.warn_about_unicode()

    def generate() -> Iterator[Any]:
        if reader.last_row_consumed:
            warnings.warn(_RESET_WARNING, UserWarning, stacklevel=2)
            reader.reset()
        try:
            for flat in column_batches(reader, layout):
                yield layout.pack(flat)
        except RuntimeError:
            # TF's prefetch thread may still pull after the caller stopped the reader (e.g. leaving a
            # ``with`` block over an endless dataset): end quietly then; any other failure propagates.
            if not reader.stopped:
                raise

    dataset = tf.data.Dataset.from_generator(generate, output_signature=layout.signature(batched=True))
    return dataset if reader.batched_output else dataset.unbatch()


def column_batches(reader: Any, layout: ElementLayout) -> Iterator[list[np.ndarray]]:
    """The reader's data as batches of TensorFlow-ready columns, in ``layout``'s flat order.

    Raises:
        RaggedColumnError: a batch reader's column holds rows of different shapes.
    """
    if reader.batched_output:
        for element in reader:
            yield columns_for_tf(layout.names, layout.flatten(element))
        return
    for columns in reader.iter_column_batches():
        flat = layout.row_columns(columns)
        converted: list[np.ndarray | None] = []
        for name, column in zip(layout.names, flat, strict=True):
            try:
                converted.append(column_for_tf(name, column))
            except RaggedColumnError:
                converted.append(None)  # converted row by row below
        if all(column is not None for column in converted):
            yield converted
        else:
            yield from _one_row_batches(layout.names, flat, converted)


def _one_row_batches(names: Sequence[str], flat: Sequence[np.ndarray],
                     converted: Sequence[np.ndarray | None]) -> Iterator[list[np.ndarray]]:
    """A batch with a variable-shape field, as batches of one row: its rows cannot be stacked into one tensor.

    ``converted`` holds each column already made ready for TensorFlow, or None for a ragged one, whose values
    are converted here one at a time. A row of a converted column goes through ``expand_dims`` of its element
    (not a slice) so that it has the dtype the value would have on its own (a ``str`` becomes a unicode array).
    """
    for i in range(len(flat[0])):
        yield [np.expand_dims(value_for_tf(name, column[i]) if ready is None else ready[i], 0)
               for name, column, ready in zip(names, flat, converted, strict=True)]
