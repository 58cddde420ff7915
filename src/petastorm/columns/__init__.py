"""Columns of any Arrow type: values, offsets and validity straight from the Arrow buffers.

The reader decodes each row group's columns into numpy arrays where a column is flat and null-free, and into
the kinds of this package otherwise (``docs/types.md`` lists every Arrow type and what each reader and loader
delivers for it):

* :class:`MaskedColumn`: values and a bool ``valid`` (the numpy batch reader hands it over as a
  ``numpy.ma.MaskedArray``);
* :class:`ListColumn`: ragged and nested lists as ``values`` (the elements of every row, itself a column) and
  int64 ``offsets``; :class:`MapColumn` for maps (``key``/``value`` struct elements);
* :class:`StructColumn`: a dict of the struct's field columns, with the struct's own ``valid``.

Everything here works on whole arrays; the functions that make Python values per row (:func:`row_values`,
:func:`to_pylist`) are for the row readers and for tests.

Example:
    >>> import pyarrow as pa
    >>> ids = from_arrow(pa.array([[1, 2], [], [3]]))
    >>> ids.values, ids.offsets
    (array([1, 2, 3]), array([0, 2, 2, 3]))
"""

from petastorm.columns._arrow import from_arrow, list_offsets, primitive_to_numpy, single_chunk, to_arrow
from petastorm.columns._edge import batch_column, cast_leaves, from_batch_column
from petastorm.columns._flat import SEPARATOR, flatten_columns, is_flat_key, unflatten_columns
from petastorm.columns._kinds import (
    Column,
    ListColumn,
    MapColumn,
    MaskedColumn,
    StructColumn,
    column_nbytes,
    concat_columns,
    densified,
    is_nested,
    leaf_validity,
    list_depth,
    num_rows,
    ragged_index,
    row_value,
    row_values,
    slice_column,
    take_column,
    to_pylist,
)

__all__ = ['SEPARATOR', 'Column', 'ListColumn', 'MapColumn', 'MaskedColumn', 'StructColumn', 'batch_column',
           'cast_leaves', 'column_nbytes', 'concat_columns', 'densified', 'flatten_columns', 'from_arrow',
           'from_batch_column',
           'is_flat_key', 'is_nested', 'leaf_validity', 'list_depth', 'list_offsets', 'num_rows',
           'primitive_to_numpy', 'ragged_index', 'row_value', 'row_values', 'single_chunk', 'slice_column',
           'take_column', 'to_arrow', 'to_pylist', 'unflatten_columns']
