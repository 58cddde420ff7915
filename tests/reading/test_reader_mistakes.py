"""Reader mistakes that used to pass silently, and messages that say what to do."""

import pathlib
import re

import numpy as np
import pytest

from petastorm import TransformSpec, make_batch_reader, make_reader
from support.feature_store import ROWS, rows_of, write_feature_store


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_feature_store(tmp_path_factory.mktemp('features'))


def _bad_frame_transform(frame):
    return frame.assign(unexpected=1)


# -- mistakes that used to pass silently, and messages that say what to do --------------------------------------


def test_schema_fields_that_match_nothing_are_named_with_the_available_fields(url):
    with pytest.warns(UserWarning, match=r"schema_fields \['nope', 'ma.x'\] match no field.*id, id2, name"):
        rows = rows_of(make_reader(url, schema_fields=['id', 'nope', 'ma.x'], reader_pool_type='dummy'))
    assert rows[0]._fields == ('id',)
    with pytest.raises(RuntimeError, match=r"No fields matching the criteria.*The dataset's fields: id, id2"):
        make_reader(url, schema_fields=['nope'])


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_schema_fields_as_a_bare_string_says_what_it_got(url, factory):
    with pytest.raises(ValueError, match=r"Fields must be either None.*got str 'id'.*schema_fields=\['id'\]"):
        factory(url, schema_fields='id')


def _transform_returning(value):
    def transform(row):
        return value
    return transform


@pytest.mark.parametrize('value', ['x', None, [1, 2]])
def test_a_row_transform_must_return_a_dict(url, value):
    from petastorm.transform import TransformResultError

    reader = make_reader(url, transform_spec=TransformSpec(_transform_returning(value)), reader_pool_type='dummy')
    with reader, pytest.raises(TransformResultError, match=r'function .*transform .*must return a dict') as caught:
        next(reader)
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, ValueError)


def _id_as_text(row):
    row['id'] = 'x'
    return row


def _name_as_number(row):
    row['name'] = len(row['name'])
    return row


def test_a_row_transform_returning_text_for_a_number_field_is_refused(url):
    reader = make_reader(url, transform_spec=TransformSpec(_id_as_text), reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match=r"_id_as_text .*returned str 'x' for field 'id'.*int32.*edit_fields"):
        next(reader)
    # Declared, the same change is the user's choice.
    spec = TransformSpec(_id_as_text, edit_fields=[('id', np.str_, (), False)])
    assert {r.id for r in rows_of(make_reader(url, transform_spec=spec, reader_pool_type='dummy'))} == {'x'}
    # Text turned into numbers without being declared stays allowed, as in the original.
    rows = rows_of(make_reader(url, transform_spec=TransformSpec(_name_as_number), reader_pool_type='dummy'))
    assert {int(r.name) for r in rows} == {2, 3}


def _declared_wrong(row):
    row['doubled'] = row['matrix'].ravel()
    row['label'] = 3
    return row


def _declared_float_for_int(row):
    row['doubled'] = float(row['id'])  # numbers stand in for each other (int declared, float64 returned)
    row['label'] = 'l'
    return row


def test_declared_edit_fields_are_checked_for_kind_and_shape(url):
    spec = TransformSpec(_declared_wrong, edit_fields=[('doubled', np.float64, (3, 2), False),
                                                       ('label', np.str_, (), False)])
    reader = make_reader(url, transform_spec=spec, reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match=r"shape \(6,\) for field 'doubled'.*declare with shape \(3, 2\)"):
        next(reader)
    spec = TransformSpec(_declared_wrong, edit_fields=[('doubled', np.float64, (None,), False),
                                                       ('label', np.str_, (), False)])
    reader = make_reader(url, transform_spec=spec, reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match=r"int 3 for field 'label'.*declares str_ values"):
        next(reader)
    spec = TransformSpec(_declared_float_for_int, edit_fields=[('doubled', np.int32, (), False),
                                                               ('label', np.str_, (), False)])
    assert len(rows_of(make_reader(url, transform_spec=spec, reader_pool_type='dummy'))) == ROWS


def _drops_name(row):
    del row['name']
    return row


def test_a_row_transform_missing_a_field_names_the_function_and_removed_fields(url):
    reader = make_reader(url, transform_spec=TransformSpec(_drops_name), reader_pool_type='thread', workers_count=1)
    with reader, pytest.raises(ValueError, match=r"_drops_name .*without field 'name'.*removed_fields"):
        list(reader)


def _none_after_the_first_row(row):
    return row if row['id'] % 2 == 0 else None


def test_a_later_row_unlike_the_first_is_named(url):
    reader = make_reader(url, transform_spec=TransformSpec(_none_after_the_first_row), reader_pool_type='dummy',
                         shuffle_row_groups=False)
    with reader, pytest.raises(TypeError, match=r'_none_after_the_first_row .*must return a dict.*row 1 of'):
        list(reader)


def _frame_with_text_ids(frame):
    return frame.assign(id='x')


def _frame_with_string_lists(frame):
    return frame.assign(matrix=[['a', 'b']] * len(frame))


def _frame_returning(value):
    def frame_transform(frame):
        return value
    return frame_transform


def test_batch_transforms_are_checked_like_row_transforms(url):
    reader = make_batch_reader(url, transform_spec=TransformSpec(_frame_with_text_ids), reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match=r"_frame_with_text_ids .*returned str 'x' for field 'id'"):
        next(reader)
    spec = TransformSpec(_frame_with_string_lists, edit_fields=[('matrix', np.float64, (None,), False)])
    reader = make_batch_reader(url, transform_spec=spec, reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match=r"list \['a', 'b'\] for field 'matrix'.*declares float64"):
        next(reader)
    reader = make_batch_reader(url, transform_spec=TransformSpec(_frame_returning(None)), reader_pool_type='dummy')
    with reader, pytest.raises(TypeError, match=r'must return a pandas DataFrame, got NoneType: .*frame_transform'):
        next(reader)


def _frame_with_a_missing_first_label(frame):
    return frame.assign(label=[np.nan] + ['l'] * (len(frame) - 1))


def test_a_missing_first_value_is_not_judged(url):
    spec = TransformSpec(_frame_with_a_missing_first_label, edit_fields=[('label', np.str_, (), True)])
    batches = rows_of(make_batch_reader(url, transform_spec=spec, reader_pool_type='dummy'))
    assert sum(len(b.label) for b in batches) == ROWS


def test_batch_transform_column_mismatch_names_what_is_missing_and_extra(url):
    reader = make_batch_reader(url, transform_spec=TransformSpec(_bad_frame_transform), reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match=r"do not match required schema columns.*_bad_frame_transform "
                                                 r"\(.*\) returned \['unexpected'\], not declared"):
        next(reader)


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_filters_on_an_unknown_column_name_filters_and_the_columns(url, factory):
    with pytest.raises(ValueError, match=r'filters=\(nope == 1\) name columns .* does not have: nope\. '
                                         r'Its columns: id \(int32\), id2 \(int64\), name \(string\)'):
        factory(url, filters=[('nope', '=', 1)])


@pytest.mark.parametrize(('kwargs', 'message'), [
    # What to do comes first; Petastorm's words (which code matches) follow in parentheses.
    ({'cur_shard': 0, 'shard_count': 0}, r'^shard_count is the number of shards \(an int >= 1\).*'
                                         r'got cur_shard=0, shard_count=0 \(partition and num_partitions must be '
                                         r'ints and both specified to use partitioning\)'),
    ({'num_epochs': 0}, r'^num_epochs must be the number of passes over the data.*None to read forever; got '
                        r'num_epochs=0 \(iterations must be positive integer or None\)'),
])
def test_shard_and_epoch_messages_say_what_the_values_mean(url, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_reader(url, **kwargs)


def test_an_absolute_path_is_its_file_url_and_a_relative_one_is_answered_with_it(url, tmp_path, monkeypatch):
    # pyarrow, pandas, Polars and Hugging Face datasets take a plain absolute path; Petastorm refused it.
    path = url[len('file://'):]
    with make_batch_reader(path, reader_pool_type='dummy') as reader:
        assert sum(len(batch.id) for batch in reader) == ROWS
    with make_reader(path + '/', reader_pool_type='dummy') as reader:
        assert len(list(reader)) == ROWS
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"relative path, which is not supported: pass an absolute path or "
                                                   f"a URL, for the local filesystem 'file://{tmp_path}/relative/ds'")):
        make_batch_reader('relative/ds')


def test_a_filesystem_given_takes_paths_without_a_scheme(url, tmp_path):
    import pyarrow.fs as pafs

    # A bucket-like root: the path is 'bucket/<store>' on that filesystem, as pyarrow and Polars take it.
    root = pathlib.Path(url[len('file://'):]).parent
    bucket = pafs.SubTreeFileSystem(str(root.parent), pafs.LocalFileSystem())
    with make_batch_reader(f'{root.name}/{pathlib.Path(url).name}', filesystem=bucket,
                           reader_pool_type='dummy') as reader:
        assert sum(len(batch.id) for batch in reader) == ROWS
