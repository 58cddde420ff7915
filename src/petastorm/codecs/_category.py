"""Categories as integer codes: a column of values (categorical, dictionary-encoded or plain) read as their codes.

:class:`CategoryCodec` holds one list of categories for a field; a value's code is its place in that list, whatever
the dictionary of the file or row group it comes from (pandas and Polars write each file's own dictionary, and
Polars ``Categorical`` columns differ from file to file). Decoding is columnar: for a dictionary-encoded chunk, the
dictionary (a few values) is looked up in the categories once and the row's dictionary indices are remapped by one
``take``; a plain chunk is looked up whole (``pyarrow.compute.index_in``).

:class:`LabelNames` is what a column of labels with names answers (``names``, ``int2str``, ``str2int``), shared by
this codec and :class:`~petastorm.codecs.ClassLabelCodec`, as Hugging Face ``ClassLabel`` answers it.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from petastorm.codecs._base import _field_name
from petastorm.codecs._scalar import ScalarCodec
from petastorm.errors import CodecError
from petastorm.typemaps.scalars import arrow_type_from_json, arrow_type_to_json, scalar_column_to_numpy

__all__ = ['CategoryCodec', 'LabelNames', 'codes_of_column']

# Values shown in an error about values that are not categories.
_SHOWN = 5


class LabelNames(ScalarCodec):
    """A scalar codec of labels with names: ``names[label]``, and the two lookups ``datasets.ClassLabel`` has.

    A subclass says which attribute holds what it is made of and compared by (``_labels_attribute``, also the key
    of its JSON description) and is built as ``cls(labels, arrow_type)``.
    """

    names: list[str]
    _labels_attribute = 'names'

    def int2str(self, label: int) -> str:
        """The name of label ``label``."""
        return self.names[int(label)]

    def str2int(self, name: str) -> int:
        """The label called ``name``.

        Raises:
            ValueError: no label has that name.
        """
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f'{name!r} is not a class name; classes: {self.names}') from None

    def _labels(self) -> list[Any]:
        return list(getattr(self, self._labels_attribute))

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, self._labels_attribute: self._labels(),
                **arrow_type_to_json(self.arrow_type())}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> LabelNames:
        labels = list(description.get(cls._labels_attribute, []))
        return cls(labels, arrow_type_from_json(description))  # type: ignore[call-arg]  # the subclasses' form

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, LabelNames) and self._labels() == other._labels() \
            and self.arrow_type() == other.arrow_type()

    def __hash__(self) -> int:
        return hash((tuple(self.names), str(self.arrow_type())))


class CategoryCodec(LabelNames):
    """A column of category values read as int64 codes: a value's code is its place in ``categories``.

    Readers give a field this codec when asked for codes (``make_batch_reader(..., categorical_codes=...)``); its
    ``categories`` say what each code means, as ``ClassLabel``'s names do::

        codec = reader.schema.fields['color'].codec
        codec.categories[3], codec.int2str(3), codec.str2int('red')

    Nulls stay nulls (a masked column; the torch loaders' ``nulls=`` option fills or masks them). A value that is
    not one of the categories is an error naming it.

    Args:
        categories: the values, in code order (strings, integers, ...; no repeats).
        value_type: the Arrow type of the values as stored (default: inferred from ``categories``; string when
            there are none).
    """

    codec_name = 'category'
    _labels_attribute = 'categories'

    def __init__(self, categories: Sequence[Any], value_type: pa.DataType | None = None) -> None:
        values = list(categories)
        if value_type is None:
            value_type = pa.array(values).type if values else pa.string()
            if pa.types.is_null(value_type):
                raise CodecError(f'categories must be values (strings, integers, ...), got {values!r}')
        super().__init__(value_type)
        repeated = sorted({str(v) for v, n in collections.Counter(values).items() if n > 1})
        if repeated:
            raise CodecError(f'categories must be distinct; repeated: {repeated}')
        self.categories = values
        self.names = [str(value) for value in values]
        self._lookup: pa.Array | None = None

    def _value_set(self) -> pa.Array:
        if self._lookup is None:
            self._lookup = pa.array(self.categories, type=self.arrow_type())
        return self._lookup

    def encode(self, unischema_field: Any, value: Any) -> Any:
        code = int(value)
        if not 0 <= code < len(self.categories):
            raise CodecError(f'field {_field_name(unischema_field)}: code {code} is not a code of its '
                             f'{len(self.categories)} categories')
        return super().encode(unischema_field, self.categories[code])

    def decode(self, unischema_field: Any, value: Any) -> Any:
        try:
            return np.int64(self.categories.index(value))
        except ValueError:
            raise _unknown_values(unischema_field, [value], self) from None

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> Any:
        return scalar_column_to_numpy(unischema_field, codes_of_column(unischema_field, column, self))

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), '_lookup': None}  # the lookup array is made again where it is used

    def __str__(self) -> str:
        shown = ', '.join(self.names[:_SHOWN]) + (', ...' if len(self.names) > _SHOWN else '')
        return f'CategoryCodec({len(self.categories)} categories: {shown})'


def codes_of_column(field: Any, column: pa.Array | pa.ChunkedArray, codec: CategoryCodec) -> pa.Array:
    """The int64 codes of ``column``'s values in ``codec.categories`` (nulls stay nulls), one Arrow array.

    Raises:
        CodecError: a value is not one of the categories, or the column's values cannot be compared with them.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    codes = [_chunk_codes(field, chunk, codec) for chunk in chunks]
    if not codes:
        return pa.array([], type=pa.int64())
    return codes[0] if len(codes) == 1 else pa.concat_arrays(codes)


def _chunk_codes(field: Any, chunk: pa.Array, codec: CategoryCodec) -> pa.Array:
    if isinstance(chunk.type, pa.DictionaryType):
        # The dictionary's own codes, once; the rows take theirs from it.
        remap = _lookup(field, chunk.dictionary, codec)
        codes = remap.take(chunk.indices)
    else:
        codes = _lookup(field, chunk, codec)
    if codes.null_count != chunk.null_count:  # a value that is not a category (or a null in a dictionary)
        values = chunk.dictionary_decode() if isinstance(chunk.type, pa.DictionaryType) else chunk
        lost = pc.and_(codes.is_null(), values.is_valid())
        if pc.any(lost).as_py():
            _raise_unknown(field, values, lost, codec)
    return codes.cast(pa.int64())


def _lookup(field: Any, values: pa.Array, codec: CategoryCodec) -> pa.Array:
    value_set = codec._value_set()
    if not values.type.equals(value_set.type):
        try:
            values = values.cast(value_set.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            raise CodecError(f'field {_field_name(field)}: its {values.type} values cannot be compared with the '
                             f'{value_set.type} categories of {codec}: {err}') from err
    return pc.index_in(values, value_set=value_set)


def _raise_unknown(field: Any, values: pa.Array, lost: pa.Array, codec: CategoryCodec) -> None:
    raise _unknown_values(field, pc.unique(values.filter(lost)).to_pylist(), codec)


def _unknown_values(field: Any, values: list[Any], codec: CategoryCodec) -> CodecError:
    shown = ', '.join(repr(v) for v in values[:_SHOWN]) + (f' and {len(values) - _SHOWN} more' if
                                                            len(values) > _SHOWN else '')
    return CodecError(f'field {_field_name(field)}: {shown} {"is" if len(values) == 1 else "are"} not among its '
                      f'{len(codec.categories)} categories ({codec}); give the reader every category '
                      f"(categorical_codes={{'{_field_name(field)}': [...]}}), or None to take them from the data")
