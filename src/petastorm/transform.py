"""TransformSpec: a user function applied to decoded data in the workers, and the schema it produces."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from petastorm.unischema import Unischema, UnischemaField


def edit_field(name: str, numpy_dtype: Any, shape: tuple, nullable: bool = False) -> tuple:
    """Describe a field added or changed by a transform: ``(name, numpy_dtype, shape, nullable)``."""
    return (name, numpy_dtype, shape, nullable)


class TransformSpec:
    """A transform run by the reader's workers after decoding (and after the predicate).

    Args:
        func: for ``make_reader``, called with each row as a dict and returns a dict (or a tuple, whose
            positions then become the row); for ``make_batch_reader``, called with a pandas DataFrame of a batch
            and returns a DataFrame.
        edit_fields: fields the function adds or changes, as :func:`edit_field` tuples or ``UnischemaField`` s.
        removed_fields: names of fields the function removes (removed automatically if still present).
        selected_fields: names of the only fields to keep, in this order (exclusive with ``removed_fields``).
    """

    def __init__(self, func: Callable[[Any], Any] | None = None, edit_fields: Sequence[tuple] | None = None,
                 removed_fields: Sequence[str] | None = None, selected_fields: Sequence[str] | None = None):
        if removed_fields and selected_fields is not None:
            raise ValueError('User can only specify one of removed_fields and selected_fields in TransformSpec.')
        if func is not None and not callable(func):
            raise ValueError(f'TransformSpec func must be callable, got {func!r}')
        self.func = func
        self.edit_fields = list(edit_fields or [])
        self.removed_fields = list(removed_fields or [])
        self.selected_fields = list(selected_fields) if selected_fields is not None else None
        for edit in self.edit_fields:
            if not isinstance(edit, tuple) or len(edit) < 3:
                raise ValueError(f'TransformSpec edit_fields entries must be (name, numpy_dtype, shape[, nullable]) '
                                 f'tuples or UnischemaFields, got {edit!r}')

    def __repr__(self) -> str:
        return (f'TransformSpec(func={self.func!r}, edit_fields={self.edit_fields!r}, '
                f'removed_fields={self.removed_fields!r}, selected_fields={self.selected_fields!r})')


def _edit_to_field(edit: tuple) -> UnischemaField:
    if isinstance(edit, UnischemaField):
        return UnischemaField(edit.name, edit.numpy_dtype, tuple(edit.shape), None, edit.nullable)
    nullable = edit[3] if len(edit) > 3 else False
    return UnischemaField(edit[0], edit[1], tuple(edit[2]), None, nullable)


def transform_schema(schema: Unischema, transform_spec: TransformSpec | None) -> Unischema:
    """The schema of what a transform produces (``'<name>_transformed'``).

    Removed and edited fields leave the original list, edits are appended, then ``selected_fields`` (if any)
    picks and orders the result. Unknown removed/selected names are ignored with a warning.
    """
    if transform_spec is None:
        return schema
    removed = set(transform_spec.removed_fields)
    unknown_removed = removed - set(schema.fields)
    if unknown_removed:
        warnings.warn(f'remove_fields specified some field names that are not part of the schema. These field names '
                      f'will be ignored "{", ".join(sorted(unknown_removed))}". ', UserWarning, stacklevel=2)
    edits = [_edit_to_field(e) for e in transform_spec.edit_fields]
    edited = {f.name for f in edits}
    fields = [f for name, f in schema.fields.items() if name not in removed and name not in edited]
    fields += edits
    if transform_spec.selected_fields is not None:
        by_name = {f.name: f for f in fields}
        unknown = [n for n in transform_spec.selected_fields if n not in by_name]
        if unknown:
            warnings.warn(f'selected_fields specified some field names that are not part of the schema. These field '
                          f'names will be ignored "{", ".join(unknown)}". ', UserWarning, stacklevel=2)
        fields = [by_name[n] for n in transform_spec.selected_fields if n in by_name]
    return Unischema(f'{schema._name}_transformed', fields)
