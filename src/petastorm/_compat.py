"""What the oldest pyarrow we support lacks: one rule per difference, each naming the release that brought it.

``pyproject.toml`` declares the floors and ``make test-floors`` runs the tests at them. A rule goes when the floor
passes the release it names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.errors import SchemaError

__all__ = [
    'PYARROW_READS_NULL_FIXED_SIZE_LISTS', 'array_of_values', 'is_binary_view', 'is_list_view', 'is_nested_type',
    'is_string_view', 'map_array', 'null_fixed_size_list_hint', 'refuse_unreadable_null_lists',
]


def _major(version: str) -> int:
    found = re.match(r'\d+', version)
    return int(found.group()) if found else 0


_PYARROW = _major(pa.__version__)

#: Whether this pyarrow reads back from Parquet a fixed-size list column (an Arrow tensor column) with null rows, or
#: with null parents: from 26 on (apache/arrow issue 35692). Older releases write such columns (or refuse, with
#: "Lists with non-zero length null components") and fail reading them with "Expected all lists to be of size".
PYARROW_READS_NULL_FIXED_SIZE_LISTS = _PYARROW >= 26


_NULL_FIXED_SIZE_LISTS_ADVICE = (f'pyarrow {pa.__version__} cannot read such rows back from Parquet; pyarrow 26 '
                                 f'and later can (apache/arrow issue 35692): upgrade pyarrow')


def null_fixed_size_list_hint(err: BaseException) -> str | None:
    """What to do when ``err`` is this pyarrow failing on null rows of a fixed-size list in Parquet, else None."""
    if PYARROW_READS_NULL_FIXED_SIZE_LISTS or not isinstance(err, pa.ArrowException):
        return None
    text = str(err)
    if 'Expected all lists to be of size' not in text and 'non-zero length null components' not in text:
        return None
    return f'it holds null rows of a fixed-size list column (such as null tensors); {_NULL_FIXED_SIZE_LISTS_ADVICE}'


def refuse_unreadable_null_lists(table: pa.Table, where: str) -> None:
    """Refuse to write ``table`` to Parquet where this pyarrow could not read a column of it back.

    Args:
        table: what is about to be written.
        where: the dataset or file, for the message.

    Raises:
        SchemaError: a column holds null rows at or above a fixed-size list (null tensors of an Arrow tensor column)
            and this pyarrow is older than 26.
    """
    if PYARROW_READS_NULL_FIXED_SIZE_LISTS:
        return
    for name, column in zip(table.column_names, table.columns, strict=True):
        if any(_null_over_fixed_size_list(chunk) for chunk in column.chunks):
            raise SchemaError(f'{where}: column {name!r} holds null rows of (or above) a fixed-size list, such as null '
                              f'tensors; {_NULL_FIXED_SIZE_LISTS_ADVICE}, or write no null rows in it (NdarrayCodec '
                              f'stores null arrays with any pyarrow)')


def _null_over_fixed_size_list(array: pa.Array) -> bool:
    """True when a fixed-size list in ``array`` has a null row, or lies under a null row of a struct."""
    if isinstance(array, pa.ExtensionArray):
        return _null_over_fixed_size_list(array.storage)
    arrow_type = array.type
    if pa.types.is_fixed_size_list(arrow_type):
        return array.null_count > 0 or _null_over_fixed_size_list(array.flatten())
    if pa.types.is_struct(arrow_type):
        children = [array.field(i) for i in range(arrow_type.num_fields)]
        return any(_has_fixed_size_list(child.type) and (array.null_count > 0 or _null_over_fixed_size_list(child))
                   for child in children)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_map(arrow_type):
        if not _has_fixed_size_list(arrow_type):
            return False
        # A null list holds no elements: only the fixed-size lists inside may be null (or under null structs).
        first, last = array.offsets[0].as_py(), array.offsets[len(array)].as_py()
        return _null_over_fixed_size_list(array.values.slice(first, last - first))
    return False


def _has_fixed_size_list(arrow_type: pa.DataType) -> bool:
    if isinstance(arrow_type, pa.BaseExtensionType):
        return _has_fixed_size_list(arrow_type.storage_type)
    if pa.types.is_fixed_size_list(arrow_type):
        return True
    return any(_has_fixed_size_list(arrow_type.field(i).type) for i in range(arrow_type.num_fields))


def _type_check(name: str) -> Any:
    return getattr(pa.types, name, lambda _: False)


# String, binary and list views came in pyarrow 16: before it no column can have those types.
is_string_view = _type_check('is_string_view')
is_binary_view = _type_check('is_binary_view')
is_list_view = _type_check('is_list_view')


def is_nested_type(arrow_type: pa.DataType) -> bool:
    """``pa.types.is_nested``, which counts fixed-size lists from pyarrow 16 on (before it, they are not)."""
    return pa.types.is_nested(arrow_type) or pa.types.is_fixed_size_list(arrow_type)


def map_array(offsets: np.ndarray, keys: pa.Array, items: pa.Array, mask: np.ndarray | None) -> pa.Array:
    """``pa.MapArray.from_arrays(offsets, keys, items, mask=mask)`` (True in ``mask``: a null map).

    ``mask`` came in pyarrow 17; before it the maps are built without and the validity bitmap is set on them.
    """
    if mask is None or _PYARROW >= 17:
        return pa.MapArray.from_arrays(pa.array(offsets), keys, items, mask=None if mask is None else pa.array(mask))
    maps = pa.MapArray.from_arrays(pa.array(offsets), keys, items)
    validity = pa.py_buffer(np.packbits(~mask, bitorder='little'))
    return pa.Array.from_buffers(maps.type, len(maps), [validity, maps.buffers()[1]], null_count=int(mask.sum()),
                                 children=[maps.values])


def array_of_values(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """``pa.array(list(values), type=arrow_type)``: Python numbers (None: null) into a column of that type.

    pyarrow before 21 builds a ``float16`` column only from ``np.float16`` objects: such columns go through numpy.
    """
    if _PYARROW >= 21 or not pa.types.is_float16(arrow_type):
        return pa.array(list(values), type=arrow_type)
    nulls = np.fromiter((value is None for value in values), dtype=bool, count=len(values))
    numbers = np.array([0.0 if value is None else value for value in values], dtype=np.float16)
    return pa.array(numbers, type=arrow_type, mask=nulls if nulls.any() else None)
