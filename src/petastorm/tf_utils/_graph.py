"""``tf_tensors``: the legacy TF1 graph-mode bridge (a ``numpy_function`` that pulls ``next(reader)``).

Kept for graphs written for TensorFlow 1 (``tf.compat.v1`` sessions and queue runners). New code should use
:func:`petastorm.tf_utils.make_petastorm_dataset`, which works eagerly, with Keras and with ``tf.function``.
"""

from __future__ import annotations

from typing import Any

from petastorm._optional import import_optional
from petastorm._warnings import warn_user
from petastorm.tf_utils._convert import columns_for_tf, values_for_tf
from petastorm.tf_utils._layout import ElementLayout

#: Name of the graph op that reports how many elements the shuffling queue holds (for diagnostics).
RANDOM_SHUFFLING_QUEUE_SIZE = 'random_shuffling_queue_size'


def tf_tensors(reader: Any, shuffling_queue_capacity: int = 0, min_after_dequeue: int = 0) -> Any:
    """Graph-mode tensors that evaluate to the reader's next element on every ``session.run`` (legacy TF1 API).

    Call it while building a graph (inside ``with tf.compat.v1.Graph().as_default():``, or after
    ``tf.compat.v1.disable_eager_execution()``). Each run of the returned tensors pulls one element: a row for
    :func:`make_reader`, a batch (leading dimension ``None``) for :func:`make_batch_reader`. When the reader is
    exhausted, running them raises ``tf.errors.OutOfRangeError``. Dtypes, shapes and value conversions are those
    of :func:`make_petastorm_dataset`.

    Args:
        reader: a :class:`petastorm.reader.Reader`.
        shuffling_queue_capacity: when > 0, rows pass through a ``tf.compat.v1.RandomShuffleQueue`` of this
            capacity, filled by a queue runner (start it with ``tf.compat.v1.train.start_queue_runners``). Not
            allowed with a batch reader, whose batches are whole row groups.
        min_after_dequeue: the queue's minimum fill after a dequeue (used with ``shuffling_queue_capacity``).

    Returns:
        The reader's namedtuple of tensors, or ``{offset: namedtuple}`` for an NGram reader.

    Raises:
        ValueError: ``shuffling_queue_capacity`` with a batch reader.
        RuntimeError: called while TensorFlow executes eagerly.
    """
    tf = import_optional('tensorflow', 'petastorm.tf_utils.tf_tensors')
    v1 = tf.compat.v1
    if reader.batched_output and shuffling_queue_capacity > 0:
        raise ValueError(f'shuffling_queue_capacity={shuffling_queue_capacity} can not be used with a reader that '
                         f'produces batched_output (make_batch_reader): each batch is a row group, so shuffling '
                         f'whole batches does not mix rows. Use shuffle_rows=True on the reader instead.')
    if tf.executing_eagerly():
        raise RuntimeError('tf_tensors builds TF1 graph-mode tensors but TensorFlow is executing eagerly: call it '
                           'inside `with tf.compat.v1.Graph().as_default():` and run the tensors in a '
                           'tf.compat.v1.Session, or use petastorm.tf_utils.make_petastorm_dataset instead.')
    layout = ElementLayout.of(reader)
    if layout.nested:
        # Graph-mode tensors of one shape each: list, map and struct fields, which make_petastorm_dataset delivers
        # as ragged tensors and dicts, are left out here, with a warning naming them.
        warn_user(f'tf_tensors leaves out the list, map and struct fields {sorted(layout.nested)} (a TF1 graph '
                      f'tensor has one dtype and shape); make_petastorm_dataset delivers them as tf.RaggedTensor and '
                      f'dicts', UserWarning)
        layout = layout.without_nested(reader.schema)
    layout.warn_about_unicode()
    dtypes = layout.dtypes()
    convert = columns_for_tf if reader.batched_output else values_for_tf

    def pull() -> list[Any]:
        # StopIteration at the end of the data becomes tf.errors.OutOfRangeError.
        return convert(layout.names, layout.flatten(next(reader)))

    flat = list(v1.numpy_function(pull, [], dtypes, stateful=True, name='petastorm_next'))
    if shuffling_queue_capacity > 0:
        queue = v1.RandomShuffleQueue(shuffling_queue_capacity, min_after_dequeue, dtypes)
        queue.size(name=RANDOM_SHUFFLING_QUEUE_SIZE)  # a well-known op name, so diagnostics can find the fill
        v1.train.add_queue_runner(v1.train.QueueRunner(queue, [queue.enqueue(flat)]))
        dequeued = queue.dequeue()
        flat = list(dequeued) if isinstance(dequeued, (list, tuple)) else [dequeued]
    for tensor, shape in zip(flat, layout.shapes(reader.batched_output), strict=True):
        tensor.set_shape(shape)
    return layout.pack(flat)
