"""The structure of what a reader yields, as TensorFlow sees it: dtypes, static shapes, flat order, packing.

A reader yields a namedtuple of its schema's fields, or, with an NGram, a dict ``{offset: namedtuple}`` with one
namedtuple per offset of the window. TensorFlow ops that cross into Python (``numpy_function``, queues) take flat
lists of tensors, so an :class:`ElementLayout` fixes one flat order of the fields (offsets ascending, schema
order inside each) and converts between that flat list and the nested structure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm._warnings import warn_user
from petastorm.columns import take_column
from petastorm.reading.batch import ColumnBatch
from petastorm.tf_utils._dtypes import numpy_to_tf_dtype, tf_dtype_name
from petastorm.tf_utils._nested import nested_type, spec_of
from petastorm.unischema import Unischema, UnischemaField


def _numpy_to_tf_dtypes(numpy_dtype: Any) -> Any:
    """The ``tf.DType`` that carries values of ``numpy_dtype`` (imports TensorFlow)."""
    return numpy_to_tf_dtype(numpy_dtype)


def _schema_to_tf_dtypes(schema: Unischema) -> list[Any]:
    """The ``tf.DType`` of each field of ``schema``, in schema order (imports TensorFlow)."""
    return list(schema.as_tf_dtypes().values())


@dataclass(frozen=True)
class _Group:
    """The fields of one namedtuple of an element: the whole element, or one NGram offset."""

    offset: int | None
    make: type
    fields: tuple[UnischemaField, ...]


class ElementLayout:
    """One reader's element structure.

    Args:
        schema: the reader's schema (after field selection and transform).
        ngram: the reader's NGram, or None.
        ragged: every list field with a varying dimension is a ``tf.RaggedTensor`` (one-level lists of numbers too,
            which are dense tensors otherwise, as in Petastorm); see :mod:`petastorm.tf_utils._nested`.
    """

    def __init__(self, schema: Unischema, ngram: Any = None, ragged: bool = False):
        self.ngram = ngram
        self.ragged = ragged
        self._groups: tuple[_Group, ...]
        if ngram is None:
            self._groups = (_Group(None, schema._get_namedtuple(), tuple(schema.fields.values())),)
            self.base = 0
        else:
            self.base = min(ngram.fields)
            views = ((offset, ngram.get_schema_at_timestep(schema, offset))
                     for offset in range(self.base, self.base + ngram.length))
            self._groups = tuple(_Group(offset, view._get_namedtuple(), tuple(view.fields.values()))
                                 for offset, view in views)
        self.fields = [field for group in self._groups for field in group.fields]
        self.names = [field.name for field in self.fields]
        #: stored types of the fields TensorFlow gets as ragged tensors or dicts, by name
        self.nested = {field.name: t for field in self.fields if (t := nested_type(field, ragged)) is not None}
        for field in self.fields:
            if field.name not in self.nested:
                _check_tf_type(field)

    @classmethod
    def of(cls, reader: Any) -> ElementLayout:
        """The layout of ``reader``'s elements."""
        return cls(reader.schema, reader.ngram)

    def dtypes(self) -> list[Any]:
        """The ``tf.DType`` of each flat field (imports TensorFlow).

        Raises:
            ValueError: a field is a list, map or struct field, which only ``make_petastorm_dataset`` delivers.
        """
        self.refuse_nested('tf_tensors')
        return [numpy_to_tf_dtype(field.numpy_dtype) for field in self.fields]

    def refuse_nested(self, what: str) -> None:
        """Raise a ``ValueError`` naming the list, map and struct fields, which ``what`` cannot deliver."""
        if self.nested:
            raise ValueError(f'{what} cannot deliver the list, map and struct fields {sorted(self.nested)} (ragged '
                             f'tensors and dicts); use make_petastorm_dataset, or leave them out with schema_fields')

    def shapes(self, batched: bool) -> list[tuple[int | None, ...]]:
        """Static shape of each flat field; batches have a leading dimension of unknown size."""
        return [((None,) if batched else ()) + tuple(field.shape) for field in self.fields]

    def signature(self, batched: bool) -> Any:
        """The nested structure of ``tf.TensorSpec`` s describing one element (imports TensorFlow)."""
        from petastorm._optional import import_optional

        tf = import_optional('tensorflow', 'petastorm.tf_utils')
        if not batched:
            self.refuse_nested('a reader of single rows without column batches')
        specs = [spec_of(self.nested[field.name], field.name) if field.name in self.nested else
                 tf.TensorSpec(shape, numpy_to_tf_dtype(field.numpy_dtype))
                 for field, shape in zip(self.fields, self.shapes(batched), strict=True)]
        return self.pack(specs)

    def pack(self, flat: Sequence[Any]) -> Any:
        """The element structure (namedtuple or ``{offset: namedtuple}``) holding ``flat`` in layout order."""
        values = iter(flat)
        if self.ngram is None:
            group = self._groups[0]
            return group.make(*(next(values) for _ in group.fields))
        return {group.offset: group.make(*(next(values) for _ in group.fields)) for group in self._groups}

    def flatten(self, element: Any) -> list[Any]:
        """The values of a reader element, in layout order (the layout may hold fewer fields than the element)."""
        if self.ngram is None:
            if len(element) == len(self.names):
                return list(element)
            return [getattr(element, name) for name in self.names]
        return [getattr(element[group.offset], field.name) for group in self._groups for field in group.fields]

    def without_nested(self, schema: Unischema) -> ElementLayout:
        """This layout without its list, map and struct fields (see :attr:`nested`), for ``schema``'s reader."""
        if not self.nested:
            return self
        view = schema.create_schema_view([f for f in schema.fields.values() if f.name not in self.nested])
        return ElementLayout(view, self.ngram, self.ragged)

    def batch_columns(self, batch: ColumnBatch) -> list[Any]:
        """The flat columns of one :class:`~petastorm.reading.batch.ColumnBatch` of a reader.

        For an NGram, the i-th row of each column is the i-th window's row at that column's offset.
        """
        columns = batch.columns
        if batch.rows_are_tuples:
            # A row transform returned tuples: columns are named by position.
            return [columns[str(i)] for i in range(len(self.names))]
        if self.ngram is None:
            return [columns[name] for name in self.names]
        starts = batch.ngram_starts
        assert starts is not None, 'an NGram batch carries its window starts'
        return [take_column(columns[field.name], starts + (self._offset(group) - self.base))
                for group in self._groups for field in group.fields]

    @staticmethod
    def _offset(group: _Group) -> int:
        assert group.offset is not None, 'the groups of an NGram layout have offsets'
        return group.offset

    def unicode_fields(self) -> list[str]:
        """Fields of unicode strings (TensorFlow hands them back as UTF-8 bytes)."""
        return list(dict.fromkeys(f.name for f in self.fields if f.numpy_dtype is np.str_))

    def warn_about_unicode(self) -> None:
        """Tell once that unicode fields come back as bytes (the original warned the same way)."""
        names = self.unicode_fields()
        if names:
            warn_user(f'Tensorflow will convert all unicode strings back to bytes type: fields {names} arrive '
                          f"as tf.string (UTF-8 bytes); decode them with .decode('utf-8') where text is needed.",
                          UnicodeWarning)

    def groups(self) -> Iterator[tuple[int | None, type, tuple[UnischemaField, ...]]]:
        """``(offset, namedtuple class, fields)`` of each namedtuple of an element."""
        for group in self._groups:
            yield group.offset, group.make, group.fields


def _check_tf_type(field: UnischemaField) -> None:
    """Fail early, naming the field, when its numpy type has no TensorFlow counterpart."""
    try:
        tf_dtype_name(field.numpy_dtype)
    except ValueError as err:
        raise ValueError(f'field {field.name!r} cannot become a TensorFlow tensor: {err}') from err


def make_namedtuple_tf_ngram(unischema: Unischema, ngram: Any, *args: Any, **kwargs: Any) -> dict[int, Any]:
    """``{offset: namedtuple}`` of an NGram element from flat values and/or per-offset field dicts.

    Args:
        unischema: the reader's schema.
        ngram: the NGram.
        *args: values of every offset's fields, offsets ascending, schema order inside an offset.
        **kwargs: ``{str(offset): {field name: value}}`` for offsets not covered by ``args``.
    """
    layout = ElementLayout(unischema, ngram)
    values = list(args)
    result: dict[int, Any] = {}
    for offset, make, fields in layout.groups():
        assert offset is not None, 'the groups of an NGram layout have offsets'
        given = dict(kwargs.get(str(offset), {}))
        for field in fields:
            if field.name not in given:
                if not values:
                    raise ValueError(f'no value for field {field.name!r} at offset {offset}: {len(args)} positional '
                                     f'values given for {len(layout.fields)} fields')
                given[field.name] = values.pop(0)
        result[offset] = make(**given)
    return result
