"""Unischema: one schema that describes a dataset to numpy, Arrow/Parquet, Spark and TensorFlow.

A :class:`Unischema` is an ordered collection of :class:`UnischemaField` s. Each field has a numpy type, a
shape (``None`` marks a dimension that varies from row to row), an optional codec that turns values into
Parquet cells, and a nullability flag::

    HelloWorldSchema = Unischema('HelloWorldSchema', [
        UnischemaField('id', np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png'), False),
    ])

Spark and TensorFlow are imported only by the methods that render to them. The model is layered: native
column types (:mod:`petastorm.typemaps.scalars`), struct types as trees of leaves (:mod:`petastorm.typemaps.structs`)
and codecs sit below this module, with the codecs' side of two of its functions: the field each column of a plain
Parquet file is read as (``petastorm.codecs._inference``, for :func:`infer_unischema`) and a row checked and
encoded for storage (``petastorm.codecs._rows``, exported here as :func:`encode_row`). The TensorFlow dtype table
lives in the TensorFlow adapter, which ``as_tf_dtypes`` and :func:`numpy_to_tf_dtype` call into.
"""

from __future__ import annotations

import decimal
import functools
import re
from collections import OrderedDict, namedtuple
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from petastorm._warnings import warn_user
from petastorm.codecs import ArrowTensorCodec, ScalarCodec
from petastorm.codecs._inference import field_type_of_column, field_type_of_feature, hf_features
from petastorm.codecs._rows import encode_row
from petastorm.errors import SchemaError
from petastorm.typemaps.scalars import native_arrow_type
from petastorm.typemaps.structs import leaf_paths, pruned_struct

__all__ = [
    'Unischema', 'UnischemaField', 'arrow_type_of_field', 'check_storable', 'dict_to_spark_row', 'encode_row',
    'infer_unischema', 'insert_explicit_nulls', 'match_unischema_fields', 'numpy_to_tf_dtype', 'prune_struct_field',
    'struct_leaf_field', 'struct_leaf_paths', 'struct_type_of_field',
]

# 'preserve_input_order' keeps fields as given; 'alphabetical' is the legacy ordering of old Petastorm releases.
_UNISCHEMA_FIELD_ORDER = 'preserve_input_order'


class UnischemaField(NamedTuple):
    """One field of a :class:`Unischema`.

    Equality and hashing use ``(name, numpy_dtype, shape, nullable)`` only: two fields that differ only in
    their codec are the same field, which is how user-given fields are matched against a stored schema.

    Attributes:
        name: column name.
        numpy_dtype: numpy scalar type of the values (``np.int32``, ``np.str_``, ...) or ``decimal.Decimal``.
        shape: tuple of dimensions; ``()`` for scalars, ``None`` entries for dimensions that vary.
        codec: how values are stored in Parquet, or ``None`` for native scalar columns.
        nullable: whether the field may hold ``None``.
    """

    name: str
    numpy_dtype: Any
    shape: tuple[int | None, ...]
    codec: Any = None
    nullable: bool | None = False

    def _key(self) -> tuple:
        return (self.name, self.numpy_dtype, tuple(self.shape), self.nullable)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple) or len(other) < 5:
            return NotImplemented
        return self._key() == (other[0], other[1], tuple(other[2]), other[4])

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash(self._key())


@functools.cache
def _namedtuple_class(type_name: str, field_names: tuple[str, ...]) -> type:
    # Equal views must yield the identical class (tf.data and pickling compare the type itself).
    cls = namedtuple(type_name, field_names)  # type: ignore[misc]
    cls.__repr__ = _row_repr  # type: ignore[method-assign,assignment]
    return cls


def _row_repr(row: tuple) -> str:
    """A row as its values read: ``view(cam='cam0', speed=1.5)``, not numpy 2's ``np.str_('cam0')``."""
    fields = getattr(row, '_fields', ())
    return f'{type(row).__name__}({", ".join(f"{n}={_value_repr(v)}" for n, v in zip(fields, row, strict=True))})'


def _value_repr(value: Any) -> str:
    if isinstance(value, (np.str_, np.bytes_)):
        return repr(value.item())
    if isinstance(value, (np.number, np.bool_)):
        return str(value)  # a float32 with its own shortest digits
    return repr(value)


def _view_name(name: str) -> str:
    """``'<name>_view'``, without piling up suffixes: views of views, and their rows, stay ``'<name>_view'``."""
    return name if name.endswith('_view') else f'{name}_view'


class Unischema:
    """An ordered, named set of :class:`UnischemaField` s.

    Fields are reachable as ``schema.fields['name']`` and as attributes ``schema.<field name>``; the schema's
    own name is ``schema._name`` (as in Petastorm, so that a field may be called ``name``).

    Args:
        name: schema name; namedtuples made from the schema are called ``'<name>_view'`` (one ``_view`` suffix: a
            schema whose name already ends with it names its namedtuples after itself).
        fields: the fields, in order.
    """

    def __init__(self, name: str, fields: Iterable[UnischemaField]) -> None:
        self._name = name
        fields = list(fields)
        if _UNISCHEMA_FIELD_ORDER == 'alphabetical':
            fields = sorted(fields, key=lambda f: f.name)
        seen: dict[str, UnischemaField] = {}
        for field in fields:
            if not isinstance(field, tuple) or len(field) != 5:
                raise SchemaError(f'Unischema {name!r}: expected UnischemaField instances, got {field!r}')
            if field[0] in seen:
                raise SchemaError(f'Unischema {name!r} has two fields named {field[0]!r} ({seen[field[0]]!r} and '
                                  f'{field!r}); field names must be unique')
            seen[field[0]] = field
            if _scalar_codec_with_shape(field):
                warn_user(f'Unischema {name!r}: {_scalar_shape_message(field)}. Such a field cannot be '
                              f'written (as_spark_schema, dict_to_spark_row and write_dataset refuse it)',
                              UserWarning)
        self._fields = OrderedDict((f.name, f) for f in fields)
        for field in self._fields.values():
            if hasattr(type(self), field.name) or field.name in ('_name', '_fields'):
                warn_user(f'Can not create dynamic property {field.name} because it conflicts with an '
                              f'existing property of Unischema', UserWarning)
            else:
                setattr(self, field.name, field)

    @property
    def fields(self) -> OrderedDict[str, UnischemaField]:
        """Fields by name, in schema order."""
        return self._fields

    def __getstate__(self) -> dict:
        return {'name': self._name, 'fields': list(self._fields.values())}

    def __setstate__(self, state: dict) -> None:
        Unischema.__init__(self, state['name'], state['fields'])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Unischema):
            return NotImplemented
        return self._name == other._name and list(self._fields.values()) == list(other._fields.values())

    def __hash__(self) -> int:
        return hash((self._name, tuple(self._fields.values())))

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        lines = [f'Unischema({self._name}, [']
        for f in self._fields.values():
            dtype_name = getattr(f.numpy_dtype, '__name__', str(f.numpy_dtype))
            lines.append(f'  UnischemaField({f.name!r}, {dtype_name}, {tuple(f.shape)}, {f.codec}, {f.nullable}),')
        lines.append('])')
        return '\n'.join(lines)

    __str__ = __repr__

    def create_schema_view(self, fields: Iterable[UnischemaField | str]) -> Unischema:
        """A new schema with a subset of the fields.

        Args:
            fields: :class:`UnischemaField` s of this schema (matched by name) and/or regular expressions that
                must match a whole field name.

        Returns:
            ``Unischema('<name>_view', ...)`` (a view of a view keeps the one suffix): the given fields in the given
            order, then the regex matches in schema order.
        """
        patterns: list[str] = []
        exact: list[UnischemaField] = []
        for item in fields:
            if isinstance(item, str):
                patterns.append(item)
            elif isinstance(item, tuple):
                exact.append(item)
            else:
                raise ValueError('Elements of "fields" must be either a string (regular expressions) or an '
                                 'instance of UnischemaField class.')
        chosen: OrderedDict[str, UnischemaField] = OrderedDict()
        for field in exact:
            stored = self._fields.get(field[0])
            if stored is None:
                raise ValueError(f'field {field} does not belong to the schema {self._name} '
                                 f'(fields: {", ".join(self._fields)})')
            chosen[stored.name] = stored
        for field in match_unischema_fields(self, patterns):
            chosen.setdefault(field.name, field)
        return Unischema(_view_name(self._name), chosen.values())

    def _get_namedtuple(self) -> type:
        return _namedtuple_class(_view_name(self._name), tuple(self._fields))

    def make_namedtuple(self, **kwargs: Any) -> tuple:
        """An instance of the schema's namedtuple class with the given field values."""
        return self._get_namedtuple()(**kwargs)

    def make_namedtuple_tf(self, *args: Any, **kwargs: Any) -> tuple:
        """Same as :meth:`make_namedtuple`, accepting positional values too (used with TensorFlow tensors)."""
        return self._get_namedtuple()(*args, **kwargs)

    def as_pyarrow_schema(self) -> pa.Schema:
        """The Arrow schema of the Parquet columns that store this schema's fields."""
        return pa.schema([pa.field(f.name, arrow_type_of_field(f), nullable=bool(f.nullable))
                          for f in self._fields.values()])

    def as_tf_dtypes(self) -> dict[str, Any]:
        """``{field name: tf.DType}`` (imports TensorFlow); see :func:`numpy_to_tf_dtype`."""
        # The one place (with numpy_to_tf_dtype) where the model calls up into an adapter: the TensorFlow table is
        # the TensorFlow adapter's, and this method is Petastorm's public API.
        from petastorm.tf_utils._dtypes import schema_tf_dtypes

        return schema_tf_dtypes(self)

    def as_numpy_dtypes(self) -> dict[str, np.dtype | Any]:
        """``{field name: numpy dtype}`` (``object`` for ``Decimal`` and for struct and map fields, of type dict)."""
        return {name: np.dtype(object) if f.numpy_dtype in (decimal.Decimal, dict) else np.dtype(f.numpy_dtype)
                for name, f in self._fields.items()}

    def as_spark_schema(self) -> Any:
        """A ``pyspark.sql.types.StructType`` of the stored columns (imports pyspark)."""
        from petastorm._optional import import_optional
        from petastorm.typemaps.spark import spark_type_from_arrow

        types = import_optional('pyspark.sql.types', 'Unischema.as_spark_schema()')
        struct_fields = []
        for f in self._fields.values():
            if f.codec is not None:
                check_storable(f)
                spark_type = f.codec.spark_dtype(f) if _typed_by_field(f.codec) else f.codec.spark_dtype()
            elif tuple(f.shape) == () and f.numpy_dtype is np.bytes_:
                # Petastorm maps np.string_ (numpy 1's name of np.bytes_) to a string column, and schemas written
                # for it use np.string_ for text: keep that column type for Spark.
                spark_type = types.StringType()
            elif tuple(f.shape) == ():
                spark_type = spark_type_from_arrow(arrow_type_of_field(f), types)
            else:
                raise ValueError(f"An instance of non-scalar UnischemaField '{f.name}' has codec set to None. "
                                 f"Don't know how to guess a Spark type for it")
            struct_fields.append(types.StructField(f.name, spark_type, bool(f.nullable)))
        return types.StructType(struct_fields)

    @classmethod
    def from_arrow_schema(cls, parquet_dataset_or_schema: Any, omit_unsupported_fields: bool = True) -> Unischema:
        """Infer a Unischema from an Arrow schema, a ``pyarrow.dataset.Dataset`` or a ParquetDataset.

        Fields get no codec, except Arrow tensor extension columns, which become n-d fields decoded by
        ``ArrowTensorCodec``. Partition columns come first, then file columns in file order. Lists become 1-d
        fields with shape ``(None,)``.

        Args:
            parquet_dataset_or_schema: a ``pyarrow.Schema`` or anything with a ``schema`` attribute holding one.
            omit_unsupported_fields: skip columns of unsupported types with a warning instead of raising.

        Raises:
            ValueError: a column has an unsupported type and ``omit_unsupported_fields`` is False.
        """
        return infer_unischema(parquet_dataset_or_schema, omit_unsupported_fields=omit_unsupported_fields)


def _scalar_codec_with_shape(field: Any) -> bool:
    """True for a ``ScalarCodec`` field of a non-list type whose shape is not ``()``: nothing can store it."""
    codec = field[3]
    if not isinstance(codec, ScalarCodec) or tuple(field[2]) == ():
        return False
    arrow_type = codec.arrow_type()
    return not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
                or pa.types.is_fixed_size_list(arrow_type))


def _scalar_shape_message(field: Any) -> str:
    # The first sentence is the original's write-time message.
    return (f'The shape field of a scalar field {field[0]!r} must be an empty tuple (i.e. \'()\'). Got '
            f'{tuple(field[2])} with {field[3]}: store arrays with NdarrayCodec() (or, for 1-d values, a list '
            f'type such as ScalarCodec(pa.list_(pa.int32())))')


def check_storable(field: UnischemaField) -> None:
    """Refuse, before anything is written, a field that no Parquet column can hold.

    Raises:
        SchemaError: a ``ScalarCodec`` field of a non-list type has a non-empty shape.
    """
    if _scalar_codec_with_shape(field):
        raise SchemaError(_scalar_shape_message(field))


def _typed_by_field(codec: Any) -> bool:
    """Whether the codec's Arrow and Spark types follow the field's dtype and shape (they take the field)."""
    return isinstance(codec, ArrowTensorCodec)


def arrow_type_of_field(field: UnischemaField) -> pa.DataType:
    """The Arrow type of the Parquet column that stores ``field``.

    Raises:
        SchemaError: a ``ScalarCodec`` field of a non-list type has a non-empty shape.
        ValueError: a codec-less field has a numpy type without a native column type, or more than one dimension.
    """
    if field.codec is not None:
        check_storable(field)
        return field.codec.arrow_type(field) if _typed_by_field(field.codec) else field.codec.arrow_type()
    return native_arrow_type(field)


def numpy_to_tf_dtype(numpy_dtype: Any) -> Any:
    """The ``tf.DType`` that carries values of a field's ``numpy_dtype`` (imports TensorFlow).

    Raises:
        ValueError: the type has no TensorFlow counterpart.
        MissingDependencyError: TensorFlow is not installed.
    """
    # Kept here for Petastorm's users; the table belongs to the TensorFlow adapter (see Unischema.as_tf_dtypes).
    from petastorm.tf_utils._dtypes import numpy_to_tf_dtype as adapter_numpy_to_tf_dtype

    return adapter_numpy_to_tf_dtype(numpy_dtype)


def infer_unischema(source: Any, omit_unsupported_fields: bool = True, partitions: dict[str, list[str]] | None = None,
                    name: str = 'inferred_schema') -> Unischema:
    """A Unischema for a plain Parquet store: the partition columns first, then the file columns in file order.

    Fields of scalars and one-level lists get no codec; Arrow tensor extension columns of numbers
    (``arrow.fixed_shape_tensor``, ``arrow.variable_shape_tensor``) become n-d fields decoded by
    ``ArrowTensorCodec``; nested lists, structs, maps, times and decimals carry their Arrow type in a
    ``ScalarCodec`` (see :func:`petastorm.typemaps.scalars.field_type_of_arrow`). Files written by Hugging Face
    ``datasets`` have their features read (:mod:`petastorm.codecs._inference`): images, class labels, n-d arrays.

    Args:
        source: a ``pyarrow.Schema``, or anything with a ``schema`` attribute holding one (a
            ``pyarrow.dataset.Dataset``).
        omit_unsupported_fields: skip unsupported columns with a warning instead of raising ``ValueError``.
        partitions: ``{partition column: values seen}``; a column is int64 when every value parses as an int.
        name: the schema name.

    Raises:
        ValueError: a column has an unsupported type and ``omit_unsupported_fields`` is False.
    """
    schema = source if isinstance(source, pa.Schema) else source.schema
    fields = []
    partitions = partitions or {}
    for column, values in partitions.items():
        is_int = all(_parses_as_int(v) for v in values)
        fields.append(UnischemaField(column, np.int64 if is_int else np.str_, (), None, False))
    features = hf_features(schema)
    for arrow_field in schema:
        if arrow_field.name in partitions:
            continue
        described = field_type_of_feature(features.get(arrow_field.name), arrow_field.type) or \
            field_type_of_column(arrow_field, omit_unsupported_fields)
        if described is not None:
            fields.append(UnischemaField(arrow_field.name, *described, arrow_field.nullable))
    return Unischema(name, fields)


def struct_type_of_field(field: UnischemaField) -> pa.StructType | None:
    """The Arrow struct type of a struct field (its ``ScalarCodec``'s type), or None for any other field."""
    if isinstance(field.codec, ScalarCodec) and pa.types.is_struct(field.codec.arrow_type()):
        return field.codec.arrow_type()
    return None


def struct_leaf_paths(field: UnischemaField) -> list[str]:
    """The dotted Parquet paths of a struct field's leaves (``['st.a', 'st.b.c']``); ``[name]`` for other fields.

    Reading these paths reads exactly the struct's fields its type names, which is how a field selecting some
    leaves of a stored struct reads only them.
    """
    struct = struct_type_of_field(field)
    return (leaf_paths(field.name, struct) or [field.name]) if struct is not None else [field.name]


def struct_leaf_field(schema: Unischema, path: str) -> tuple[UnischemaField, list[str]] | None:
    """The struct field of ``schema`` that a dotted leaf path such as ``'st.a'`` starts with, and the path below it.

    Returns None when no struct field's name starts the path.

    Raises:
        ValueError: the path names a struct field and then something the struct does not hold (the message lists
            what it holds).
    """
    parts = path.split('.')
    for cut in range(len(parts) - 1, 0, -1):
        field = schema.fields.get('.'.join(parts[:cut]))
        struct = struct_type_of_field(field) if field is not None else None
        if field is None or struct is None:
            continue
        below = parts[cut:]
        arrow_type: pa.DataType = struct
        for depth, name in enumerate(below):
            names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)] \
                if pa.types.is_struct(arrow_type) else []
            if name not in names:
                where = '.'.join([field.name, *below[:depth]])
                held = f'its fields: {", ".join(names)}' if names else f'it is a {arrow_type}, not a struct'
                raise ValueError(f'schema_fields names the struct leaf {path!r}, but {where!r} has no field '
                                 f'{name!r} ({held})')
            arrow_type = arrow_type.field(name).type
        return field, below
    return None


def prune_struct_field(field: UnischemaField, leaves: list[list[str]]) -> UnischemaField:
    """``field`` (a struct field) holding only the given leaves (paths below it), in the struct's own order."""
    struct = struct_type_of_field(field)
    assert struct is not None, 'prune_struct_field takes a struct field'
    return field._replace(codec=ScalarCodec(pruned_struct(struct, leaves)))


def _parses_as_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def match_unischema_fields(schema: Unischema, field_regex: Iterable[str] | None) -> list[UnischemaField]:
    """Fields of ``schema`` whose whole name matches any of the regular expressions, in schema order.

    Warns when the old prefix-match rule of early Petastorm releases would have picked a different set, except
    for a pattern that is exactly the name of a field (``'ts'`` beside a ``ts_tz`` field picks ``ts``, as it was
    meant to). The warning names the user's line that led here.
    """
    if not field_regex:
        return []
    patterns = list(field_regex)
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as err:
            raise ValueError(f'schema field pattern {pattern!r} is not a valid regular expression: {err}') from err
    full = [f for f in schema.fields.values() if any(p.fullmatch(f.name) for p in compiled)]
    # A pattern naming a field exactly was meant as that name; only the other patterns changed meaning.
    patterns_changed = [p for p in compiled if p.pattern not in schema.fields]
    prefix = [f for f in schema.fields.values() if any(p.match(f.name) for p in patterns_changed)]
    if not set(prefix) <= set(full):
        changed = sorted({f.name for f in set(prefix) - set(full)})
        warn_user('schema_fields behavior has changed. Now, regular expression pattern must match the entire '
                  f'field name. The change in the behavior affects the following fields: {", ".join(changed)}')
    return full


def insert_explicit_nulls(unischema: Unischema, row_dict: dict) -> None:
    """Add ``None`` (in place) for nullable fields missing from ``row_dict``.

    Raises:
        ValueError: a non-nullable field is missing.
    """
    for name, field in unischema.fields.items():
        if name not in row_dict:
            if field.nullable:
                row_dict[name] = None
            else:
                raise ValueError(f'Field {name} is not found in the row_dict, but is not nullable.')


def dict_to_spark_row(unischema: Unischema, row_dict: Mapping[str, Any]) -> Any:
    """Validate and encode a row dict into a ``pyspark.sql.Row`` whose values follow the schema's field order.

    Raises:
        SchemaError: (a ``ValueError``) a field is missing, unexpected, ``None`` while not nullable, or its value
            has the wrong type or shape.
    """
    assert isinstance(unischema, Unischema), 'dict_to_spark_row expects a Unischema'
    from petastorm._optional import import_optional

    sql = import_optional('pyspark.sql', 'dict_to_spark_row()')
    encoded = encode_row(unischema, row_dict)
    # Row(*names)(*values), not Row(**cells): any column name works, even 'cls' or 'self' (Row.__new__'s own).
    names = list(unischema.fields)
    return sql.Row(*names)(*(encoded[name] for name in names))
