"""Which TensorFlow dtype carries the values of a field: the table behind ``Unischema.as_tf_dtypes``.

The model (:mod:`petastorm.unischema`) knows nothing about TensorFlow; its two TensorFlow entry points,
``Unischema.as_tf_dtypes()`` and ``petastorm.unischema.numpy_to_tf_dtype``, call into this module. TensorFlow
itself is imported only by :func:`numpy_to_tf_dtype`.
"""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np

# numpy scalar type -> name of the TensorFlow dtype that carries it (strings and decimals travel as tf.string).
# uint16 and uint32 widen to signed types, as the TensorFlow adapters deliver them: few TF kernels take them.
_NUMPY_TO_TF_NAME = {
    np.int8: 'int8', np.uint8: 'uint8', np.int16: 'int16', np.uint16: 'int32', np.int32: 'int32',
    np.uint32: 'int64', np.int64: 'int64', np.uint64: 'uint64', np.float16: 'float16', np.float32: 'float32',
    np.float64: 'float64', np.bool_: 'bool', np.str_: 'string', np.bytes_: 'string', decimal.Decimal: 'string',
    np.datetime64: 'int64', np.timedelta64: 'int64',
}


def tf_dtype_name(numpy_dtype: Any) -> str:
    """The name of the TensorFlow dtype that carries values of a field's ``numpy_dtype``.

    Args:
        numpy_dtype: a numpy scalar type or ``np.dtype`` (``decimal.Decimal`` too).

    Returns:
        The ``tf`` attribute name: ``'string'`` for str, bytes and Decimal, ``'int64'`` for datetime64 (nanoseconds
        since the epoch), ``'int32'``/``'int64'`` for uint16/uint32.

    Raises:
        ValueError: the type has no TensorFlow counterpart (the message lists the supported ones).
    """
    if isinstance(numpy_dtype, np.dtype):
        numpy_dtype = numpy_dtype.type
    name = _NUMPY_TO_TF_NAME.get(numpy_dtype)
    if name is None:
        raise ValueError(f'numpy type {numpy_dtype!r} has no TensorFlow counterpart; supported: '
                         f'{", ".join(sorted(getattr(t, "__name__", str(t)) for t in _NUMPY_TO_TF_NAME))}')
    return name


def numpy_to_tf_dtype(numpy_dtype: Any) -> Any:
    """The ``tf.DType`` that carries values of a field's ``numpy_dtype`` (imports TensorFlow).

    Raises:
        ValueError: the type has no TensorFlow counterpart.
        MissingDependencyError: TensorFlow is not installed (the message names the pip extra).
    """
    from petastorm._optional import import_optional

    tf = import_optional('tensorflow', 'numpy_to_tf_dtype()')
    return getattr(tf, tf_dtype_name(numpy_dtype))


def schema_tf_dtypes(schema: Any) -> dict[str, Any]:
    """``{field name: tf.DType}`` of a Unischema's fields, in schema order (imports TensorFlow)."""
    return {name: numpy_to_tf_dtype(field.numpy_dtype) for name, field in schema.fields.items()}
