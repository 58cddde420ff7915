"""Schema lookup, schema inference and row-group enumeration (petastorm.etl.dataset_metadata)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.errors import PetastormMetadataError, StorageError
from petastorm.etl.dataset_metadata import (
    get_schema,
    get_schema_from_dataset_url,
    infer_or_load_unischema,
    load_row_groups,
    open_dataset,
)
from petastorm.fs import path_to_url
from petastorm.store import footers as footers_module
from petastorm.unischema import Unischema, UnischemaField

Schema = Unischema('MetaSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('vector', np.float32, (8,), NdarrayCodec(), False),
])


def _rows(n: int):
    return ({'id': i, 'vector': np.full(8, i, np.float32)} for i in range(n))


@pytest.fixture
def dataset(tmp_path):
    """A dataset of 200 rows in several files of several row groups, written by write_dataset."""
    root = tmp_path / 'dataset'
    result = write_dataset(path_to_url(str(root)), Schema, _rows(200), row_group_size_mb=0.002,
                           file_size_mb=0.006)
    assert len(result.files) > 1
    assert any(len(counts) > 1 for counts in result.row_groups.values())
    return root


def _footer_pieces(root) -> list[tuple[str, int, int]]:
    """(path, row group, rows) from every data file's footer, in sorted path order."""
    out = []
    for path in sorted(str(p) for p in root.rglob('*.parquet')):
        footer = pq.read_metadata(path)
        out.extend((path, i, footer.row_group(i).num_rows) for i in range(footer.num_row_groups))
    return out


def _as_tuples(pieces) -> list[tuple[str, int, int]]:
    return [(p.path, p.row_group, p.num_rows) for p in pieces]


def _forbid_footers(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError('footers were read although the metadata has the row counts')

    # Every read of the data files' footers for their row counts goes through read_footers.
    monkeypatch.setattr(footers_module, 'read_footers', refuse)


def _strip_our_row_group_keys(root) -> None:
    path = str(root / '_common_metadata')
    schema = pq.read_schema(path)
    kept = {k: v for k, v in schema.metadata.items()
            if k not in (b'petastorm.row_groups.json', b'dataset-toolkit.num_row_groups_per_file.v1')}
    pq.write_metadata(schema.with_metadata(kept), path)


# --- get_schema_from_dataset_url --------------------------------------------------------------------------------

def test_get_schema_of_our_dataset(dataset):
    schema = get_schema_from_dataset_url(path_to_url(str(dataset)))
    assert schema == Schema
    assert schema._name == 'MetaSchema'
    assert schema.vector.codec == NdarrayCodec()
    assert get_schema_from_dataset_url(path_to_url(str(dataset)) + '/') == Schema
    assert get_schema(open_dataset(path_to_url(str(dataset)))) == Schema
    assert get_schema(path_to_url(str(dataset))) == Schema


def test_get_schema_of_plain_parquet_store(tmp_path):
    root = tmp_path / 'plain'
    root.mkdir()
    pq.write_table(pa.table({'a': [1, 2]}), str(root / 'part-0.parquet'))
    with pytest.raises(PetastormMetadataError, match='Could not find _common_metadata'):
        get_schema_from_dataset_url(path_to_url(str(root)))


def test_get_schema_without_schema_key(dataset):
    path = str(dataset / '_common_metadata')
    schema = pq.read_schema(path)
    pq.write_metadata(schema.with_metadata({b'other': b'value'}), path)
    with pytest.raises(PetastormMetadataError, match='Could not find the unischema'):
        get_schema_from_dataset_url(path_to_url(str(dataset)))


def test_unreadable_common_metadata(dataset):
    (dataset / '_common_metadata').write_bytes(b'not parquet at all')
    with pytest.raises(PetastormMetadataError, match='_common_metadata'):
        get_schema_from_dataset_url(path_to_url(str(dataset)))


def test_missing_and_scheme_less_urls(tmp_path):
    missing = path_to_url(str(tmp_path / 'nowhere'))
    for call in (get_schema_from_dataset_url, load_row_groups, infer_or_load_unischema):
        with pytest.raises(FileNotFoundError, match='nowhere'):
            call(missing)
        with pytest.raises(ValueError, match='scheme'):
            call('relative/path')


# --- infer_or_load_unischema ------------------------------------------------------------------------------------

def test_infer_or_load_prefers_the_stored_schema(dataset):
    assert infer_or_load_unischema(path_to_url(str(dataset))) == Schema


def _partitioned_store(root, partition_values, values_name='k'):
    table = pa.table({
        'x': pa.array([1, 2, 3], pa.int32()),
        'name': ['a', 'b', 'c'],
        'scores': pa.array([[1.0, 2.0], [3.0], []], pa.list_(pa.float64())),
        'nested': pa.array([{'q': 1}, {'q': 2}, {'q': 3}]),
        'flags': pa.array([[True], [False], [True]], pa.list_(pa.bool_())),
    })
    for value in partition_values:
        directory = root / f'{values_name}={value}'
        directory.mkdir(parents=True)
        pq.write_table(table, str(directory / 'data.parquet'), row_group_size=2)


def test_infer_from_plain_parquet_with_int_partitions(tmp_path):
    root = tmp_path / 'plain'
    _partitioned_store(root, ['1', '20'])
    schema = infer_or_load_unischema(path_to_url(str(root)))
    assert list(schema.fields) == ['k', 'x', 'name', 'scores', 'nested', 'flags']  # partition first
    assert schema.fields['k'] == UnischemaField('k', np.int64, (), None, False)
    assert schema.fields['x'].numpy_dtype is np.int32
    assert schema.fields['name'].numpy_dtype is np.str_
    assert schema.fields['scores'] == UnischemaField('scores', np.float64, (None,), None, True)
    assert schema.fields['flags'].numpy_dtype is np.bool_
    assert all(f.codec is None for name, f in schema.fields.items() if name != 'nested')
    assert schema.fields['nested'].numpy_dtype is dict  # a struct: a dict per row, its Arrow type in the codec
    assert schema.fields['nested'].codec.arrow_type() == pa.struct([('q', pa.int64())])


def test_infer_string_partitions(tmp_path):
    root = tmp_path / 'plain'
    _partitioned_store(root, ['1', 'p_2'])
    schema = infer_or_load_unischema(path_to_url(str(root)))
    assert schema.fields['k'].numpy_dtype is np.str_


def test_infer_never_hides_broken_petastorm_metadata(dataset):
    path = str(dataset / '_common_metadata')
    schema = pq.read_schema(path)
    metadata = dict(schema.metadata)
    metadata[b'petastorm.unischema.json'] = b'{broken'
    pq.write_metadata(schema.with_metadata(metadata), path)
    with pytest.raises(PetastormMetadataError, match='not valid JSON'):
        infer_or_load_unischema(path_to_url(str(dataset)))


# --- load_row_groups --------------------------------------------------------------------------------------------

def test_load_row_groups_from_our_json_map(dataset, monkeypatch):
    _forbid_footers(monkeypatch)
    pieces = load_row_groups(path_to_url(str(dataset)))
    assert _as_tuples(pieces) == _footer_pieces(dataset)
    assert sum(p.num_rows for p in pieces) == 200
    paths = [p.path for p in pieces]
    assert paths == sorted(paths)
    for path in set(paths):
        assert [p.row_group for p in pieces if p.path == path] == list(range(paths.count(path)))


def test_load_row_groups_from_footers(dataset):
    _strip_our_row_group_keys(dataset)
    assert b'petastorm.unischema.json' in pq.read_metadata(str(dataset / '_common_metadata')).metadata
    with pytest.warns(UserWarning, match='deprecated metadata version'):
        pieces = load_row_groups(path_to_url(str(dataset)))
    assert _as_tuples(pieces) == _footer_pieces(dataset)
    assert sum(p.num_rows for p in pieces) == 200


def test_json_map_missing_a_file_falls_back_to_footers(dataset):
    extra = dataset / 'zz-extra.parquet'
    pq.write_table(pa.table({'id': [1, 2, 3], 'vector': [b'', b'', b'']}), str(extra), row_group_size=1)
    pieces = load_row_groups(path_to_url(str(dataset)))
    assert _as_tuples(pieces) == _footer_pieces(dataset)
    assert _as_tuples(pieces)[-3:] == [(str(extra), 0, 1), (str(extra), 1, 1), (str(extra), 2, 1)]


def _write_summary(root, files_and_tables) -> None:
    """A Spark-style ``_metadata`` summary: every file's row groups with paths relative to ``root``."""
    collector = []
    for relative, table in files_and_tables:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, str(path), row_group_size=2, metadata_collector=collector)
        collector[-1].set_file_path(relative)
    pq.write_metadata(files_and_tables[0][1].schema, str(root / '_metadata'), metadata_collector=collector)


def test_load_row_groups_from_summary_metadata(tmp_path, monkeypatch):
    root = tmp_path / 'summary'
    root.mkdir()
    _write_summary(root, [('b.parquet', pa.table({'v': list(range(5))})),
                          ('a.parquet', pa.table({'v': list(range(3))}))])
    expected = _footer_pieces(root)
    _forbid_footers(monkeypatch)
    pieces = load_row_groups(path_to_url(str(root)))
    assert _as_tuples(pieces) == expected
    assert [(os.path.basename(p.path), p.row_group, p.num_rows) for p in pieces] == [
        ('a.parquet', 0, 2), ('a.parquet', 1, 1),
        ('b.parquet', 0, 2), ('b.parquet', 1, 2), ('b.parquet', 2, 1)]


def test_load_row_groups_of_plain_store_with_partitions_and_hidden_files(tmp_path):
    root = tmp_path / 'plain'
    _partitioned_store(root, ['20', '1'])
    (root / '_SUCCESS').write_text('')
    (root / '.hidden').write_text('junk')
    (root / 'k=1' / '.data.parquet.crc').write_text('junk')
    (root / 'k=1' / 'data.parquet.crc').write_text('junk')
    (root / '_temporary').mkdir()
    (root / '_temporary' / 'part.parquet').write_text('junk')
    (root / '.spark-staging').mkdir()
    (root / '.spark-staging' / 'part.parquet').write_text('junk')
    pieces = load_row_groups(path_to_url(str(root)))
    assert [(os.path.relpath(p.path, root), p.row_group, p.num_rows) for p in pieces] == [
        ('k=1/data.parquet', 0, 2), ('k=1/data.parquet', 1, 1),
        ('k=20/data.parquet', 0, 2), ('k=20/data.parquet', 1, 1)]
    assert [p.partition_keys for p in pieces] == [(('k', '1'),)] * 2 + [(('k', '20'),)] * 2
    assert open_dataset(path_to_url(str(root))).partition_names == ['k']


def test_non_parquet_file_is_named(tmp_path):
    root = tmp_path / 'mixed'
    root.mkdir()
    pq.write_table(pa.table({'a': [1]}), str(root / 'part-00000'))  # data files without a .parquet suffix
    (root / 'notes.txt').write_text('hello')
    with pytest.raises(PetastormMetadataError, match='notes.txt'):
        load_row_groups(path_to_url(str(root)))
    (root / 'part-00000').rename(root / 'a.parquet')  # beside *.parquet files, other files are not data
    assert [piece.path.rsplit('/', 1)[-1] for piece in load_row_groups(path_to_url(str(root)))] == ['a.parquet']


def test_list_of_file_urls(dataset):
    files = sorted(str(p) for p in dataset.glob('*.parquet'))
    pieces = load_row_groups([path_to_url(p) for p in files[:2]])
    assert _as_tuples(pieces) == [t for t in _footer_pieces(dataset) if t[0] in files[:2]]


def test_a_directory_in_a_list_of_file_urls_is_named_as_a_directory(dataset):
    # It used to be reported as missing ('does not exist'), which sends the user looking for the wrong mistake.
    first = sorted(str(p) for p in dataset.glob('*.parquet'))[0]
    with pytest.raises(StorageError, match=f'dataset file {dataset} is a directory.*single URL') as info:
        load_row_groups([path_to_url(first), path_to_url(str(dataset))])
    assert not isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, OSError)


def test_single_file_url(dataset):
    first = sorted(str(p) for p in dataset.glob('*.parquet'))[0]
    pieces = load_row_groups(path_to_url(first))
    assert _as_tuples(pieces) == [t for t in _footer_pieces(dataset) if t[0] == first]


def test_future_row_group_format_version(dataset):
    path = str(dataset / '_common_metadata')
    schema = pq.read_schema(path)
    metadata = dict(schema.metadata)
    metadata[b'petastorm.row_groups.json'] = b'{"format_version": 99, "files": {}}'
    pq.write_metadata(schema.with_metadata(metadata), path)
    with pytest.raises(PetastormMetadataError, match='format_version 99'):
        load_row_groups(path_to_url(str(dataset)))


def test_metadata_without_row_group_information_warns_and_reads_footers(tmp_path):
    import pyarrow.fs as pafs

    from petastorm.metadata.write import update_common_metadata
    from petastorm.store import keys

    url = 'file://' + str(tmp_path / 'old')
    write_dataset(url, Schema, _rows(7))
    update_common_metadata(pafs.LocalFileSystem(), str(tmp_path / 'old'),
                           {keys.ROW_GROUPS_JSON_KEY: None, keys.ROW_GROUPS_PER_FILE_KEY: None})
    with pytest.warns(UserWarning, match='deprecated metadata version.*petastorm-generate-metadata.py --dataset_url'):
        pieces = load_row_groups(url)
    assert sum(p.num_rows for p in pieces) == 7
