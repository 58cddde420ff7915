"""Delta tables on gs:// and abfs:// (fake-gcs-server, Azurite): delta-rs reads the log through its own clients with
the reader's ``storage_options`` translated (the emulator's endpoint, anonymous access), our readers the files.

Every row of each version once, a version pinned by number, a missing table and a missing version named by URL.
On Azurite delta-rs writes the table itself. fake-gcs-server (1.54) has no XML API upload (``PUT /bucket/object``
answers "invalid uploadType"), which delta-rs's GCS writes use: there delta-rs writes the table to a local directory
and its files are copied to the emulator as they are; the reads are delta-rs's own, through the emulator.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.errors import PetastormMetadataError, TableVersionError
from petastorm.fs import resolve_url
from petastorm.fs.settings import delta_storage_options
from support.tables_util import reader_rows, rows_of_table

deltalake = pytest.importorskip('deltalake')

pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings('ignore:Please use make_reader')]


def _rows(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({'id': ids, 'part': [f'p{i % 3}' for i in ids]})


def _table_versions(cloud, url: str, tmp_path) -> list[list[tuple]]:
    """Version 0 (a partitioned table) and 1 (one partition replaced) of a table at ``url``; each version's rows.

    Two versions only: delta-rs 1.6 fails a third commit on Azurite ("Invalid table version: 1").
    """
    local = cloud.name == 'gcs'
    target = str(tmp_path / 'table') if local else url
    options = None if local else delta_storage_options(url, cloud.options())
    deltalake.write_deltalake(target, _rows(0, 60), partition_by=['part'], storage_options=options)
    # the files of the replaced partition are removed by the log: they must not be read
    replacement = _rows(100, 106).filter(pc.equal(_rows(100, 106)['part'], 'p1'))
    deltalake.write_deltalake(target, replacement, partition_by=['part'], mode='overwrite', predicate="part = 'p1'",
                              storage_options=options)
    if local:
        filesystem, path = resolve_url(url, cloud.options())
        pafs.copy_files(target, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)
    return [rows_of_table(pa.table(deltalake.DeltaTable(target, version=version, storage_options=options)
                                   .to_pyarrow_table()), ['id', 'part']) for version in range(2)]


def test_a_delta_table_reads_every_row_of_each_version_once(cloud, tmp_path):
    url = cloud.url()
    expected = _table_versions(cloud, url, tmp_path)
    # delta-rs itself reaches the emulator with the reader's options translated
    assert deltalake.DeltaTable(url, storage_options=delta_storage_options(url, cloud.options())).version() == 1
    with make_batch_reader(url, storage_options=cloud.options(), reader_pool_type='thread',
                           workers_count=2) as reader:
        assert reader.dataset.version.version == 1
        assert reader_rows(reader, ['id', 'part']) == expected[1]
    with make_batch_reader(url, storage_options=cloud.options(), table_version=0,
                           reader_pool_type='dummy') as reader:
        assert reader_rows(reader, ['id', 'part']) == expected[0]
    with make_reader(url, storage_options=cloud.options(), table_version=0, reader_pool_type='dummy') as rows:
        assert sorted(((int(row.id), str(row.part)) for row in rows), key=repr) == expected[0]
    assert len(expected[0]) == 60
    assert sorted(i for i, _ in expected[1]) == [i for i in range(60) if i % 3 != 1] + [100, 103]


def test_a_missing_table_or_version_is_an_error_naming_the_url(cloud, tmp_path):
    url = cloud.url()
    with pytest.raises(PetastormMetadataError, match=f'{url}/none is not a table'):
        make_batch_reader(f'{url}/none', storage_options=cloud.options(), table_format='delta')
    _table_versions(cloud, url, tmp_path)
    with pytest.raises(TableVersionError, match=f'the Delta table {url} has no version 9: its versions go up to 1'):
        make_batch_reader(url, storage_options=cloud.options(), table_version=9)
