"""Reader features beyond the contract: field selection, transforms, filters, predicates, warnings, bad options."""

import pathlib
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petastorm.reading.worker
from petastorm import TransformSpec, make_batch_reader, make_reader
from petastorm.columns import ListColumn
from petastorm.predicates import PredicateBase, in_lambda, in_set
from petastorm.transform import edit_field
from petastorm.unischema import UnischemaField
from support.feature_store import ROWS, Schema, rows_of, write_feature_store

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / 'data' / 'legacy_0_13_1'


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_feature_store(tmp_path_factory.mktemp('features'))


def test_schema_fields_by_field_and_by_full_match_regex(url):
    rows = rows_of(make_reader(url, schema_fields=[Schema.id, 'na.*'], reader_pool_type='dummy'))
    assert rows[0]._fields == ('id', 'name')
    assert sorted(int(r.id) for r in rows) == list(range(ROWS))
    assert rows_of(make_reader(url, schema_fields=['id'], reader_pool_type='dummy'))[0]._fields == ('id',)


def test_schema_fields_errors(url):
    with pytest.raises(RuntimeError, match='No fields matching the criteria'):
        make_reader(url, schema_fields=['nothing_matches_this'])
    with pytest.raises(ValueError, match='does not belong to the schema'):
        make_reader(url, schema_fields=[UnischemaField('other', np.int32, (), None, False)])
    with pytest.raises(ValueError, match='Fields must be either None'):
        make_reader(url, schema_fields=5)
    with pytest.raises(ValueError, match='not a valid regular expression'):
        make_reader(url, schema_fields=['(unclosed'])


def test_nullable_scalars_come_back_as_none(url):
    rows = {int(r.id): r for r in rows_of(make_reader(url, reader_pool_type='dummy'))}
    assert rows[3].maybe is None
    assert rows[4].maybe == np.float32(4)
    assert isinstance(rows[4].maybe, np.float32)


def _add_and_remove(row):
    row['doubled'] = row['id'] * 2
    return row


def test_row_transform_edit_and_remove_fields(url):
    spec = TransformSpec(_add_and_remove, edit_fields=[edit_field('doubled', np.int32, (), False)],
                         removed_fields=['matrix', 'maybe'])
    reader = make_reader(url, transform_spec=spec, reader_pool_type='thread', workers_count=2)
    assert list(reader.schema.fields) == ['id', 'id2', 'name', 'doubled']
    rows = rows_of(reader)
    assert rows[0]._fields == ('id', 'id2', 'name', 'doubled')
    assert all(r.doubled == 2 * r.id for r in rows)


def _as_tuple(row):
    return row['matrix'] * 2, row['id']


def test_row_transform_returning_tuples_yields_plain_tuples(url):
    rows = rows_of(make_reader(url, transform_spec=TransformSpec(_as_tuple, removed_fields=['maybe']),
                               reader_pool_type='process', workers_count=2))
    assert len(rows) == ROWS
    for matrix, ident in rows:
        assert type(rows[0]) is tuple
        np.testing.assert_array_equal(matrix, np.full((2, 3), 2 * ident))


def _frame_transform(frame):
    frame['id2'] = frame['id2'] + 1
    return frame.drop(columns=['matrix'])


def test_batch_transform_gets_a_dataframe(url):
    spec = TransformSpec(_frame_transform, removed_fields=['matrix'])
    reader = make_batch_reader(url, transform_spec=spec, reader_pool_type='dummy')
    batches = rows_of(reader)
    assert batches[0]._fields == ('id', 'id2', 'name', 'maybe')
    ids = np.concatenate([b.id for b in batches])
    id2 = np.concatenate([b.id2 for b in batches])
    np.testing.assert_array_equal(id2, ids * 10 + 1)


def _bad_frame_transform(frame):
    return frame.assign(unexpected=1)


def test_batch_transform_column_mismatch_is_reported(url):
    reader = make_batch_reader(url, transform_spec=TransformSpec(_bad_frame_transform), reader_pool_type='dummy')
    with reader, pytest.raises(ValueError, match='do not match required schema columns'):
        list(reader)


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_filters_select_rows_and_skip_row_groups(url, factory):
    all_items = factory(url, reader_pool_type='dummy').diagnostics['work_items_per_epoch']
    reader = factory(url, reader_pool_type='dummy', filters=[('id', '<', 10)])
    assert reader.diagnostics['work_items_per_epoch'] < all_items
    with reader:
        if factory is make_reader:
            ids = sorted(int(r.id) for r in reader)
        else:
            ids = sorted(int(i) for b in reader for i in b.id)
    assert ids == list(range(10))


def test_filters_on_a_hive_partition_column(tmp_path):
    table = pa.table({'x': list(range(20)), 'part': [i % 2 for i in range(20)]})
    pq.write_to_dataset(table, str(tmp_path), partition_cols=['part'])
    url = tmp_path.as_uri()
    with make_batch_reader(url, reader_pool_type='dummy', filters=[('part', '=', 1)]) as reader:
        assert sorted(int(x) for batch in reader for x in batch.x) == list(range(1, 20, 2))
    with make_batch_reader(url, reader_pool_type='dummy', filters=[('part', '=', 0), ('x', '>', 10)]) as reader:
        assert sorted(int(x) for batch in reader for x in batch.x) == [12, 14, 16, 18]


def test_predicate_reads_other_columns_only_for_matching_row_groups(url, monkeypatch):
    calls = []
    original = petastorm.reading.worker._read_columns

    def spy(ctx, piece, names, start, stop, *more):
        calls.append((piece.path, piece.row_group, tuple(names)))
        return original(ctx, piece, names, start, stop, *more)

    monkeypatch.setattr(petastorm.reading.worker, '_read_columns', spy)
    rows = rows_of(make_reader(url, reader_pool_type='dummy', predicate=in_set({5}, 'id')))
    assert [int(r.id) for r in rows] == [5]
    predicate_reads = [c for c in calls if c[2] == ('id',)]
    full_reads = [c for c in calls if 'matrix' in c[2]]
    assert len(predicate_reads) > 1
    assert len(full_reads) == 1, 'only the row group holding id 5 reads the other columns'


def test_vectorized_and_row_predicates_agree(url):
    by_set = rows_of(make_reader(url, reader_pool_type='dummy', predicate=in_set({1, 2, 40}, 'id'),
                                shuffle_row_groups=False))
    by_lambda = rows_of(make_reader(url, reader_pool_type='dummy',
                                    predicate=in_lambda(['id'], lambda v: v in {1, 2, 40}), shuffle_row_groups=False))
    assert [int(r.id) for r in by_set] == [int(r.id) for r in by_lambda] == [1, 2, 40]


class _DataFramePredicate(PredicateBase):
    def get_fields(self):
        return {'id'}

    def do_include(self, values):
        assert isinstance(values, pd.DataFrame)
        return values['id'] % 20 == 0


def test_batch_reader_predicate_receives_a_dataframe(url):
    reader = make_batch_reader(url, reader_pool_type='dummy', predicate=_DataFramePredicate())
    assert sorted(int(i) for b in rows_of(reader) for i in b.id) == [0, 20, 40]


def test_predicate_on_unknown_field_is_rejected(url):
    with pytest.raises(ValueError, match='not fields of the dataset schema'):
        make_reader(url, predicate=in_set({1}, 'nope'))


def test_partition_predicate_prunes_row_groups_before_reading(monkeypatch):
    calls = []
    original = petastorm.reading.worker._read_columns

    def spy(ctx, piece, names, start, stop, *more):
        calls.append(piece.partition_keys)
        return original(ctx, piece, names, start, stop, *more)

    monkeypatch.setattr(petastorm.reading.worker, '_read_columns', spy)
    reader = make_reader('file://' + str(GOLDEN / 'partitioned'), reader_pool_type='dummy',
                         predicate=in_set({'p_1'}, 'partition_key'))
    rows = rows_of(reader)
    assert rows
    assert {r.partition_key for r in rows} == {'p_1'}
    assert set(calls) == {(('partition_key', 'p_1'),)}


def test_batch_reader_reads_a_list_of_file_urls(tmp_path):
    paths = []
    for part in range(3):
        path = tmp_path / f'part-{part}.parquet'
        pq.write_table(pa.table({'id': np.arange(part * 5, part * 5 + 5), 'x': np.ones(5)}), path)
        paths.append('file://' + str(path))
    with make_batch_reader(paths[:2], reader_pool_type='dummy') as reader:
        assert sorted(int(i) for b in reader for i in b.id) == list(range(10))


def test_batch_reader_on_plain_parquet_types(tmp_path):
    table = pa.table({'id': pa.array([1, 2, 3], pa.int64()), 's': ['a', 'bb', 'ccc'],
                      'l': pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32())),
                      'ragged': pa.array([[1], [2, 3], []], pa.list_(pa.int64())),
                      'n': pa.array([1.0, None, 3.0], pa.float64())})
    pq.write_table(table, tmp_path / 'data.parquet')
    with make_batch_reader('file://' + str(tmp_path), reader_pool_type='dummy') as reader:
        batch = next(reader)
    assert batch.s.dtype.kind == 'U'
    assert batch.l.shape == (3, 2)
    assert batch.l.dtype == np.int32
    assert isinstance(batch.ragged, ListColumn)
    assert batch.ragged.values.tolist() == [1, 2, 3]
    assert batch.ragged.offsets.tolist() == [0, 1, 3, 3]
    assert [list(x) for x in batch.ragged] == [[1], [2, 3], []]
    assert isinstance(batch.n, np.ma.MaskedArray)
    assert batch.n.mask.tolist() == [False, True, False]
    assert batch.n[1] is np.ma.masked


def test_one_reader_shared_by_threads_delivers_each_row_once(url):
    seen = []
    lock = threading.Lock()
    with make_reader(url, reader_pool_type='thread', workers_count=3) as reader:
        def consume():
            for row in reader:
                with lock:
                    seen.append(int(row.id))

        threads = [threading.Thread(target=consume) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(seen) == list(range(ROWS))


def test_deprecated_arguments_warn(url):
    with pytest.warns(DeprecationWarning, match='pyarrow_serializer was deprecated'):
        make_reader(url, pyarrow_serialize=True, reader_pool_type='dummy').stop()
    with pytest.warns(UserWarning, match='shard_seed was deprecated'):
        make_reader(url, shard_seed=3, cur_shard=0, shard_count=2, reader_pool_type='dummy').stop()


@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'workers_count': 0}, 'workers_count'),
    ({'reader_pool_type': 'fiber'}, 'Unknown reader_pool_type'),
    ({'num_epochs': 0}, 'num_epochs'),
    ({'num_epochs': -2}, 'num_epochs'),
    ({'cur_shard': 0}, 'partition and num_partitions must be ints'),
    ({'cur_shard': 3, 'shard_count': 3}, 'cur_shard must be in'),
    ({'cache_type': 'memcached'}, 'Unknown cache_type'),
    ({'predicate': lambda row: True}, 'predicate parameter is expected to be derived from PredicateBase'),
    ({'shuffle_row_drop_partitions': 0}, 'shuffle_row_drop_partitions'),
    ({'seed': 'abc'}, 'seed'),
    ({'filters': 5}, 'filters'),
])
def test_bad_options_are_named(url, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_reader(url, **kwargs)


@pytest.mark.parametrize(('target', 'error', 'message'), [
    ('no/scheme', ValueError, 'scheme-less'),
    (None, ValueError, 'must be a string'),
    ([], ValueError, 'must be non-empty'),
    ('file:///definitely/not/here', FileNotFoundError, '/definitely/not/here'),
])
def test_bad_urls_are_named(target, error, message):
    with pytest.raises(error, match=message):
        make_reader(target)


def test_empty_selection_warns(url):
    with pytest.warns(UserWarning, match='No matching data is available'):
        reader = make_reader(url, filters=[('id', '>', 10**6)], reader_pool_type='dummy')
    assert rows_of(reader) == []


class _RefusingFilesystem:
    """Opening any file raises the given error, as a user filesystem without access or connection would."""

    def __init__(self, error):
        self.error = error

    def open_input_file(self, path):
        raise self.error


def _read_from_refusing_filesystem(error):
    from petastorm.store.pieces import RowGroupPiece

    ctx = petastorm.reading.worker.ReadContext(filesystem=_RefusingFilesystem(error), pieces=(), fields=(),
                                     batched_output=True)
    petastorm.reading.worker._read_columns(ctx, RowGroupPiece('part-0.parquet', 0, 10), ['id'], 0, 10)


@pytest.mark.parametrize('error', [PermissionError('access denied'), PermissionError(13, 'Permission denied')])
def test_storage_access_errors_are_not_reported_as_corrupt_data(error):
    from petastorm.errors import CorruptDataError, StoragePermissionError

    with pytest.raises(PermissionError) as caught:
        _read_from_refusing_filesystem(error)
    # what the storage said about access names the file, as our own storage layer says it
    assert isinstance(caught.value, StoragePermissionError)
    assert not isinstance(caught.value, CorruptDataError)
    assert caught.value.__cause__ is error
    assert 'part-0.parquet' in str(caught.value)


def test_a_transient_error_of_a_user_filesystem_is_retried_then_reported_as_a_storage_error():
    from petastorm.errors import CorruptDataError, StorageError

    error = ConnectionResetError(104, 'Connection reset by peer')
    with pytest.raises(StorageError, match='still failed after 3 attempts') as caught:
        _read_from_refusing_filesystem(error)
    assert not isinstance(caught.value, CorruptDataError)
    assert caught.value.__cause__ is error
    assert 'part-0.parquet' in str(caught.value)


def test_errno_less_os_errors_still_mean_corrupt_data():
    from petastorm.errors import CorruptDataError

    # pyarrow reports undecodable Parquet bytes as plain OSErrors without an errno.
    with pytest.raises(CorruptDataError, match='part-0.parquet'):
        _read_from_refusing_filesystem(OSError('Unexpected end of stream'))


PETASTORM_DIAGNOSTICS = ('output_queue_size', 'items_consumed', 'items_produced', 'items_inprocess')


@pytest.mark.parametrize('pool', ['dummy', 'thread', 'process'])
def test_diagnostics_carry_petastorm_names_beside_ours(url, pool):
    with make_reader(url, reader_pool_type=pool, workers_count=1, shuffle_row_groups=False) as reader:
        before = reader.diagnostics
        assert [before[name] for name in PETASTORM_DIAGNOSTICS] == [0, 0, 0, 0]
        next(reader)
        after = reader.diagnostics
        assert after['items_consumed'] == after['items_submitted'] >= 1
        assert after['items_produced'] == after['items_completed'] >= 1
        assert after['items_inprocess'] == after['items_consumed'] - after['items_produced']
        assert after['output_queue_size'] == after['in_flight']
        assert after['kind'] == pool
        assert after['work_items_per_epoch'] > 1


def test_cleanup_cache_prints_as_petastorm_and_the_with_exit_is_quiet(url, tmp_path, capsys, caplog):
    with make_reader(url, reader_pool_type='dummy') as reader:  # the null cache
        next(reader)
        reader.cleanup_cache()
        assert capsys.readouterr().out == 'Cache cleanup complete.\n'
    assert capsys.readouterr().out == ''

    location = tmp_path / 'cache'
    cache_args = {'cache_type': 'local-disk', 'cache_location': str(location), 'cache_size_limit': 10 ** 7,
                  'cache_row_size_estimate': 100}
    reader = make_reader(url, reader_pool_type='thread', workers_count=2, **cache_args)
    next(reader)
    assert location.is_dir()
    reader.cleanup_cache()  # removes the cache by default, as in Petastorm
    assert not location.exists()
    assert capsys.readouterr().out == 'Cache cleanup complete.\n'
    reader.stop()
    reader.join()

    with make_reader(url, reader_pool_type='dummy', **cache_args) as reader:
        next(reader)

        def refuse():
            raise OSError('cache is busy')

        reader.cache.cleanup = refuse
        reader.cleanup_cache()  # printed, not raised
        assert capsys.readouterr().out == 'Error cleaning cache: cache is busy\nCache cleanup complete.\n'
    assert capsys.readouterr().out == ''
    assert 'could not clean up the cache' in caplog.text  # the with exit logs the same failure
    assert location.is_dir()

    with make_reader(url, reader_pool_type='dummy', **cache_args,
                     cache_extra_settings={'cleanup': False}) as reader:
        assert len(list(reader)) == ROWS
        reader.cleanup_cache()
    assert list((location / 'entries').rglob('*.arrow'))  # kept for a later reader
