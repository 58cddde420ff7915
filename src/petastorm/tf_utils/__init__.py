"""TensorFlow adapters for petastorm readers; TensorFlow itself is imported only when a function is called.

* :func:`make_petastorm_dataset`: a reader as a ``tf.data.Dataset`` (eager, Keras, ``tf.function``), fed
  with whole decoded columns.
* :func:`tf_tensors`: legacy TF1 graph-mode tensors pulling one element per ``session.run``.

Both render the reader's Unischema to TensorFlow dtypes and static shapes the same way
(:meth:`petastorm.unischema.Unischema.as_tf_dtypes`) and convert values TensorFlow has no tensor for:
``Decimal`` to its normalized string, times to int64 nanoseconds since the epoch, uint16/uint32 widened to
int32/int64; a ``None`` value is an error naming the field.

Example:
    >>> from petastorm import make_batch_reader
    >>> from petastorm.tf_utils import make_petastorm_dataset
    >>> with make_batch_reader('file:///tmp/scalars', num_epochs=1) as reader:
    ...     for batch in make_petastorm_dataset(reader):
    ...         ...  # batch.id is an int64 tensor of shape (rows in the row group,)
"""

from __future__ import annotations

from petastorm.tf_utils._convert import _sanitize_field_tf_types, date_to_nsec_from_epoch
from petastorm.tf_utils._dataset import make_petastorm_dataset
from petastorm.tf_utils._graph import RANDOM_SHUFFLING_QUEUE_SIZE, tf_tensors
from petastorm.tf_utils._layout import _numpy_to_tf_dtypes, _schema_to_tf_dtypes, make_namedtuple_tf_ngram

__all__ = [
           'RANDOM_SHUFFLING_QUEUE_SIZE',
           '_numpy_to_tf_dtypes',
           '_sanitize_field_tf_types',
           '_schema_to_tf_dtypes',
           'date_to_nsec_from_epoch',
           'make_namedtuple_tf_ngram',
           'make_petastorm_dataset',
           'tf_tensors',
]
