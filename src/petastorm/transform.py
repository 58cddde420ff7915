"""TransformSpec: a user function applied to decoded data in the workers, and the schema it produces."""

from __future__ import annotations

import decimal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from petastorm._warnings import warn_user
from petastorm.errors import SchemaError
from petastorm.unischema import Unischema, UnischemaField

__all__ = [
    'TransformResultError', 'TransformSpec', 'check_row_result', 'check_transformed_values', 'describe_function',
    'edit_field', 'transform_schema',
]


class TransformResultError(SchemaError, TypeError):
    """What a ``TransformSpec`` function returned does not match the transformed schema.

    Both a ``ValueError`` (as the original's column mismatch) and a ``TypeError`` (as the original's failure on a
    result that is not a dict).
    """


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
                 removed_fields: Sequence[str] | None = None, selected_fields: Sequence[str] | None = None) -> None:
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
        warn_user(f'remove_fields specified some field names that are not part of the schema. These field names '
                  f'will be ignored "{", ".join(sorted(unknown_removed))}". ')
    edits = [_edit_to_field(e) for e in transform_spec.edit_fields]
    edited = {f.name for f in edits}
    fields = [f for name, f in schema.fields.items() if name not in removed and name not in edited]
    fields += edits
    if transform_spec.selected_fields is not None:
        by_name = {f.name: f for f in fields}
        unknown = [n for n in transform_spec.selected_fields if n not in by_name]
        if unknown:
            warn_user(f'selected_fields specified some field names that are not part of the schema. These field '
                      f'names will be ignored "{", ".join(unknown)}". ')
        fields = [by_name[n] for n in transform_spec.selected_fields if n in by_name]
    return Unischema(f'{schema._name}_transformed', fields)


def describe_function(func: Any) -> str:
    """How a transform function is named in messages: its qualified name and where it is defined."""
    name = getattr(func, '__qualname__', None) or getattr(func, '__name__', None)
    if name is None:
        return repr(func)
    code = getattr(func, '__code__', None)
    if code is not None:
        return f'{name} ({code.co_filename}:{code.co_firstlineno})'
    return name


# What kind of values a field's numpy type holds, as far as a mistake can be told apart from a choice: numbers
# (bool, ints, floats and Decimals stand in for each other) and text (str or bytes).
_NUMBER, _TEXT = 'number', 'text'


def _kind_of_type(numpy_dtype: Any) -> str | None:
    if numpy_dtype is decimal.Decimal:
        return _NUMBER
    if numpy_dtype in (str, bytes):
        return _TEXT
    try:
        kind = np.dtype(numpy_dtype).kind
    except TypeError:
        return None
    return _NUMBER if kind in 'biufc' else _TEXT if kind in 'SU' else None


def _kind_of_value(value: Any) -> str | None:
    """The kind of a value returned for a field (an array or a list: of its elements); None when unknown."""
    if isinstance(value, (bool, int, float, complex, decimal.Decimal, np.number, np.bool_)):
        return _NUMBER
    if isinstance(value, (str, bytes, np.str_, np.bytes_)):
        return _TEXT
    if isinstance(value, np.ndarray):
        if value.dtype != object:
            return _kind_of_type(value.dtype)
        return _kind_of_value(value.flat[0]) if value.size else None
    if isinstance(value, (list, tuple)) and value:
        return _kind_of_value(value[0])
    return None


def _shape_of_value(value: Any) -> tuple | None:
    """The shape of a returned value: ``()`` for scalars, None for objects whose shape is unknown."""
    if isinstance(value, (bool, int, float, complex, str, bytes, decimal.Decimal, np.generic)):
        return ()
    shape = getattr(value, 'shape', None)
    if shape is not None:
        return tuple(shape)
    if isinstance(value, (list, tuple)):
        try:
            return np.shape(value)
        except ValueError:  # ragged nested lists
            return None
    return None


def _type_name(numpy_dtype: Any) -> str:
    return getattr(numpy_dtype, '__name__', str(numpy_dtype))


def _describe_value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f'a {value.dtype} array of shape {value.shape}'
    text = repr(value)
    return f'{type(value).__name__} {text if len(text) <= 60 else text[:57] + "..."}'


def check_transformed_values(spec: TransformSpec, schema: Unischema, values: Mapping[str, Any],
                             where: str) -> None:
    """Check the values a transform returned for one row against the transformed schema.

    Fields declared in ``edit_fields`` must get values of their kind (numbers or text) and shape. Other fields may
    change type without being declared (the original allowed it, and turning text into numbers is common), but
    text returned where the schema has numbers (``'x'`` for an int32 field, a list of strings for a float
    array) is refused: no reader or loader can deliver it as the schema says.

    Raises:
        TransformResultError: naming the function, the field, what it returned and what the schema expects.
    """
    declared = {edit[0] for edit in spec.edit_fields}
    for name, field in schema.fields.items():
        value = values.get(name)
        if value is None or (isinstance(value, (float, np.floating)) and np.isnan(value)):
            continue  # missing (pandas writes NaN for a missing value in any column): nothing to judge
        expected = _kind_of_type(field.numpy_dtype)
        got = _kind_of_value(value)
        is_declared = name in declared
        if expected is not None and got is not None and got != expected and (is_declared or expected == _NUMBER):
            how = 'declares' if is_declared else 'has'
            hint = ('fix the function or the edit_fields entry' if is_declared else
                    f'if the change is meant, declare it: edit_fields=[({name!r}, np.str_, '
                    f'{tuple(field.shape)}, {bool(field.nullable)})]')
            raise TransformResultError(
                f'the TransformSpec function {describe_function(spec.func)} returned {_describe_value(value)} for '
                f'field {name!r}, whose transformed schema {how} {_type_name(field.numpy_dtype)} values of shape '
                f'{tuple(field.shape)} ({where}); {hint}')
        if is_declared:
            shape = _shape_of_value(value)
            wanted = tuple(field.shape)
            if shape is not None and (len(shape) != len(wanted) or any(
                    w is not None and w != s for w, s in zip(wanted, shape, strict=True))):
                described = _describe_value(value)
                if 'shape' not in described:
                    described += f' (shape {shape})'
                raise TransformResultError(
                    f'the TransformSpec function {describe_function(spec.func)} returned {described} '
                    f'for field {name!r}, which its edit_fields declare with shape {wanted} '
                    f'({where}); fix the function or the edit_fields entry (None marks a dimension that varies)')


def check_row_result(spec: TransformSpec, names: Sequence[str], result: Any, where: str,
                     schema: Unischema | None = None) -> None:
    """Check the first row a ``make_reader`` transform returned: a dict with every field, of the right types.

    Args:
        spec: the transform.
        names: the fields of the transformed schema.
        result: what the function returned for the row.
        where: the work item, for the message.
        schema: the transformed schema, to check the values' types (not checked when None).

    A tuple (its positions become the row) is not checked further. With ``selected_fields``, fields the function
    returned beyond them are dropped, as the spec asks (a function may return the whole row).

    Raises:
        TransformResultError: the result is not a dict (or tuple), lacks fields, has undeclared ones, or a value
            does not match its field (see :func:`check_transformed_values`).
    """
    function = describe_function(spec.func)
    if isinstance(result, tuple) and not hasattr(result, '_fields'):
        return
    if not isinstance(result, Mapping):
        raise TransformResultError(
            f'the TransformSpec function {function} must return a dict of field values (or a tuple), got '
            f'{_describe_value(result)} for a row of {where}; a make_reader transform receives one row as a dict '
            f'and returns the (changed) dict')
    missing = [name for name in names if name not in result]
    if missing:
        fix = ('return every field of selected_fields' if spec.selected_fields is not None else
               'return every field, or list the fields it drops in removed_fields')
        raise TransformResultError(
            f'the TransformSpec function {function} returned rows without field {missing[0]!r} (missing: '
            f'{missing}; expected {list(names)}) in {where}; {fix}')
    unexpected = sorted(set(result) - set(names) - set(spec.removed_fields))
    if unexpected and spec.selected_fields is None:
        raise TransformResultError(
            f'the TransformSpec function {function} returned fields {unexpected} that the transformed schema does '
            f'not declare; add them to edit_fields (in {where})')
    if schema is not None:
        check_transformed_values(spec, schema, result, where)
