"""Delta tables written by deltalake (delta-rs), read by our readers: exactly the rows of the version asked for.

Every test compares the rows we deliver, as a multiset, with what delta-rs's own reader (``DeltaTable.scan``,
which applies deletion vectors and column mapping) returns for the same version. Deletion vectors are written as
the protocol specifies (delta-rs reads them but does not write them); the tests check delta-rs honours them first.
"""

from __future__ import annotations

import datetime
import json
import os

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_batch_reader
from petastorm.errors import PetastormMetadataError, TableVersionError, UnsupportedTableFeatureError
from petastorm.predicates import in_lambda, in_set

deltalake = pytest.importorskip('deltalake')

from support.tables_util import (  # noqa: E402
    add_deletion_vector,
    commit_actions,
    current_adds,
    delta_rows,
    latest_version,
    reader_rows,
)


def _ids(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({'id': ids, 'value': (ids * 1.5).astype(np.float64), 'label': [f'r{i}' for i in ids]})


@pytest.fixture
def history_table(tmp_path):
    """Two appends of 100 rows, a delete, an update and an overwrite of 10 rows (versions 0-4)."""
    root = str(tmp_path / 'history')
    deltalake.write_deltalake(root, _ids(0, 100))
    deltalake.write_deltalake(root, _ids(100, 200), mode='append')
    deltalake.DeltaTable(root).delete('id < 50')
    deltalake.DeltaTable(root).update(updates={'value': '-1.0'}, predicate='id >= 150')
    deltalake.write_deltalake(root, _ids(1000, 1010), mode='overwrite')
    return root


def _read(url, columns=('id', 'value', 'label'), **kwargs):
    kwargs.setdefault('reader_pool_type', 'dummy')
    with make_batch_reader(url, **kwargs) as reader:
        return reader_rows(reader, columns)


def test_reads_exactly_the_latest_version_not_every_file(history_table):
    url = f'file://{history_table}'
    rows = _read(url)
    assert rows == delta_rows(history_table)
    assert sorted(r[0] for r in rows) == list(range(1000, 1010))
    # Every Parquet file of the directory, read as plain files on request: rows of removed files too.
    plain = _read(url, columns=('id',), table_format='parquet')
    # The rows of every file of every version: the appends', the delete's and update's rewrites, the overwrite's.
    assert len(plain) > 300


def test_plain_store_functions_refuse_a_delta_directory(history_table):
    from petastorm.etl.dataset_metadata import get_schema_from_dataset_url

    with pytest.raises(PetastormMetadataError, match='Delta table'):
        get_schema_from_dataset_url(f'file://{history_table}')


@pytest.mark.parametrize('version', [0, 1, 2, 3, 4])
def test_pinned_versions(history_table, version):
    rows = _read(f'file://{history_table}', table_version=version)
    assert rows == delta_rows(history_table, version)
    if version == 3:  # the update's version: updated values, every row once
        assert sorted(r[0] for r in rows) == list(range(50, 200))
        assert {r[1] for r in rows if r[0] >= 150} == {-1.0}
    with make_batch_reader(f'file://{history_table}', table_version=version) as reader:
        assert reader.dataset.version.version == version


def test_pinned_by_timestamp(history_table):
    table = deltalake.DeltaTable(history_table)
    commits = {c['version']: c['timestamp'] for c in table.history()}
    # A version's time is its commit file's (the protocol's, without in-commit timestamps); its commitInfo may
    # say a few ms earlier on a busy machine. Just after both is in version 1, before version 2.
    written = os.path.getmtime(os.path.join(history_table, '_delta_log', f'{1:020d}.json'))
    when = datetime.datetime.fromtimestamp(max(commits[1] / 1000, written) + 0.0005, datetime.timezone.utc)
    assert _read(f'file://{history_table}', table_version=when) == delta_rows(history_table, 1)
    assert _read(f'file://{history_table}', table_version=when.isoformat()) == delta_rows(history_table, 1)


def test_versions_that_do_not_exist(history_table):
    with pytest.raises(TableVersionError, match='no version 9: its versions go up to 4'):
        make_batch_reader(f'file://{history_table}', table_version=9)
    with pytest.raises(TableVersionError, match='first version was committed'):
        make_batch_reader(f'file://{history_table}', table_version=datetime.datetime(2000, 1, 1))
    with pytest.raises(TableVersionError, match='does not name a version'):
        make_batch_reader(f'file://{history_table}', table_version='latest-ish')
    with pytest.raises(ValueError, match='table_version must be'):
        make_batch_reader(f'file://{history_table}', table_version=1.5)


@pytest.fixture
def dv_table(tmp_path):
    """200 rows in two files, rows deleted from both with deletion vectors (one in a file, one inline)."""
    root = str(tmp_path / 'dv')
    deltalake.write_deltalake(root, _ids(0, 120), configuration={'delta.enableDeletionVectors': 'true'})
    deltalake.write_deltalake(root, _ids(120, 200), mode='append')
    first, second = sorted(current_adds(root), key=lambda p: current_adds(root)[p]['modificationTime'])
    add_deletion_vector(root, first, [0, 1, 5, 50, 119])
    add_deletion_vector(root, second, list(range(10, 30)), inline=True)
    add_deletion_vector(root, first, [0, 1, 5, 50, 119, 60, 61])  # a second vector replaces the first
    return root


def test_deletion_vectors_are_applied(dv_table):
    expected = delta_rows(dv_table)
    ids = sorted(r[0] for r in expected)
    assert len(ids) == 200 - 7 - 20
    assert 60 not in ids
    assert 135 not in ids
    assert 125 in ids
    assert _read(f'file://{dv_table}') == expected
    # Older versions: the vectors of those versions.
    for version in range(latest_version(dv_table) + 1):
        assert _read(f'file://{dv_table}', table_version=version) == delta_rows(dv_table, version)


def test_deletion_vectors_with_many_row_groups(tmp_path):
    root = str(tmp_path / 'groups')
    writer = deltalake.WriterProperties(max_row_group_size=64)
    deltalake.write_deltalake(root, _ids(0, 1000), configuration={'delta.enableDeletionVectors': 'true'},
                              writer_properties=writer)
    (path,) = current_adds(root)
    deleted = list(range(0, 1000, 7)) + list(range(64, 128))  # every 7th row and a whole row group
    add_deletion_vector(root, path, deleted)
    url = f'file://{root}'
    with make_batch_reader(url, reader_pool_type='dummy') as reader:
        assert len(reader.dataset.pieces) == 16
        assert sum(p.num_rows for p in reader.dataset.pieces) == 1000 - len(set(deleted))
        assert reader_rows(reader, ['id', 'value', 'label']) == delta_rows(root)


def test_equal_row_shards_shuffles_and_drop_partitions_over_deletes(dv_table):
    url = f'file://{dv_table}'
    expected = delta_rows(dv_table)
    shards = [_read(url, seed=3, shuffle_rows=True, cur_shard=k, shard_count=3, shard_mode='rows',
                    shard_remainder='drop_last', shuffle_row_drop_partitions=2) for k in range(3)]
    sizes = {len(s) for s in shards}
    assert sizes == {len(expected) // 3}
    union = sorted([row for shard in shards for row in shard], key=repr)
    assert len(set(union)) == len(union)
    assert set(union) <= set(expected)
    assert len(set(expected) - set(union)) == len(expected) % 3


def test_predicates_and_filters_over_deletes(dv_table):
    url = f'file://{dv_table}'
    expected = [r for r in delta_rows(dv_table) if r[0] % 3 == 0]
    assert _read(url, predicate=in_lambda(['id'], lambda i: i % 3 == 0)) == expected
    expected = [r for r in delta_rows(dv_table) if 20 <= r[0] < 140]
    assert _read(url, filters=[('id', '>=', 20), ('id', '<', 140)]) == expected


def test_filters_prune_files_by_statistics(history_table, tmp_path):
    root = str(tmp_path / 'stats')
    for start in range(0, 400, 100):
        deltalake.write_deltalake(root, _ids(start, start + 100), mode='append')
    with make_batch_reader(f'file://{root}', filters=[('id', '>=', 150), ('id', '<', 220)]) as reader:
        assert len(reader.work_items) == 2  # two of the four files may hold such ids
        assert sorted(r[0] for r in reader_rows(reader, ['id'])) == list(range(150, 220))


def test_resume_records_the_version_and_refuses_another(dv_table):
    url = f'file://{dv_table}'
    expected = delta_rows(dv_table)
    with make_batch_reader(url, reader_pool_type='dummy', seed=1, shuffle_rows=True) as reader:
        first = next(reader)
        state = reader.state_dict()
    assert state['table'] == ['delta', latest_version(dv_table)]
    delivered = reader_rows([first], ['id', 'value', 'label'])
    with make_batch_reader(url, reader_pool_type='dummy', seed=1, shuffle_rows=True) as reader:
        reader.load_state_dict(state)
        rest = reader_rows(reader, ['id', 'value', 'label'])
    assert sorted(delivered + rest, key=repr) == expected
    # The table moves on: resuming on the new version is refused, naming both versions, unless asked.
    saved = latest_version(dv_table)
    deltalake.write_deltalake(dv_table, _ids(500, 510), mode='append')
    with make_batch_reader(url, reader_pool_type='dummy', seed=1, shuffle_rows=True) as reader, \
            pytest.raises(ValueError, match=rf'delta table version {saved}.*table_version={saved}'):
        reader.load_state_dict(state)
    with make_batch_reader(url, reader_pool_type='dummy', seed=1, shuffle_rows=True, table_version=saved) as reader:
        reader.load_state_dict(state)
        assert sorted(delivered + reader_rows(reader, ['id', 'value', 'label']), key=repr) == expected
    with make_batch_reader(url, reader_pool_type='dummy', seed=1, shuffle_rows=True,
                           table_version_change='restart_epoch') as reader:
        reader.load_state_dict(state)
        assert reader_rows(reader, ['id', 'value', 'label']) == delta_rows(dv_table)


@pytest.fixture
def partitioned_table(tmp_path):
    root = str(tmp_path / 'partitioned')
    n = 60
    table = pa.table({
        'id': pa.array(range(n), pa.int64()),
        'day': pa.array([datetime.date(2024, 1, 1 + i % 3) for i in range(n)]),
        'group': pa.array([i % 4 if i % 5 else None for i in range(n)], pa.int32()),
        'flag': pa.array([i % 2 == 0 for i in range(n)]),
        'name': pa.array([['a b', 'c/d', 'x=y'][i % 3] for i in range(n)]),
    })
    deltalake.write_deltalake(root, table, partition_by=['day', 'group', 'flag', 'name'])
    return root


def test_partition_values_come_from_the_log_typed(partitioned_table):
    columns = ['id', 'day', 'group', 'flag', 'name']
    with make_batch_reader(f'file://{partitioned_table}', reader_pool_type='dummy') as reader:
        assert set(reader.dataset.partition_names) == {'day', 'group', 'flag', 'name'}
        rows = []
        for batch in reader:
            days = [d.astype('datetime64[D]').item() for d in batch.day]
            # A null partition value is masked, as a null of any nullable column in a batch.
            rows.extend(zip(batch.id.tolist(), days, [None if g is np.ma.masked else int(g) for g in batch.group],
                            [bool(f) for f in batch.flag], [str(n) for n in batch.name], strict=True))
    assert sorted(rows, key=repr) == delta_rows(partitioned_table, columns=columns)


def test_partition_predicates_and_filters_are_decided_when_planning(partitioned_table):
    url = f'file://{partitioned_table}'
    with make_batch_reader(url, predicate=in_set({'x=y'}, 'name'), reader_pool_type='dummy') as reader:
        everything = len(make_batch_reader(url).dataset.pieces)
        assert len(reader.work_items) < everything
        ids = sorted(r[0] for r in reader_rows(reader, ['id']))
    assert ids == [i for i in range(60) if i % 3 == 2]
    with make_batch_reader(url, filters=[('flag', '=', True), ('day', '=', datetime.date(2024, 1, 2))],
                           reader_pool_type='dummy') as reader:
        assert all(dict(reader.dataset.pieces[w.piece_index].partition_keys)['flag'] == 'True'
                   for w in reader.work_items)
        ids = sorted(r[0] for r in reader_rows(reader, ['id']))
    assert ids == [i for i in range(60) if i % 2 == 0 and i % 3 == 1]


def test_column_mapping_with_a_rename(tmp_path):
    root = str(tmp_path / 'mapped')
    config = {'delta.columnMapping.mode': 'name', 'delta.minReaderVersion': '2', 'delta.minWriterVersion': '5'}
    deltalake.write_deltalake(root, _ids(0, 30), configuration=config)
    # Rename `value` to `score` as column mapping allows: a new schema in a metadata action, files untouched.
    with open(os.path.join(root, '_delta_log', f'{0:020d}.json')) as f:
        metadata = next(json.loads(line)['metaData'] for line in f if 'metaData' in json.loads(line))
    schema = json.loads(metadata['schemaString'])
    for field in schema['fields']:
        if field['name'] == 'value':
            field['name'] = 'score'
    metadata['schemaString'] = json.dumps(schema)
    commit_actions(root, [{'metaData': metadata}])
    assert deltalake.DeltaTable(root).schema().fields[1].name == 'score'
    deltalake.write_deltalake(root, _ids(30, 40).rename_columns(['id', 'score', 'label']), mode='append')
    columns = ['id', 'score', 'label']
    with make_batch_reader(f'file://{root}', reader_pool_type='dummy') as reader:
        assert list(reader.schema.fields) == columns
        assert 'columnMapping=name' in reader.dataset.features
        rows = reader_rows(reader, columns)
    assert rows == delta_rows(root, columns=columns)
    assert len(rows) == 40


def test_column_mapping_by_field_id_and_column_selection(tmp_path):
    root = str(tmp_path / 'by-id')
    config = {'delta.columnMapping.mode': 'id', 'delta.minReaderVersion': '2', 'delta.minWriterVersion': '5'}
    deltalake.write_deltalake(root, _ids(0, 25), configuration=config)
    with make_batch_reader(f'file://{root}', schema_fields=['label', 'id'], reader_pool_type='dummy') as reader:
        assert 'columnMapping=id' in reader.dataset.features
        assert list(reader.schema.fields) == ['id', 'label']
        assert reader_rows(reader, ['id', 'label']) == delta_rows(root, columns=['id', 'label'])


def test_a_column_added_later_reads_as_null_in_older_files(tmp_path):
    root = str(tmp_path / 'evolved')
    deltalake.write_deltalake(root, _ids(0, 30))
    extra = _ids(30, 40).append_column('extra', pa.array(np.arange(10, dtype=np.int32)))
    deltalake.write_deltalake(root, extra, mode='append', schema_mode='merge')
    columns = ['id', 'value', 'label', 'extra']
    with make_batch_reader(f'file://{root}', reader_pool_type='dummy') as reader:
        assert list(reader.schema.fields) == columns
        assert reader.schema.fields['extra'].nullable
        rows = reader_rows(reader, columns)
    assert rows == delta_rows(root, columns=columns)
    assert sum(1 for r in rows if r[3] is None) == 30
    # Filters on the new column: older files hold only nulls there and are skipped when planning.
    with make_batch_reader(f'file://{root}', filters=[('extra', '>=', 5)]) as reader:
        assert len(reader.work_items) == 1
        assert sorted(r[0] for r in reader_rows(reader, ['id'])) == list(range(35, 40))
    # A version from before the column was added has no such column.
    with make_batch_reader(f'file://{root}', table_version=0) as reader:
        assert list(reader.schema.fields) == ['id', 'value', 'label']


def test_unsupported_reader_features_are_named(tmp_path):
    root = str(tmp_path / 'future')
    deltalake.write_deltalake(root, _ids(0, 5))
    commit_actions(root, [{'protocol': {'minReaderVersion': 3, 'minWriterVersion': 7,
                                        'readerFeatures': ['someFutureFeature'],
                                        'writerFeatures': ['someFutureFeature']}}])
    with pytest.raises((UnsupportedTableFeatureError, PetastormMetadataError), match='someFutureFeature'):
        make_batch_reader(f'file://{root}')


def test_a_log_that_cannot_be_read(tmp_path):
    root = str(tmp_path / 'broken')
    deltalake.write_deltalake(root, _ids(0, 5))
    with open(os.path.join(root, '_delta_log', f'{1:020d}.json'), 'w') as f:
        f.write('{not json\n')
    with pytest.raises(PetastormMetadataError, match='Delta log'):
        make_batch_reader(f'file://{root}')


def test_make_reader_reads_rows_of_a_table(dv_table):
    from petastorm import make_reader

    with make_reader(f'file://{dv_table}', reader_pool_type='dummy') as reader:  # quietly, as plain Parquet
        ids = sorted(int(row.id) for row in reader)
    assert ids == sorted(r[0] for r in delta_rows(dv_table))


def test_deletion_vectors_of_partitioned_files_with_escaped_names(tmp_path):
    root = str(tmp_path / 'escaped')
    table = pa.table({'id': pa.array(range(20), pa.int64()), 'part': ['a b', 'x=y/%', 'c'] * 6 + ['c', 'c']})
    deltalake.write_deltalake(root, table, partition_by=['part'], configuration={'delta.enableDeletionVectors': 'true'})
    for path in current_adds(root):
        add_deletion_vector(root, path, [0])
    with make_batch_reader(f'file://{root}', reader_pool_type='dummy') as reader:
        assert reader.dataset.deleted_rows == 3
        rows = sorted(((int(i), str(p)) for batch in reader for i, p in zip(batch.id, batch.part, strict=True)),
                      key=repr)
    assert rows == delta_rows(root, columns=['id', 'part'])
    assert len(rows) == 17


# What delta-rs 1.x raises with no credentials in the options or the environment: it asked the metadata endpoint of
# the cloud's machines for some, which refused, before any request reached the storage.
_FOUND_NONE = {
    's3://bucket/table': 'Kernel error -> Generic S3 error\n  Error performing PUT http://169.254.169.254/latest/api/'
                         'token in 4ms - Server returned non-2xx status code\n   403 Forbidden',
    'gs://bucket/table': 'Kernel error -> Generic GCS error\n  Error performing token request\n   Error performing GET '
                         'http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/token in 0.8ms'
                         ' - Server returned non-2xx status code',
}


@pytest.mark.parametrize('url', sorted(_FOUND_NONE))
def test_no_credentials_at_all_is_an_error_naming_the_url_not_a_refusal(url):
    from petastorm.errors import StorageCredentialsError
    from petastorm.tables.delta import _translate_error

    error = _translate_error(OSError(_FOUND_NONE[url]), url, 'latest version')
    assert isinstance(error, StorageCredentialsError)
    assert str(error).startswith(f'no credentials were found for the Delta table {url}')
    assert 'for GCS: token' in str(error)
    refused = _translate_error(OSError('Generic S3 error: 403 Forbidden: InvalidAccessKeyId'), url, 'latest version')
    assert str(refused).startswith(f'the storage refused the credentials for the Delta table {url}')
