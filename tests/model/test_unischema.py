"""Unischema and UnischemaField: identity, views, regex matching, row validation, Arrow types, pickling."""

from __future__ import annotations

import decimal
import pickle
import sys
import warnings

import numpy as np
import pyarrow as pa
import pytest

from petastorm import unischema as unischema_module
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import MissingDependencyError, SchemaError
from petastorm.unischema import (
    Unischema,
    UnischemaField,
    dict_to_spark_row,
    encode_row,
    insert_explicit_nulls,
    match_unischema_fields,
)


@pytest.fixture
def schema() -> Unischema:
    return Unischema('TestSchema', [
        UnischemaField('id', np.int64, (), None, False),
        UnischemaField('id2', np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField('image', np.uint8, (4, 6, 3), CompressedImageCodec('png'), False),
        UnischemaField('matrix', np.float32, (None, 2), NdarrayCodec(), False),
        UnischemaField('label', np.str_, (), ScalarCodec(pa.string()), True),
        UnischemaField('tags', np.int16, (None,), None, True),
    ])


def _good_row() -> dict:
    return {'id': 1, 'id2': np.int32(2), 'image': np.zeros((4, 6, 3), np.uint8),
            'matrix': np.ones((3, 2), np.float32), 'label': 'cat', 'tags': np.array([1, 2], np.int16)}


# --- UnischemaField -------------------------------------------------------------------------------------------

def test_field_equality_and_hash_ignore_codec():
    a = UnischemaField('x', np.uint8, (2, 2), NdarrayCodec(), False)
    b = UnischemaField('x', np.uint8, (2, 2), CompressedNdarrayCodec(), False)
    c = UnischemaField('x', np.uint8, (2, 2), None, False)
    assert a == b == c
    assert (a != b) is False
    assert hash(a) == hash(b) == hash(c)
    assert len({a, b, c}) == 1


@pytest.mark.parametrize('other', [
    UnischemaField('y', np.uint8, (2, 2), None, False),
    UnischemaField('x', np.int8, (2, 2), None, False),
    UnischemaField('x', np.uint8, (2, None), None, False),
    UnischemaField('x', np.uint8, (2, 2), None, True),
])
def test_field_inequality_on_name_dtype_shape_nullable(other):
    field = UnischemaField('x', np.uint8, (2, 2), NdarrayCodec(), False)
    assert field != other
    assert (field == other) is False


def test_field_defaults_and_tuple_nature():
    field = UnischemaField('x', np.float32, (3,))
    assert field.codec is None
    assert field.nullable is False
    assert isinstance(field, tuple)
    assert field == UnischemaField('x', np.float32, [3], None, False)  # shape compared as a tuple


# --- Unischema ------------------------------------------------------------------------------------------------

def test_attribute_access_and_order(schema):
    assert schema.id is schema.fields['id']
    assert schema.image.codec == CompressedImageCodec('png')
    assert list(schema.fields) == ['id', 'id2', 'image', 'matrix', 'label', 'tags']
    assert schema._name == 'TestSchema'
    assert len(schema) == 6


def test_alphabetical_ordering_flag(monkeypatch):
    monkeypatch.setattr(unischema_module, '_UNISCHEMA_FIELD_ORDER', 'alphabetical')
    sorted_schema = Unischema('S', [UnischemaField('b', np.int8, ()), UnischemaField('a', np.int8, ())])
    assert list(sorted_schema.fields) == ['a', 'b']
    assert sorted_schema._get_namedtuple()._fields == ('a', 'b')


def test_field_name_conflicting_with_an_attribute_warns():
    with pytest.warns(UserWarning, match='Can not create dynamic property fields'):
        clashing = Unischema('S', [UnischemaField('fields', np.int8, ())])
    assert 'fields' in clashing.fields
    assert not isinstance(clashing.fields, tuple)  # the property was not replaced by the field


def test_field_called_name_is_an_attribute():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        named = Unischema('People', [UnischemaField('name', np.str_, ())])
    assert named.name is named.fields['name']
    assert named._name == 'People'


def test_non_field_element_rejected():
    with pytest.raises(SchemaError, match='UnischemaField'):
        Unischema('S', ['not a field'])


def test_create_schema_view_with_fields(schema):
    view = schema.create_schema_view([schema.matrix, schema.id])
    assert view._name == 'TestSchema_view'
    assert list(view.fields) == ['matrix', 'id']
    assert view.matrix.codec == NdarrayCodec()


def test_create_schema_view_with_regexes(schema):
    with pytest.warns(UserWarning, match='label'):
        view = schema.create_schema_view(['id.*', 'lab'])
    assert set(view.fields) == {'id', 'id2'}  # 'lab' must match the whole name, so it picks nothing
    mixed = schema.create_schema_view([schema.tags, 'ima.*', 'tags'])
    assert list(mixed.fields) == ['tags', 'image']


def test_create_schema_view_uses_the_stored_field(schema):
    # A field given with another codec is matched by name; the schema's own field (and codec) is kept.
    view = schema.create_schema_view([UnischemaField('matrix', np.float32, (None, 2), None, False)])
    assert view.matrix.codec == NdarrayCodec()


def test_create_schema_view_unknown_field(schema):
    with pytest.raises(ValueError, match='does not belong to the schema'):
        schema.create_schema_view([UnischemaField('nope', np.int8, (), None, False)])


@pytest.mark.parametrize('bad', [42, None, 1.5, {'id'}])
def test_create_schema_view_bad_element(schema, bad):
    with pytest.raises(ValueError, match='Elements of "fields" must be either a string'):
        schema.create_schema_view([bad])


def test_equal_views_share_one_namedtuple_class(schema):
    view_a = schema.create_schema_view([schema.id, schema.label])
    view_b = schema.create_schema_view(['id$', 'label'])
    assert view_a._get_namedtuple() is view_b._get_namedtuple()
    assert view_a._get_namedtuple().__name__ == 'TestSchema_view'  # one suffix, not one per view
    other = schema.create_schema_view([schema.label, schema.id])
    assert other._get_namedtuple() is not view_a._get_namedtuple()
    row = view_a.make_namedtuple(id=1, label='x')
    assert (row.id, row.label) == (1, 'x')
    assert isinstance(row, view_b._get_namedtuple())
    assert view_a.make_namedtuple_tf(3, 'y') == (3, 'y')


# --- match_unischema_fields -------------------------------------------------------------------------------------

def test_match_fields_requires_a_full_match_and_warns_about_the_change(schema):
    with pytest.warns(UserWarning, match='schema_fields behavior has changed') as record:
        matched = match_unischema_fields(schema, ['i', 'label'])
    assert matched == [schema.label]
    assert 'id, id2' in str(record[0].message)
    assert record[0].filename == __file__  # the caller's line, not the package's


def test_a_pattern_naming_a_field_exactly_does_not_warn(schema):
    # 'id' beside 'id2' was a prefix of both under the old rule, but it names the field 'id': nothing changed.
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert match_unischema_fields(schema, ['id']) == [schema.id]


def test_match_fields_no_warning_when_both_rules_agree(schema):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert match_unischema_fields(schema, ['id.*', 'matrix']) == [schema.id, schema.id2, schema.matrix]
        assert match_unischema_fields(schema, []) == []
        assert match_unischema_fields(schema, None) == []


def test_match_fields_in_schema_order(schema):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert match_unischema_fields(schema, ['tags', 'image']) == [schema.image, schema.tags]


def test_match_fields_invalid_regex(schema):
    with pytest.raises(ValueError, match='not a valid regular expression'):
        match_unischema_fields(schema, ['('])


# --- insert_explicit_nulls / encode_row -------------------------------------------------------------------------

def test_insert_explicit_nulls(schema):
    row = _good_row()
    del row['label'], row['tags']
    insert_explicit_nulls(schema, row)
    assert row['label'] is None
    assert row['tags'] is None
    assert row['id'] == 1


def test_insert_explicit_nulls_missing_non_nullable(schema):
    row = _good_row()
    del row['matrix']
    with pytest.raises(ValueError, match='Field matrix is not found in the row_dict, but is not nullable'):
        insert_explicit_nulls(schema, row)


def test_encode_row_good(schema):
    row = _good_row()
    del row['label']  # nullable and missing
    encoded = encode_row(schema, row)
    assert list(encoded) == list(schema.fields)
    assert encoded['label'] is None
    assert encoded['id'] == 1
    assert type(encoded['id']) is int
    assert encoded['tags'] == [1, 2]
    assert np.array_equal(NdarrayCodec().decode(schema.matrix, encoded['matrix']), row['matrix'])
    # The encoded values are exactly what the Arrow schema stores.
    arrow_schema = schema.as_pyarrow_schema()
    table = pa.Table.from_pylist([encoded], schema=arrow_schema)
    assert table.num_rows == 1


@pytest.mark.parametrize(('mutate', 'field', 'message'), [
    (lambda r: r.pop('matrix'), 'matrix', 'missing'),
    (lambda r: r.update(extra=1), 'extra', 'unexpected'),
    (lambda r: r.update(image=None), 'image', 'not nullable'),
    (lambda r: r.update(image=np.zeros((4, 6, 3), np.uint16)), 'image', 'type'),
    (lambda r: r.update(matrix=np.ones((3, 2), np.float64)), 'matrix', 'type'),
    (lambda r: r.update(matrix=np.ones((3, 3), np.float32)), 'matrix', 'dimensions'),
    (lambda r: r.update(image=np.zeros((4, 6), np.uint8)), 'image', 'dimensions'),
    (lambda r: r.update(id='seven'), 'id', 'int64'),
    (lambda r: r.update(id2=np.float32(2.5)), 'id2', ''),
    (lambda r: r.update(label=3), 'label', 'string'),
    (lambda r: r.update(tags=np.array([[1, 2]], np.int16)), 'tags', 'dimensions'),
])
def test_encode_row_errors_name_the_field(schema, mutate, field, message):
    row = _good_row()
    mutate(row)
    with pytest.raises(SchemaError) as info:
        encode_row(schema, row)
    assert field in str(info.value)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)  # callers of the original catch ValueError


def test_encode_row_needs_a_mapping(schema):
    with pytest.raises(SchemaError, match='dict'):
        encode_row(schema, [1, 2, 3])


# --- dict_to_spark_row ------------------------------------------------------------------------------------------

def test_dict_to_spark_row_without_pyspark_names_the_extra(schema, monkeypatch):
    monkeypatch.setitem(sys.modules, 'pyspark', None)
    monkeypatch.setitem(sys.modules, 'pyspark.sql', None)
    with pytest.raises(MissingDependencyError) as info:
        dict_to_spark_row(schema, _good_row())
    assert "petastorm[spark]" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_dict_to_spark_row_requires_a_unischema():
    with pytest.raises(AssertionError):
        dict_to_spark_row({'not': 'a schema'}, {})


def test_dict_to_spark_row_builds_a_row(schema):
    pytest.importorskip('pyspark')
    row = dict_to_spark_row(schema, _good_row())
    assert list(row.asDict()) == list(schema.fields)
    assert row.id == 1
    assert row.label == 'cat'
    bad = _good_row()
    bad['image'] = None
    with pytest.raises(ValueError, match='image'):
        dict_to_spark_row(schema, bad)


# --- Arrow schema, pickling, repr -------------------------------------------------------------------------------

@pytest.mark.parametrize(('dtype', 'arrow_type'), [
    (np.int8, pa.int8()), (np.uint8, pa.int16()), (np.int16, pa.int16()), (np.uint16, pa.int32()),
    (np.int32, pa.int32()), (np.uint32, pa.int64()), (np.int64, pa.int64()), (np.float16, pa.float32()),
    (np.float32, pa.float32()), (np.float64, pa.float64()), (np.bool_, pa.bool_()), (np.str_, pa.string()),
    (np.bytes_, pa.binary()), (np.datetime64, pa.timestamp('us')), (decimal.Decimal, pa.decimal128(38, 18)),
])
def test_as_pyarrow_schema_native_types(dtype, arrow_type):
    schema = Unischema('S', [UnischemaField('scalar', dtype, (), None, True),
                             UnischemaField('vector', dtype, (None,), None, False)])
    arrow_schema = schema.as_pyarrow_schema()
    assert arrow_schema.field('scalar').type == arrow_type
    assert arrow_schema.field('scalar').nullable
    assert arrow_schema.field('vector').type == pa.list_(arrow_type)
    assert not arrow_schema.field('vector').nullable


def test_as_pyarrow_schema_codec_types(schema):
    arrow_schema = schema.as_pyarrow_schema()
    assert arrow_schema.names == list(schema.fields)
    assert arrow_schema.field('image').type == pa.binary()
    assert arrow_schema.field('matrix').type == pa.binary()
    assert arrow_schema.field('id2').type == pa.int32()
    assert arrow_schema.field('label').type == pa.string()


def test_as_pyarrow_schema_rejects_multidim_without_codec():
    schema = Unischema('S', [UnischemaField('m', np.float32, (2, 2), None, False)])
    with pytest.raises(ValueError, match="'m'"):
        schema.as_pyarrow_schema()


def test_pickle_round_trip(schema):
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        restored = pickle.loads(pickle.dumps(schema, protocol=protocol))
        assert restored == schema
        assert list(restored.fields) == list(schema.fields)
        assert [f.codec for f in restored.fields.values()] == [f.codec for f in schema.fields.values()]
        assert restored.image.codec.image_codec == 'png'
        assert restored.matrix is restored.fields['matrix']


class _FixedSchema(Unischema):
    """A user's schema class whose constructor takes no arguments."""

    def __init__(self):
        super().__init__('Fixed', [UnischemaField('id', np.int64, (), None, False)])


def test_pickle_round_trip_of_a_subclass_with_its_own_constructor():
    # Unpickling called self.__init__(name, fields), which a subclass's own constructor does not take (schemas
    # are pickled to process-pool workers).
    restored = pickle.loads(pickle.dumps(_FixedSchema()))
    assert type(restored) is _FixedSchema
    assert restored == _FixedSchema()
    assert restored.id is restored.fields['id']


def test_schema_equality():
    fields = [UnischemaField('a', np.int8, ()), UnischemaField('b', np.int8, ())]
    assert Unischema('S', fields) == Unischema('S', fields)
    assert hash(Unischema('S', fields)) == hash(Unischema('S', fields))
    assert Unischema('S', fields) != Unischema('T', fields)
    assert Unischema('S', fields) != Unischema('S', fields[::-1])


def test_repr_format():
    schema = Unischema('Small', [
        UnischemaField('id', np.int32, (), None, False),
        UnischemaField('image', np.uint8, (2, 3, 3), CompressedImageCodec('png'), True),
        UnischemaField('arr', np.float64, (None,), NdarrayCodec(), False),
    ])
    assert repr(schema) == (
        'Unischema(Small, [\n'
        "  UnischemaField('id', int32, (), None, False),\n"
        "  UnischemaField('image', uint8, (2, 3, 3), CompressedImageCodec('png', 80), True),\n"
        "  UnischemaField('arr', float64, (None,), NdarrayCodec(), False),\n"
        '])')
    assert str(schema) == repr(schema)


def test_tf_and_numpy_dtype_rendering_without_tensorflow():
    import decimal

    from petastorm.tf_utils._dtypes import tf_dtype_name

    assert tf_dtype_name(np.uint8) == 'uint8'
    assert tf_dtype_name(np.str_) == tf_dtype_name(decimal.Decimal) == 'string'
    assert tf_dtype_name(np.datetime64) == 'int64'
    with pytest.raises(ValueError, match='no TensorFlow counterpart'):
        tf_dtype_name(dict)
    schema = Unischema('S', [UnischemaField('a', np.int16, (), None, False),
                             UnischemaField('d', decimal.Decimal, (), None, False)])
    assert schema.as_numpy_dtypes() == {'a': np.dtype(np.int16), 'd': np.dtype(object)}


def test_two_fields_of_one_name_are_refused_when_the_schema_is_built():
    with pytest.raises(SchemaError, match=r"Unischema 'S' has two fields named 'a'.*int32.*int64.*must be unique"):
        Unischema('S', [UnischemaField('a', np.int32, (), None, False), UnischemaField('b', np.int8, (), None, False),
                        UnischemaField('a', np.int64, (), None, False)])
