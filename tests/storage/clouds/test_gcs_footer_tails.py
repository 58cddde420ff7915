"""A GCS store of many files read through gcsfs, its footers at once (:mod:`petastorm.store.footer_tails`),
against fake-gcs-server: one ranged read per file, of the generation listed, and no per-file metadata request,
every row once; a store of a few files stays with pyarrow's client; a damaged, vanished, rewritten or oversized
footer is read the usual way, with the usual error naming the URL.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader
from petastorm.errors import CorruptFooterError, DataFileChangedError
from petastorm.fs import resolve_url
from petastorm.fs._handler import TAIL_BYTES
from petastorm.store.footer_tails import TOGETHER_FROM, footer_of_tail
from petastorm.store.footers import store_footers
from petastorm.store.opening import MANY_GCS_FILES, open_any_store

pytestmark = pytest.mark.timeout(180)

FILES = max(TOGETHER_FROM, MANY_GCS_FILES) + 8
ROWS = 10


def _parquet(first: int, columns: int = 1) -> bytes:
    table = pa.table({'id': np.arange(first, first + ROWS), **{f'c{k}': np.zeros(ROWS) for k in range(1, columns)}})
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    return buffer.getvalue().to_pybytes()


def _store(cloud, files: dict[str, bytes]) -> str:
    url = cloud.url()
    filesystem, path = resolve_url(url, cloud.options())
    for name, data in files.items():
        with filesystem.open_output_stream(f'{path}/{name}') as out:
            out.write(data)
    return url


def _many(cloud) -> str:
    return _store(cloud, {f'part-{i:03d}.parquet': _parquet(i * ROWS) for i in range(FILES)})


def _object_reads(cloud) -> tuple[list, list]:
    """The proxy's object reads since its reset: (ranged media downloads, per-object metadata requests)."""
    gets = [r for r in cloud.proxy.requests if r.method == 'GET' and '/o/' in r.path]
    media = [r for r in gets if 'alt=media' in r.path]
    return [r for r in media if r.range], [r for r in gets if 'alt=media' not in r.path]


def test_many_files_are_read_through_gcsfs_their_footers_at_once_in_one_ranged_read_each(fake_gcs):
    url = _many(fake_gcs)
    fake_gcs.proxy.reset()
    store = open_any_store(url, storage_options=fake_gcs.options(through_proxy=True))
    assert isinstance(store.filesystem, pa.fs.PyFileSystem)  # gcsfs, through our handler
    footers = store_footers(store)
    assert sorted(footer.num_rows for footer in footers.values()) == [ROWS] * FILES
    ranged, metadata = _object_reads(fake_gcs)
    # pyarrow's client asks each object's metadata (its generation) and reads its end: 2 requests a file
    assert len(ranged) == FILES, ranged
    assert metadata == []
    assert all(r.range.startswith('bytes=0-') for r in ranged)  # each small file whole
    assert all('generation=' in r.path for r in ranged)  # of the generation listed
    with make_batch_reader(url, storage_options=fake_gcs.options(), reader_pool_type='thread',
                           workers_count=4) as reader:
        ids = [int(i) for batch in reader for i in batch.id]
    assert sorted(ids) == list(range(FILES * ROWS))


def test_a_few_files_are_read_by_pyarrows_client_the_usual_way(fake_gcs):
    url = _store(fake_gcs, {f'part-{i}.parquet': _parquet(i * ROWS) for i in range(3)})
    fake_gcs.proxy.reset()
    store = open_any_store(url, storage_options=fake_gcs.options(through_proxy=True))
    assert isinstance(store.filesystem, pa.fs.GcsFileSystem)
    assert len(store_footers(store)) == 3
    ranged, metadata = _object_reads(fake_gcs)
    assert len(metadata) == 3  # pyarrow's client: each object's metadata, then its end at that generation
    assert len(ranged) == 3
    assert all('generation=' in r.path for r in ranged)


def test_a_damaged_footer_among_many_is_a_corrupt_footer_error_naming_its_url(fake_gcs):
    files = {f'part-{i:03d}.parquet': _parquet(i * ROWS) for i in range(FILES)}
    files['part-007.parquet'] = files['part-007.parquet'][:-20] + b'\0' * 16 + b'PAR1'
    url = _store(fake_gcs, files)
    with pytest.raises(CorruptFooterError) as raised:
        make_batch_reader(url, storage_options=fake_gcs.options())
    assert f'{url}/part-007.parquet' in str(raised.value)


def test_a_file_gone_after_the_listing_is_named_by_the_usual_read(fake_gcs):
    url = _many(fake_gcs)
    store = open_any_store(url, storage_options=fake_gcs.options())
    filesystem, path = resolve_url(url, fake_gcs.options())
    filesystem.delete_file(f'{path}/part-011.parquet')
    with pytest.raises(FileNotFoundError) as raised:
        store_footers(store)
    assert 'part-011.parquet' in str(raised.value)


def test_an_object_rewritten_after_the_listing_is_named_by_the_usual_read(fake_gcs):
    url = _many(fake_gcs)
    store = open_any_store(url, storage_options=fake_gcs.options())
    filesystem, path = resolve_url(url, fake_gcs.options())
    with filesystem.open_output_stream(f'{path}/part-005.parquet') as out:  # the same bytes, another generation
        out.write(_parquet(5 * ROWS))
    with pytest.raises(DataFileChangedError) as raised:
        store_footers(store)
    assert f'{url}/part-005.parquet' in str(raised.value)


def test_a_footer_longer_than_the_tail_read_is_read_the_usual_way(fake_gcs):
    wide = _parquet(0, columns=600)
    length = int.from_bytes(wide[-8:-4], 'little')
    assert length > TAIL_BYTES  # the footer does not fit in the end read at once
    url = _store(fake_gcs, {'part-000.parquet': wide,
                            **{f'part-{i:03d}.parquet': _parquet(i * ROWS) for i in range(1, FILES)}})
    store = open_any_store(url, storage_options=fake_gcs.options())
    footers = store_footers(store)
    assert footers[f'{store.root}/part-000.parquet'].num_columns == 600
    assert f'{store.root}/part-000.parquet' not in store.reads.data_files.known_footers
    assert len(store.reads.data_files.known_footers) == FILES - 1


def test_footer_of_tail_cuts_the_footer_or_refuses():
    data = _parquet(0)
    footer = footer_of_tail(data[-100_000:])
    assert footer is not None
    assert pq.read_metadata(pa.BufferReader(footer)).num_rows == ROWS
    assert footer_of_tail(data[-30:]) is None  # shorter than the footer
    assert footer_of_tail(data[:-4] + b'XXXX') is None  # not Parquet
    assert footer_of_tail(b'PAR1') is None
