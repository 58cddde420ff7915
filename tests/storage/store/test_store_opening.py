"""Opening a store whatever it is: the registry of table formats, how a directory's format is told, and the errors."""

from __future__ import annotations

import inspect
import typing

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm.errors import PetastormMetadataError
from petastorm.etl.dataset_metadata import open_dataset
from petastorm.store.formats import TABLE_FORMAT_REGISTRY, TABLE_FORMATS, TableFormat, is_iceberg_table
from petastorm.store.model import ParquetStore
from petastorm.store.opening import open_any_store
from petastorm.store.plain import PlainStore
from petastorm.tables import TableStore


def _plain_store(root, partitions=('a', 'b')):
    for value in partitions:
        (root / f'part={value}').mkdir(parents=True)
        pq.write_table(pa.table({'id': np.arange(3)}), root / f'part={value}' / 'data.parquet')
    return f'file://{root}'


def _marked_table(root, format_name):
    """A directory holding one data file and the mark of a table format, without a readable log."""
    pq.write_table(pa.table({'id': np.arange(3)}), root / 'data.parquet')
    if format_name == 'delta':
        (root / '_delta_log').mkdir()
    else:
        (root / 'metadata').mkdir()
        (root / 'metadata' / 'v1.metadata.json').write_text('{}')
    return f'file://{root}'


def test_the_table_formats_are_the_registry_s_between_auto_and_parquet():
    assert ('auto', *(entry.name for entry in TABLE_FORMAT_REGISTRY), 'parquet') == TABLE_FORMATS
    assert typing.get_args(TableFormat) == TABLE_FORMATS


@pytest.mark.parametrize('entry', TABLE_FORMAT_REGISTRY, ids=lambda entry: entry.name)
def test_every_format_names_functions_that_take_what_the_registry_passes(entry):
    openers = [entry.opener()] + ([entry.opener(of_object=True)] if entry.opens_objects else [])
    for opener in openers:
        # As open_any_store calls them: the source, then everything by name.
        inspect.signature(opener).bind('source', version=1, storage_options={}, filesystem=None)


def test_the_kinds_of_store_answer_the_whole_interface():
    for kind in (PlainStore, TableStore):
        assert not kind.__abstractmethods__, kind
    with pytest.raises(TypeError, match='abstract'):
        ParquetStore(None, 'url', None, ())  # type: ignore[abstract]


def test_a_plain_directory_opens_as_a_plain_store_with_its_hive_partitions(tmp_path):
    store = open_any_store(_plain_store(tmp_path))
    assert isinstance(store, PlainStore)
    assert store.partition_names == ['part']
    assert store.version_key() is None
    assert store.describe_version() is None
    pieces = store.row_groups()
    assert [piece.partition_values(_schema(store)) for piece in pieces] == [{'part': 'a'}, {'part': 'b'}]


def _schema(store):
    from petastorm.metadata.schemas import inferred_schema

    return inferred_schema(store)


@pytest.mark.parametrize(('format_name', 'title'), [('delta', 'a Delta'), ('iceberg', 'an Iceberg')])
def test_a_table_directory_is_refused_as_plain_parquet_by_name(tmp_path, format_name, title):
    url = _marked_table(tmp_path, format_name)
    with pytest.raises(PetastormMetadataError, match=f'is {title} table: its directory also holds files'):
        open_dataset(url)
    assert str(tmp_path / 'data.parquet') in open_any_store(url, table_format='parquet').files


def test_a_table_format_that_is_not_there_is_refused(tmp_path):
    delta = tmp_path / 'delta'
    delta.mkdir()
    with pytest.raises(PetastormMetadataError, match="table_format='iceberg', but .* is a delta table"):
        open_any_store(_marked_table(delta, 'delta'), table_format='iceberg')
    with pytest.raises(PetastormMetadataError, match="table_format='delta', but .* is not a table"):
        open_any_store(_plain_store(tmp_path / 'plain'), table_format='delta')


def test_a_table_version_of_plain_parquet_is_refused(tmp_path):
    url = _plain_store(tmp_path)
    with pytest.raises(ValueError, match=r'table_version=3 needs a table, but .* is not a Delta or Iceberg table'):
        open_any_store(url, table_version=3)
    with pytest.raises(ValueError, match=r'needs a table \(Delta or Iceberg\); .* is read as plain Parquet'):
        open_any_store([f'{url}/part=a/data.parquet'], table_version=3)


def test_a_table_object_of_another_format_than_asked_is_refused():
    table_class = type('Table', (), {'__module__': 'pyiceberg.table'})
    assert is_iceberg_table(table_class())
    assert not is_iceberg_table(object())
    with pytest.raises(ValueError, match="cannot read a pyiceberg table; pass table_format='auto' or 'iceberg'"):
        open_any_store(table_class(), table_format='delta')


def test_a_hugging_face_repository_reads_its_parquet_and_names_its_splits(tmp_path, caplog):
    import logging
    import os

    from petastorm import make_batch_reader

    # As a downloaded dataset repository: a card and git attributes beside data/<split>-NNNNN-of-NNNNN.parquet.
    os.makedirs(tmp_path / 'data')
    (tmp_path / 'README.md').write_text('# a dataset card\n')
    (tmp_path / '.gitattributes').write_text('*.parquet filter=lfs\n')
    pq.write_table(pa.table({'id': list(range(5))}), str(tmp_path / 'data' / 'train-00000-of-00001.parquet'))
    pq.write_table(pa.table({'id': [100, 101]}), str(tmp_path / 'data' / 'validation-00000-of-00001.parquet'))
    url = f'file://{tmp_path}'
    with pytest.warns(UserWarning, match=rf"holds the splits train, validation .*To read one split, pass "
                                         rf"split='train' to the reader, or name its files: "
                                         rf'train: {url}/data/train\*\.parquet, validation: '
                                         rf'{url}/data/validation\*\.parquet'), \
            caplog.at_level(logging.INFO, logger='petastorm.store.listing'), \
            make_batch_reader(url, reader_pool_type='dummy') as reader:
        assert sorted(int(i) for batch in reader for i in batch.id) == [0, 1, 2, 3, 4, 100, 101]
    assert 'the other files beside them are not data and are ignored: README.md' in caplog.text
    with make_batch_reader(f'{url}/data/train*.parquet', reader_pool_type='dummy') as reader:
        assert sorted(int(i) for batch in reader for i in batch.id) == [0, 1, 2, 3, 4]


@pytest.fixture
def hub_repository(tmp_path):
    """A dataset repository as the Hub lays it out: a card, and data/<split>-NNNNN-of-NNNNN.parquet."""
    import os

    os.makedirs(tmp_path / 'data')
    (tmp_path / 'README.md').write_text('# a dataset card\n')
    for name, ids in (('train-00000-of-00002', [0, 1]), ('train-00001-of-00002', [2, 3]),
                      ('validation-00000-of-00001', [100]), ('test-00000-of-00001', [200, 201]),
                      ('extra-00000-of-00001', [300])):
        pq.write_table(pa.table({'id': ids}), str(tmp_path / 'data' / f'{name}.parquet'))
    return f'file://{tmp_path}'


@pytest.mark.parametrize(('split', 'ids'), [('train', [0, 1, 2, 3]), ('validation', [100]), ('val', [100]),
                                            ('test', [200, 201]), ('extra', [300])])
def test_split_reads_the_files_of_one_split(hub_repository, split, ids):
    import warnings

    from petastorm import make_batch_reader, make_reader

    with warnings.catch_warnings():
        warnings.simplefilter('error')  # choosing a split is no mix: no warning
        with make_batch_reader(hub_repository, split=split, reader_pool_type='dummy') as reader:
            assert sorted(int(i) for batch in reader for i in batch.id) == ids
    with make_reader(hub_repository, split=split, reader_pool_type='dummy') as reader:
        assert sorted(int(row.id) for row in reader) == ids


def test_split_of_directories_and_refusals(tmp_path_factory, hub_repository):
    import os

    tmp_path = tmp_path_factory.mktemp('splits')
    from petastorm import make_batch_reader
    from petastorm.errors import StorageNotFoundError

    for split, ids in (('train', [0, 1]), ('dev', [5])):
        os.makedirs(tmp_path / 'by_dir' / split)
        pq.write_table(pa.table({'id': ids}), str(tmp_path / 'by_dir' / split / 'part-0.parquet'))
    with make_batch_reader(f'file://{tmp_path}/by_dir', split='validation', reader_pool_type='dummy') as reader:
        assert [int(i) for batch in reader for i in batch.id] == [5]
    with pytest.raises(StorageNotFoundError, match=r"has no file of the split 'fold3'.*its files are of: extra \(1 "
                                                   r'file\), test \(1 file\), train \(2 files\), validation'):
        make_batch_reader(hub_repository, split='fold3')
    with pytest.raises(ValueError, match="split='train' chooses among the files of a directory"):
        make_batch_reader(f'{hub_repository}/data/train*.parquet', split='train')
    with pytest.raises(ValueError, match="split must be a split's name"):
        make_batch_reader(hub_repository, split=3)


def test_a_store_opened_with_another_process_s_listing_lists_nothing_and_is_the_same_store(tmp_path):
    import pyarrow.fs as pafs

    from petastorm.store.listing import decode_listing, encode_listing, look_at

    for part in ('a', 'b'):
        (tmp_path / f'part={part}').mkdir()
        pq.write_table(pa.table({'id': np.arange(3)}), tmp_path / f'part={part}' / 'data.parquet')
    pq.write_table(pa.table({'id': np.arange(3)}), tmp_path / 'top.parquet')
    looked = []

    def look(filesystem, root):
        looked.append(look_at(filesystem, root))
        return looked[-1]

    opened = open_any_store(str(tmp_path), look=look)
    assert [listing.root for listing in looked] == [str(tmp_path)]
    given = decode_listing(encode_listing(looked[0]))

    def fields(listing):
        return listing.root, listing.seconds, [(info.path, info.type, info.size, info.mtime_ns)
                                               for info in (listing.info, *listing.entries)]

    assert fields(given) == fields(looked[0])
    assert len(given.entries) == 3

    def refuse(filesystem, root):
        raise AssertionError(f'listed {root} again')

    again = open_any_store(str(tmp_path), look=lambda filesystem, root: given if root == given.root else
                           refuse(filesystem, root))
    assert again.files == opened.files
    assert again.file_sizes == opened.file_sizes
    assert again.partition_names == opened.partition_names
    assert isinstance(opened.filesystem, pafs.LocalFileSystem)
