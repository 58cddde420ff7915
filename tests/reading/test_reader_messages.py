"""What a reader says when it is used the way a newcomer tries first: messages that point at the fix, no advice
where it does not hold, and the URLs people type (a file of a dataset, a glob) read as they mean them."""

import glob
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import TransformSpec, make_batch_reader, make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, ScalarCodec
from petastorm.errors import NoMatchingFieldsError, StorageNotFoundError
from petastorm.metadata.write import write_dataset_metadata
from petastorm.predicates import PredicateError, in_lambda
from petastorm.unischema import Unischema, UnischemaField

Schema = Unischema('MessagesSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('ts', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('ts_tz', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (4, 4, 3), CompressedImageCodec('png'), False),
])
ROWS = 40


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    target = 'file://' + str(tmp_path_factory.mktemp('messages') / 'ds')
    rows = ({'id': i, 'ts': 10 * i, 'ts_tz': 100 * i, 'image': np.full((4, 4, 3), i, np.uint8)} for i in range(ROWS))
    write_dataset(target, Schema, rows, row_group_size_mb=0.0005, file_size_mb=0.001)
    return target


def _files(url):
    return sorted(glob.glob(url[len('file://'):] + '/*.parquet'))


def _ids(reader):
    with reader:
        return sorted(int(i) for item in reader for i in np.atleast_1d(item.id))


# -- schema_fields --------------------------------------------------------------------------------------------

def test_a_field_name_beside_longer_names_does_not_warn(url):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with make_reader(url, schema_fields=['id', 'ts'], reader_pool_type='dummy') as reader:
            assert next(reader)._fields == ('id', 'ts')


def test_warnings_about_schema_fields_name_the_users_line(url):
    for schema_fields, message in ((['id', 'idd'], 'match no field'), (['i', 'ts'], 'behavior has changed')):
        with pytest.warns(UserWarning, match=message) as caught:
            make_batch_reader(url, schema_fields=schema_fields, reader_pool_type='dummy').stop()
        assert [w.filename for w in caught if message in str(w.message)] == [__file__]


def test_schema_fields_matching_nothing_is_a_value_error_and_still_a_runtime_error(url):
    for error in (ValueError, RuntimeError, NoMatchingFieldsError):
        with pytest.raises(error, match="No fields matching the criteria.*The dataset's fields: id, ts, ts_tz"):
            make_reader(url, schema_fields=['idd'])


# -- names ----------------------------------------------------------------------------------------------------

def test_views_of_views_keep_one_suffix(url):
    with make_reader(url, schema_fields=['id', 'ts'], reader_pool_type='dummy') as reader:
        view = reader.schema.create_schema_view(['id'])
        assert (reader.schema._name, view._name, type(next(reader)).__name__) == (
            'MessagesSchema_view', 'MessagesSchema_view', 'MessagesSchema_view')


# -- TransformSpec(selected_fields=...) -----------------------------------------------------------------------

@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_selected_fields_keep_only_them_when_the_function_returns_the_whole_row(url, factory):
    def add_one(row):
        row['ts'] = row['ts'] + 1
        return row

    with factory(url, transform_spec=TransformSpec(add_one, selected_fields=['ts', 'id']),
                 reader_pool_type='dummy') as reader:
        items = list(reader)
    assert items[0]._fields == ('ts', 'id')
    ids = np.concatenate([np.atleast_1d(item.id) for item in items])
    ts = np.concatenate([np.atleast_1d(item.ts) for item in items])
    np.testing.assert_array_equal(ts, ids * 10 + 1)


def test_selected_fields_the_function_left_out_are_named(url):
    spec = TransformSpec(lambda row: {'id': row['id']}, selected_fields=['id', 'ts'])
    with make_reader(url, transform_spec=spec, reader_pool_type='dummy') as reader, \
            pytest.raises(ValueError, match="without field 'ts'.*return every field of selected_fields"):
        next(reader)


# -- make_batch_reader on a Petastorm dataset -----------------------------------------------------------------

def test_make_batch_reader_on_our_dataset_gives_no_advice_it_does_not_need(url):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with make_batch_reader(url, reader_pool_type='dummy') as reader:
            batch = next(reader)
    assert batch.image.shape[1:] == (4, 4, 3)  # decoded, as make_reader would give them


def test_a_row_style_batch_transform_is_told_about_make_reader(url):
    spec = TransformSpec(lambda frame: {'id': 1})
    with make_batch_reader(url, transform_spec=spec, reader_pool_type='dummy') as reader, \
            pytest.raises(TypeError, match='must return a pandas DataFrame.*one row dict at a time, read with '
                                           'make_reader'):
        next(reader)


# -- in_lambda on make_batch_reader ---------------------------------------------------------------------------

@pytest.mark.parametrize('pool', ['dummy', 'thread'])
def test_a_row_style_lambda_on_batches_names_the_predicate_and_the_fix(url, pool):
    predicate = in_lambda(['id'], lambda value: 5 < value < 10)
    with make_batch_reader(url, predicate=predicate, reader_pool_type=pool, workers_count=2) as reader, \
            pytest.raises(PredicateError, match=r"in_lambda\(\['id'\], .*test_reader_messages.py.*once per row "
                                                r'group, with a Series per field.*\(x > 5\) & \(x < 10\).*'
                                                r'make_reader') as caught:
        next(reader)
    assert isinstance(caught.value, ValueError)
    assert 'truth value of a Series is ambiguous' in str(caught.value.__cause__)


def test_an_element_wise_lambda_works_on_batches(url):
    predicate = in_lambda(['id'], lambda value: (value > 5) & (value < 10))
    assert _ids(make_batch_reader(url, predicate=predicate, reader_pool_type='dummy')) == [6, 7, 8, 9]


# -- files of a dataset ---------------------------------------------------------------------------------------

@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_one_file_of_a_dataset_reads_with_the_datasets_schema(url, factory):
    first = _files(url)[0]
    rows_in_file = pq.read_metadata(first).num_rows
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with factory('file://' + first, reader_pool_type='dummy') as reader:
            items = list(reader)
    images = np.concatenate([item.image.reshape(-1, 4, 4, 3) for item in items])
    assert images.dtype == np.uint8
    assert len(images) == rows_in_file


def test_a_list_of_files_of_a_dataset_reads_with_its_schema(url):
    files = _files(url)[:2]
    with make_reader(['file://' + f for f in files], reader_pool_type='dummy') as reader:
        row = next(reader)
    assert row.image.shape == (4, 4, 3)


def test_files_of_a_partitioned_dataset_find_the_dataset_above_the_partitions(tmp_path):
    schema = Unischema('Parted', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField('part', np.str_, (), ScalarCodec(pa.string()), False)])
    table = pa.table({'id': np.arange(20), 'part': [f'p{i % 2}' for i in range(20)]})
    pq.write_to_dataset(table, str(tmp_path), partition_cols=['part'])
    write_dataset_metadata(pafs.LocalFileSystem(), str(tmp_path), schema)
    one = glob.glob(str(tmp_path / 'part=p1' / '*.parquet'))[0]
    with make_reader('file://' + one, reader_pool_type='dummy') as reader:
        rows = list(reader)
    assert sorted(int(r.id) for r in rows) == list(range(1, 20, 2))
    assert {r.part for r in rows} == {'p1'}


def test_a_glob_url_reads_the_files_it_matches(url):
    files = _files(url)
    assert len(files) > 2
    pattern = url + '/' + os.path.basename(files[0])[:-len('.parquet') - 1] + '*.parquet'
    expected = sum(pq.read_metadata(f).num_rows for f in glob.glob(pattern[len('file://'):]))
    assert expected > 0
    with make_reader(pattern, reader_pool_type='dummy') as reader:
        rows = list(reader)
    assert len(rows) == expected
    assert rows[0].image.shape == (4, 4, 3)
    assert _ids(make_batch_reader(url + '/*.parquet', reader_pool_type='dummy')) == list(range(ROWS))


def test_a_glob_that_matches_nothing_says_so(url):
    with pytest.raises(StorageNotFoundError, match=r'no data file matches .*nothing-\*\.parquet'):
        make_batch_reader(url + '/nothing-*.parquet')


def test_row_group_indexes_are_refused_for_some_files_of_a_dataset(url):
    from petastorm.selectors import SingleIndexSelector

    with pytest.raises(ValueError, match='names some files of the dataset.*open the dataset directory'):
        make_reader('file://' + _files(url)[0], rowgroup_selector=SingleIndexSelector('id_index', [1]))


# -- a missing image library ----------------------------------------------------------------------------------

_WITHOUT_IMAGE_LIBRARIES = """
import sys
for name in ('cv2', 'imagecodecs', 'simplejpeg', 'pyspng'):
    sys.modules[name] = None  # as if only the torch extra were installed: importing them fails
import numpy as np
import pyarrow as pa
from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField
schema = Unischema('S', [UnischemaField('image', np.uint8, (4, 4), CompressedImageCodec('png'), False),
                         UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False)])
if sys.argv[1] == 'write':
    write_dataset(sys.argv[2] + '-new', schema, ({'image': np.zeros((4, 4), np.uint8), 'id': i} for i in range(9)))
else:
    with make_reader(sys.argv[2], reader_pool_type='process', workers_count=2) as reader:
        next(reader)
"""


@pytest.mark.parametrize('operation', ['write', 'read'])
def test_a_missing_image_library_is_one_error_at_the_caller_before_workers_start(url, operation):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, '-c', _WITHOUT_IMAGE_LIBRARIES, operation, url], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    error = result.stderr
    doing = {'write': 'encoding', 'read': 'decoding'}[operation]
    assert error.rstrip().splitlines()[-1].startswith('petastorm.errors.MissingDependencyError: CompressedImageCodec '
                                                      f'needs an image library for {doing} png images')
    assert "pip install 'neo-petastorm[image]'" in error
    assert error.count('MissingDependencyError') == 1  # raised once, not chained through a worker's error
    assert 'concurrent/futures' not in error
    assert 'pools' not in error
    assert len(error.splitlines()) < 20
