"""A row of values checked against a schema's fields and encoded for storage: :func:`encode_value`, a row at once.

The check and the encoding shared by :func:`petastorm.unischema.dict_to_spark_row` and the dataset writer
(:mod:`petastorm.writer`); :mod:`petastorm.unischema` exports it as ``encode_row``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from petastorm.codecs import encode_value
from petastorm.errors import SchemaError


def encode_row(unischema: Any, row_dict: Mapping[str, Any], *, column_encoded: bool = False) -> dict[str, Any]:
    """Validate ``row_dict`` against the schema and encode every value to what its Parquet cell stores.

    This is the validation shared by :func:`~petastorm.unischema.dict_to_spark_row` and the dataset writer. With
    ``column_encoded``, codec values are what the codec's ``check_value`` returns, for the caller to pass on to its
    ``encode_column`` (the codec protocol of :class:`~petastorm.codecs.DataframeColumnCodec`); without it, each
    value is encoded into its cell.

    Args:
        unischema: the :class:`~petastorm.unischema.Unischema` the row follows.
        row_dict: ``{field name: value}``; nullable fields may be missing.
        column_encoded: leave codec values for column encoding (see above).

    Returns:
        ``{field name: encoded value}`` for every field of the schema, ``None`` for nulls.

    Raises:
        SchemaError: missing or unexpected fields, a ``None`` in a non-nullable field, or a value whose type or
            shape does not match the field (the message names the field and what was expected).
    """
    if not isinstance(row_dict, Mapping):
        raise SchemaError(f'Expected a dict of field values for schema {unischema._name}, got {type(row_dict)}')
    row = dict(row_dict)
    _check_field_names(unischema, row)
    encoded: dict[str, Any] = {}
    for name, field in unischema.fields.items():
        value = row.get(name)
        if value is None:
            if not field.nullable:
                raise SchemaError(f'Field {name!r} is not nullable, but got None')
            encoded[name] = None
        elif column_encoded and field.codec is not None:
            encoded[name] = field.codec.check_value(field, value)
        else:
            encoded[name] = encode_value(field, value)
    return encoded


def _check_field_names(unischema: Any, row: dict[str, Any]) -> None:
    """Refuse a row that misses a non-nullable field or names one the schema does not have."""
    missing = [n for n, f in unischema.fields.items() if n not in row and not f.nullable]
    if missing:
        # The first sentence is the original's.
        raise SchemaError(f'Field {missing[0]} is not found in the row_dict, but is not nullable (missing '
                          f'non-nullable fields: {missing}; the row_dict has {sorted(row)}; schema '
                          f'{unischema._name} has {list(unischema.fields)})')
    extra = set(row) - set(unischema.fields)
    if extra:
        raise SchemaError(f'Dictionary fields {sorted(row)} do not match schema fields {list(unischema.fields)}: '
                          f'unexpected {sorted(extra)} (not fields of schema {unischema._name})')
