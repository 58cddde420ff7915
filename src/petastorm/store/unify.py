"""One schema for files whose schemas differ, and each file's table made to fit it.

The files of a store written over time, or by several tools, may not agree: a column is ``int32`` in one file and
``int64`` in another, a column was added later. These are the rules every reader of this package (and every table
format built on it) follows; they are Arrow's own (``pyarrow.unify_schemas`` with ``promote_options='permissive'``):

* a column's type is the one all its files' types promote to: wider integers, integers to floating point,
  ``string`` to ``large_string``, finer time units, ``null`` to anything, lists and structs field by field (a
  struct holds every field any file's struct has); dictionary-encoded columns count as their value type;
* a column is **nullable** when any file's column is nullable or some file does not have it; a column that every
  file has as non-nullable stays non-nullable;
* columns come in the first file's order, then the columns only later files have, in file order;
* a file without a column delivers nulls for it; a file whose column has a narrower type delivers it cast;
* types that do not promote (an integer and a string) are refused with :class:`~petastorm.errors.SchemaError`,
  naming the column and the files of each type.

:func:`unify_file_schemas` applies the rules to the files' schemas; :func:`conform_table` makes one file's table
fit the unified schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from petastorm._compat import is_binary_view, is_string_view
from petastorm.errors import SchemaError

__all__ = ['SchemaChange', 'UnifiedSchema', 'conform_table', 'unify_file_schemas']


@dataclass(frozen=True)
class SchemaChange:
    """How one file's column differs from the unified schema.

    Attributes:
        path: the file.
        column: the column name.
        stored: the file's type of the column, or None when the file does not have it.
        unified: the type the column is read as.
    """

    path: str
    column: str
    stored: pa.DataType | None
    unified: pa.DataType

    def describe(self) -> str:
        """A phrase for messages: ``'x' is missing from a.parquet`` or ``'x' is int32 in a.parquet``."""
        if self.stored is None:
            return f'{self.column!r} is missing from {self.path} (nulls there)'
        return f'{self.column!r} is {self.stored} in {self.path} (read as {self.unified})'


@dataclass(frozen=True)
class UnifiedSchema:
    """The schema of a store's files together, and what differs in each file.

    Attributes:
        schema: the unified Arrow schema (its metadata is the first file's).
        changes: every column of every file that differs from the unified schema.
        file_columns: for each file that differs, the columns it has (to read only those).
    """

    schema: pa.Schema
    changes: tuple[SchemaChange, ...] = ()
    file_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def differs(self) -> bool:
        """True when some file differs from the unified schema."""
        return bool(self.changes)

    def describe(self, limit: int = 6) -> str:
        """The changes as one sentence (the first ``limit`` of them)."""
        shown = [change.describe() for change in self.changes[:limit]]
        more = len(self.changes) - limit
        return '; '.join(shown) + (f'; and {more} more' if more > 0 else '')


def _plain(arrow_type: pa.DataType) -> pa.DataType:
    """Dictionary encoding and string/binary views are how a file stores values (writers differ), not their type."""
    if isinstance(arrow_type, pa.DictionaryType):
        return _plain(arrow_type.value_type)
    if is_string_view(arrow_type):
        return pa.string()
    if is_binary_view(arrow_type):
        return pa.binary()
    if pa.types.is_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(_plain(arrow_type.value_type)))
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(arrow_type.value_field.with_type(_plain(arrow_type.value_type)))
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(_plain(arrow_type.value_type)), arrow_type.list_size)
    if pa.types.is_struct(arrow_type):
        return pa.struct([child.with_type(_plain(child.type)) for child in arrow_type])
    return arrow_type


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(_plain(f.type)) for f in schema], metadata=schema.metadata)


def unify_file_schemas(schemas: Mapping[str, pa.Schema]) -> UnifiedSchema:
    """The unified schema of the files' schemas, by the rules of this module.

    Args:
        schemas: ``{file path: its Arrow schema}``, in file order.

    Raises:
        SchemaError: a column has types in different files that do not promote to one type (the message names the
            column, and the files of each type).
    """
    if not schemas:
        raise SchemaError('no file schemas to unify')
    paths = list(schemas)
    plain = [_plain_schema(schemas[path]) for path in paths]
    first = plain[0]
    if all(schema.equals(first) for schema in plain[1:]):
        return UnifiedSchema(schemas[paths[0]])
    try:
        merged = pa.unify_schemas(plain, promote_options='permissive')
    except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
        raise _unification_error(paths, plain, err) from err
    names_by_file = [set(schema.names) for schema in plain]
    fields = []
    for arrow_field in merged:
        everywhere = all(arrow_field.name in names for names in names_by_file)
        fields.append(arrow_field if everywhere else arrow_field.with_nullable(True))
    unified = pa.schema(fields, metadata=schemas[paths[0]].metadata)
    changes: list[SchemaChange] = []
    file_columns: dict[str, tuple[str, ...]] = {}
    for path, schema in zip(paths, plain, strict=True):
        differs = False
        for arrow_field in unified:
            if arrow_field.name not in schema.names:
                changes.append(SchemaChange(path, arrow_field.name, None, arrow_field.type))
                differs = True
            elif not schema.field(arrow_field.name).type.equals(arrow_field.type):
                changes.append(SchemaChange(path, arrow_field.name, schema.field(arrow_field.name).type,
                                            arrow_field.type))
                differs = True
        if differs:
            file_columns[path] = tuple(schema.names)
    return UnifiedSchema(unified, tuple(changes), file_columns)


def _unification_error(paths: Sequence[str], schemas: Sequence[pa.Schema], err: Exception) -> SchemaError:
    """Name the first column whose types do not promote, and which files hold which type."""
    for name in dict.fromkeys(n for schema in schemas for n in schema.names):
        types: dict[str, list[str]] = {}
        for path, schema in zip(paths, schemas, strict=True):
            if name in schema.names:
                types.setdefault(str(schema.field(name).type), []).append(path)
        if len(types) < 2:
            continue
        try:
            pa.unify_schemas([pa.schema([pa.field(name, schema.field(name).type)]) for schema in schemas
                              if name in schema.names], promote_options='permissive')
        except (pa.ArrowTypeError, pa.ArrowInvalid):
            held = '; '.join(f'{t} in {", ".join(p[:3])}{" ..." if len(p) > 3 else ""}' for t, p in types.items())
            return SchemaError(f'the files disagree on the type of column {name!r}, and the types do not promote to '
                               f'one ({held}); rewrite the files with one type, or read them separately')
    return SchemaError(f'the schemas of the files cannot be unified: {err}')


def conform_table(table: pa.Table, target: pa.Schema, path: str = '') -> pa.Table:
    """``table`` (columns of one file) with the columns of ``target``: cast to its types, nulls where missing.

    Args:
        table: some of the file's columns.
        target: the unified schema of the columns wanted, in output order.
        path: the file, named in errors.

    Raises:
        SchemaError: a column cannot be cast to its unified type (a value out of range).
    """
    columns = []
    for arrow_field in target:
        if arrow_field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, type=arrow_field.type))
            continue
        column = table.column(arrow_field.name)
        if isinstance(column.type, pa.DictionaryType) and not isinstance(arrow_field.type, pa.DictionaryType):
            column = column.cast(column.type.value_type)
        if not column.type.equals(arrow_field.type):
            try:
                column = column.cast(arrow_field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                raise SchemaError(f'column {arrow_field.name!r} of {path or "a file"}: its {column.type} values '
                                  f'cannot be read as {arrow_field.type}, the type of the column in the other '
                                  f'files: {err}') from err
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema(list(target)))
