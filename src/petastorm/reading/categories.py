"""``categorical_codes``: categorical columns delivered as int64 codes, with their categories in the schema.

pandas ``Categorical``, Polars ``Categorical`` and ``Enum`` and Arrow dictionary columns are stored as a dictionary
of values and each row's index into it; readers deliver the values. An embedding layer (or a classification loss)
wants integers instead, and the same integer for the same value in every batch, although every file (in Polars,
every row group) stores its own dictionary. So a field asked for as codes gets one list of categories for the
whole store, in a :class:`~petastorm.codecs.CategoryCodec` (``reader.schema.fields[name].codec.categories``), and
every row's code is its value's place in that list:

* categories given by the user (``{'color': ['red', 'green', 'blue']}``) are used as they are: the codes are the
  same for every store and every run, what a model trained on them needs at inference;
* else they are read from the data when the reader is made (the field's column of every row group, in threads):
  when every row group stores the same dictionary (pandas and Polars ``Enum`` write the whole list of categories
  each time), that dictionary in its order, so the codes are pandas' ``.cat.codes`` and Polars' physical values;
  otherwise (Polars ``Categorical``, dictionaries that differ, plain columns) the distinct values sorted, as
  ``datasets``' ``class_encode_column`` and pandas' ``astype('category')`` make them.

Predicates and ``filters`` still see the values; a ``TransformSpec`` sees the codes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from petastorm.codecs import CategoryCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

__all__ = ['CategoricalCodes', 'check_categorical_codes', 'coded_view']

#: ``categorical_codes`` checked: False, True, or ``((field name, categories or None), ...)``.
CategoricalCodes = bool | tuple[tuple[str, tuple[Any, ...] | None], ...]
#: Reads the columns ``names`` of every row group: one Arrow table per row group.
ReadColumns = Callable[[list[str]], list[pa.Table]]

_FORMS = ("categorical_codes must be True (every categorical column: pandas or Polars categoricals, Arrow "
          "dictionaries), a list of field names, or a dict of field name to its categories (a list, or None to "
          "take them from the data)")


def check_categorical_codes(value: Any) -> CategoricalCodes:
    """``categorical_codes`` as :data:`CategoricalCodes` (hashable, order kept).

    Raises:
        ValueError: not one of the accepted forms (the message names them).
    """
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = [(name, None) for name in value]
    else:
        raise ValueError(f'{_FORMS}; got {value!r}')
    checked = []
    for name, categories in items:
        if not isinstance(name, str):
            raise ValueError(f'{_FORMS}; got the field name {name!r}')
        if categories is not None and (isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence)
                                       and not isinstance(categories, np.ndarray)):
            raise ValueError(f'{_FORMS}; got {categories!r} as the categories of {name!r}')
        checked.append((name, None if categories is None else tuple(
            categories.tolist() if isinstance(categories, np.ndarray) else categories)))
    return tuple(checked)


def coded_view(view: Unischema, codes: CategoricalCodes, arrow_schema: pa.Schema,
               read_columns: ReadColumns) -> Unischema:
    """``view`` with the fields ``codes`` asks for as int64 codes (a :class:`CategoryCodec` each).

    Args:
        view: the fields selected.
        codes: the checked option.
        arrow_schema: the store's Arrow schema (its dictionary columns are the categorical ones).
        read_columns: reads columns of every row group, for the categories not given.

    Raises:
        ValueError: a field named that is not selected, or whose values are not scalars.
    """
    wanted = _wanted(view, codes, arrow_schema)
    if not wanted:
        return view
    to_read = [name for name, categories in wanted.items() if categories is None]
    found = _categories_in_data(read_columns(to_read), to_read) if to_read else {}
    fields = []
    for name, field in view.fields.items():
        if name in wanted:
            categories, value_type = found[name] if name in found else (list(wanted[name] or ()), None)
            field = UnischemaField(name, np.int64, (), CategoryCodec(categories, value_type), field.nullable)
        fields.append(field)
    return Unischema(view._name, fields)


def _wanted(view: Unischema, codes: CategoricalCodes, arrow_schema: pa.Schema) -> dict[str, tuple[Any, ...] | None]:
    """The fields to deliver as codes, with their categories where given."""
    if codes is False:
        return {}
    if codes is True:
        return {name: None for name in view.fields if name in arrow_schema.names
                and isinstance(arrow_schema.field(name).type, pa.DictionaryType)}
    assert isinstance(codes, tuple)
    unknown = [name for name, _ in codes if name not in view.fields]
    if unknown:
        raise ValueError(f'categorical_codes names {unknown}, which are not fields the reader reads (fields: '
                         f'{", ".join(view.fields)})')
    for name, _ in codes:
        field = view.fields[name]
        if tuple(field.shape) != () or not (field.codec is None or type(field.codec) in (ScalarCodec,
                                                                                      CategoryCodec)):
            raise ValueError(f'categorical_codes names {name!r}, whose values are not scalars ({field}): only a '
                             f'column of single values (categorical, strings, integers) has codes')
    return dict(codes)


def _categories_in_data(tables: list[pa.Table], names: list[str]) -> dict[str, tuple[list[Any], pa.DataType]]:
    """``{name: (categories, value type)}`` of each column of the row groups' ``tables`` (see the module doc)."""
    out = {}
    for name in names:
        dictionaries, plain = [], []
        for table in tables:
            for chunk in table.column(name).chunks:
                if isinstance(chunk.type, pa.DictionaryType):
                    dictionaries.append(chunk.dictionary)
                else:
                    plain.append(pc.unique(chunk))
        out[name] = _one_list(dictionaries, plain)
    return out


def _one_list(dictionaries: list[pa.Array], plain: list[pa.Array]) -> tuple[list[Any], pa.DataType]:
    """The categories of a column: its one dictionary as stored, else its distinct values sorted."""
    if dictionaries and not plain and all(d.equals(dictionaries[0]) for d in dictionaries[1:]):
        return dictionaries[0].drop_null().to_pylist(), dictionaries[0].type
    arrays = dictionaries + plain
    if not arrays:
        return [], pa.string()
    value_type = arrays[0].type
    values = pc.unique(pa.chunked_array([a.cast(value_type) for a in arrays], type=value_type)).drop_null()
    return values.take(pc.array_sort_indices(values)).to_pylist(), value_type
