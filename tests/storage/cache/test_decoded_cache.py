"""The decoded-column cache (cache_type='local-disk-decoded'): its Arrow layouts, its entries, and readers that read
through it giving exactly what they give without it."""

import decimal
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, make_reader, write_dataset
from petastorm.cache import (
    LOCAL_DISK_DECODED_CACHE,
    DecodedRowGroupCache,
    FileStamp,
    LocalDiskCache,
    NullCache,
    RowGroupCache,
    cached_decoded_values,
    decodes_in_cache,
)
from petastorm.cache._layouts import pack_column, unpack_column
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import DecodeFieldError
from petastorm.ngram import NGram
from petastorm.predicates import in_lambda
from petastorm.transform import TransformSpec
from petastorm.unischema import Unischema, UnischemaField
from support.cache_stores import row_group_count
from support.node_ranks import run_ranks_together

ROWS = 60
BENCH = Path(__file__).resolve().parents[3] / 'benchmarks' / 'decoded_cache_bench.py'
LIMIT = 200 << 20
POOLS = ['dummy', 'thread', 'process']
READERS = {'rows': make_reader, 'batches': make_batch_reader}
Schema = Unischema('DecodedCacheSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('image', np.uint8, (8, 12, 3), CompressedImageCodec('png'), False),
    UnischemaField('photo', np.uint8, (None, None, 3), CompressedImageCodec('jpeg', 90), False),
    UnischemaField('vec', np.float32, (4,), NdarrayCodec(), False),
    UnischemaField('ragged', np.int16, (None, 2), NdarrayCodec(), False),
    UnischemaField('maybe', np.float64, (None,), NdarrayCodec(), True),
    UnischemaField('mask', np.bool_, (2, 2), NdarrayCodec(), False),
    UnischemaField('packed', np.float64, (3, 3), CompressedNdarrayCodec(), False),
    UnischemaField('price', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
])
# make_batch_reader on a Petastorm dataset warns as Petastorm does.
pytestmark = pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')


def _row(i):
    rng = np.random.default_rng(i)
    return {
        'id': i,
        'name': f'row{i}' * (1 + i % 3),
        'image': rng.integers(0, 255, (8, 12, 3), dtype=np.uint8),
        # Rows 0-29 share a shape, later rows vary: some row groups stack, others are ragged.
        'photo': rng.integers(0, 255, (8 if i < 30 else 6 + i % 4, 8, 3), dtype=np.uint8),
        'vec': np.full(4, i, dtype=np.float32),
        'ragged': np.full((1 + i % 3, 2), i, dtype=np.int16),
        'maybe': None if i % 7 == 3 else np.arange(i % 4, dtype=np.float64),
        'mask': rng.integers(0, 2, (2, 2)).astype(bool),
        'packed': rng.standard_normal((3, 3)),
        'price': decimal.Decimal(i) / 4,
    }


def _write(path, rows=ROWS):
    url = 'file://' + str(path)
    write_dataset(url, Schema, (_row(i) for i in range(rows)), row_group_size_mb=0.004, file_size_mb=0.02)
    return url


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    target = _write(tmp_path_factory.mktemp('decoded') / 'ds')
    assert row_group_count(target) >= 6, 'these tests need several row groups'
    return target


def _cache_args(location, **extra):
    return {'cache_type': LOCAL_DISK_DECODED_CACHE, 'cache_location': str(location), 'cache_size_limit': LIMIT,
            'cache_row_size_estimate': 1000, 'cache_extra_settings': {'cleanup': False}, **extra}


def _same(left, right, where='value'):
    """Equal values of the same types all the way down: arrays by type, dtype, shape and content."""
    assert type(left) is type(right), (where, type(left), type(right))
    if isinstance(left, np.ndarray):
        assert left.dtype == right.dtype, (where, left.dtype, right.dtype)
        assert left.shape == right.shape, (where, left.shape, right.shape)
        if left.dtype == object:
            for i, (a, b) in enumerate(zip(left, right, strict=True)):
                _same(a, b, f'{where}[{i}]')
        else:
            np.testing.assert_array_equal(left, right, err_msg=where)
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right), where
        for name, a, b in zip(getattr(left, '_fields', range(len(left))), left, right, strict=True):
            _same(a, b, f'{where}.{name}')
    else:
        assert left == right, (where, left, right)


def _items(make, url, **options):
    with make(url, **options) as reader:
        return list(reader)


def _entries(location):
    return sorted(Path(location, 'entries').rglob('*.arrow'))


@pytest.fixture
def decode_calls(monkeypatch):
    """Counts decode_column calls of the codecs the cache decodes, per codec (dummy and thread pools)."""
    calls = []
    for codec in (CompressedImageCodec, NdarrayCodec, CompressedNdarrayCodec):
        original = codec.decode_column

        def counting(self, field, column, original=original):
            calls.append(field.name)
            return original(self, field, column)

        monkeypatch.setattr(codec, 'decode_column', counting)
    return calls


# -- the layouts ------------------------------------------------------------------------------------------------


DENSE = {
    'uint8 images': np.random.default_rng(0).integers(0, 255, (5, 4, 6, 3), dtype=np.uint8),
    'uint16 grey': np.arange(5 * 6, dtype=np.uint16).reshape(5, 2, 3),
    'float16': np.linspace(0, 1, 10, dtype=np.float16).reshape(5, 2),
    'int64 0-d rows': np.arange(5, dtype=np.int64),
    'fortran order': np.asfortranarray(np.arange(30, dtype=np.float32).reshape(5, 6)),
}


@pytest.mark.parametrize('name', list(DENSE))
def test_dense_columns_round_trip_and_select_like_a_stacked_array(name):
    values = DENSE[name]
    packed = pack_column(values)
    assert packed is not None
    _same(unpack_column(packed), np.ascontiguousarray(values))
    picks = np.array([4, 0, 2, 2])
    _same(unpack_column(packed.take(pa.array(picks))), values[picks])
    _same(unpack_column(packed.slice(1, 3)), values[1:4])


def test_a_dense_column_views_the_arrow_buffer():
    values = np.arange(24, dtype=np.int32).reshape(4, 6)
    packed = pack_column(values)
    assert np.shares_memory(unpack_column(packed), values)  # packing a contiguous column copies nothing
    assert np.shares_memory(unpack_column(packed.slice(1, 2)), values)


def _objects(*values):
    """An object column holding ``values`` (arrays stay whole rows, not broadcast into the column)."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def test_ragged_columns_give_each_row_and_stack_a_selection_whose_shapes_agree():
    rows = [np.full((2, 3), 1, np.uint8), np.full((4, 3), 2, np.uint8), np.full((2, 3), 3, np.uint8)]
    packed = pack_column(_objects(*rows))
    assert packed is not None
    back = unpack_column(packed)
    assert back.dtype == object
    for got, want in zip(back, rows, strict=True):
        _same(got, want)
    # Rows 0 and 2 have one shape: as their decoding would, the selection becomes one stacked array.
    _same(unpack_column(packed.take(pa.array([2, 0]))), np.stack([rows[2], rows[0]]))
    _same(unpack_column(packed.slice(1, 1)), rows[1][None])


@pytest.mark.parametrize(('name', 'values'), [
    ('empty', np.empty((0, 3), np.uint8)),
    ('bool', np.zeros((3, 2), bool)),
    ('strings', np.array(['a', 'bc'])),
    ('datetimes', np.array(['2020-01-01'], dtype='datetime64[D]')),
    ('big endian', np.arange(3, dtype='>i4')),
    ('complex', np.zeros(2, np.complex64)),
    ('zero-size rows', np.empty((3, 0), np.float32)),
    ('a None', _objects(np.zeros(2, np.uint8), None)),
    ('mixed dtypes', _objects(np.zeros(2, np.uint8), np.zeros(3, np.int16))),
    ('mixed ndim', _objects(np.zeros(2, np.uint8), np.zeros((3, 1), np.uint8))),
    ('decimals', _objects(decimal.Decimal(1), decimal.Decimal(2))),
    ('arrays of objects', _objects(np.array(['x'], object), np.array(['y', 'z'], object))),
])
def test_values_without_a_layout_are_not_packed(name, values):
    assert pack_column(values) is None, name


def test_an_empty_selection_decodes_as_the_codec_decodes_no_rows():
    field = Schema.fields['image']
    payloads = pa.array([field.codec.encode(field, np.zeros((8, 12, 3), np.uint8))] * 3, type=pa.binary())
    packed = pack_column(field.codec.decode_column(field, payloads))
    got = cached_decoded_values(field, packed.take(pa.array([], type=pa.int64())))
    _same(got, field.codec.decode_column(field, payloads.take(pa.array([], type=pa.int64()))))
    assert cached_decoded_values(field, payloads) is None  # a stored column is the codec's to decode
    assert cached_decoded_values(Schema.fields['id'], pa.array([1, 2])) is None  # not a decoded field


def test_which_fields_the_cache_decodes():
    assert [name for name, field in Schema.fields.items() if decodes_in_cache(field)] == [
        'image', 'photo', 'vec', 'ragged', 'maybe', 'mask', 'packed']


# -- keys and entries -------------------------------------------------------------------------------------------


def test_keys_name_the_decoding_of_every_decoded_column():
    stamps = {'/ds/a.parquet': FileStamp(10, 1)}
    fields = {'image': Schema.fields['image'], 'vec': Schema.fields['vec']}
    cache = DecodedRowGroupCache(NullCache(), 'file:///ds', stamps, fields)
    key = cache.key('/ds/a.parquet', 0, ['id', 'image'])
    assert key == cache.key('/ds/a.parquet', 0, ['image', 'id'])
    assert key != cache.key('/ds/a.parquet', 0, ['id', 'image', 'vec'])
    assert key != cache.key('/ds/a.parquet', 1, ['id', 'image'])
    assert key != RowGroupCache(NullCache(), 'file:///ds', stamps).key('/ds/a.parquet', 0, ['id', 'image'])
    jpeg = {**fields, 'image': UnischemaField('image', np.uint8, (8, 12, 3), CompressedImageCodec('jpeg'), False)}
    assert key != DecodedRowGroupCache(NullCache(), 'file:///ds', stamps, jpeg).key('/ds/a.parquet', 0,
                                                                                   ['id', 'image'])
    wider = {**fields, 'image': UnischemaField('image', np.uint8, (8, None, 3), CompressedImageCodec('png'), False)}
    assert key != DecodedRowGroupCache(NullCache(), 'file:///ds', stamps, wider).key('/ds/a.parquet', 0,
                                                                                    ['id', 'image'])
    rewritten = DecodedRowGroupCache(NullCache(), 'file:///ds', {'/ds/a.parquet': FileStamp(10, 2)}, fields)
    assert key != rewritten.key('/ds/a.parquet', 0, ['id', 'image'])
    assert json.loads(key)[0] == 'petastorm-decoded-row-group-1'


def test_entries_hold_decoded_layouts_and_stored_columns_where_there_is_none(url, tmp_path):
    _items(make_batch_reader, url, reader_pool_type='dummy', shuffle_row_groups=False, **_cache_args(tmp_path / 'c'))
    entries = _entries(tmp_path / 'c')
    assert len(entries) == row_group_count(url)
    kinds = {}
    for entry in entries:
        assert entry.read_bytes()[:6] == b'ARROW1'  # Arrow IPC files: nothing in the cache is ever unpickled
        schema = pa.ipc.open_file(pa.memory_map(str(entry))).schema
        for field in schema:
            kinds.setdefault(field.name, set()).add(type(field.type).__name__ if isinstance(
                field.type, pa.BaseExtensionType) else str(field.type))
    assert kinds['image'] == {'FixedShapeTensorType'}
    assert kinds['vec'] == {'FixedShapeTensorType'}
    assert kinds['packed'] == {'FixedShapeTensorType'}
    assert kinds['photo'] == {'FixedShapeTensorType', 'struct<data: large_list<item: uint8>, shape: '
                                                      'fixed_size_list<item: int64>[3]>'}
    assert 'binary' in kinds['maybe']  # row groups with a None keep the stored column
    assert kinds['mask'] == {'binary'}  # booleans have no layout
    assert kinds['id'] == {'int64'}
    assert kinds['name'] == {'string'}
    assert kinds['price'] == {'decimal128(10, 2)'}


def test_a_hit_views_the_entry_file_writably_without_changing_it(url, tmp_path):
    args = _cache_args(tmp_path / 'c')
    options = {'reader_pool_type': 'dummy', 'shuffle_row_groups': False, 'schema_fields': ['id', 'image']}
    _items(make_batch_reader, url, **options, **args)
    before = [entry.read_bytes() for entry in _entries(tmp_path / 'c')]
    warm = _items(make_batch_reader, url, **options, **args)
    image = warm[0].image
    assert image.flags.writeable  # as without a cache: torch takes it without a copy, transforms may edit it
    assert not image.flags.owndata
    image[...] = 0  # a private copy of the mapped pages: the entry file does not change
    assert [entry.read_bytes() for entry in _entries(tmp_path / 'c')] == before
    again = _items(make_batch_reader, url, **options, **args)
    _same(again[0].image, _items(make_batch_reader, url, **options)[0].image)


# -- readers through the cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize('pool', POOLS)
@pytest.mark.parametrize('reader_kind', list(READERS))
def test_every_pool_kind_delivers_exactly_what_it_delivers_without_the_cache(url, tmp_path, pool, reader_kind):
    make = READERS[reader_kind]
    options = {'reader_pool_type': pool, 'workers_count': 2, 'seed': 11, 'shuffle_rows': True,
               'shuffle_row_drop_partitions': 2}
    plain = _items(make, url, **options)
    cold = _items(make, url, **options, **_cache_args(tmp_path / 'c'))
    warm = _items(make, url, **options, **_cache_args(tmp_path / 'c'))
    assert len(plain) == (ROWS if reader_kind == 'rows' else 2 * row_group_count(url))
    _same(cold, plain)
    _same(warm, plain)
    # The entries are whole row groups: two drop partitions of each share one entry.
    assert len(_entries(tmp_path / 'c')) == row_group_count(url)


@pytest.mark.parametrize('reader_kind', list(READERS))
def test_a_warm_cache_reads_and_decodes_no_image_or_array(url, tmp_path, decode_calls, reader_kind, monkeypatch):
    make = READERS[reader_kind]
    options = {'reader_pool_type': 'thread', 'workers_count': 2, 'shuffle_row_groups': False}
    plain = _items(make, url, **options)
    _items(make, url, **options, **_cache_args(tmp_path / 'c'))
    reads = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, 'read_row_group', lambda self, *a, **k: reads.append(1) or original(
        self, *a, **k))
    decode_calls.clear()
    warm = _items(make, url, **options, **_cache_args(tmp_path / 'c'))
    _same(warm, plain)
    assert reads == []
    # Only the columns without a layout are decoded again: booleans, and the row groups where 'maybe' is None.
    assert set(decode_calls) <= {'mask', 'maybe'}
    assert 'mask' in decode_calls


def test_predicates_filters_and_transforms_give_the_same_rows(url, tmp_path):
    def edit(row):
        row['image'][0, 0] = 7  # an in-place edit of the decoded image, as a transform may do
        row['score'] = float(row['image'].mean() + len(row['photo']))
        return row

    cases = [
        {'predicate': in_lambda(['id'], lambda i: i % 3 == 0)},
        {'predicate': in_lambda(['image'], lambda image: image[0, 0, 0] > 120)},  # a predicate on a decoded field
        {'filters': [('id', '>', 12), ('id', '<', 50)]},
        {'filters': [('name', '=', 'row4row4')]},  # most row groups keep no row
        {'transform_spec': TransformSpec(edit, edit_fields=[('score', np.float64, (), False)])},
        {'cur_shard': 1, 'shard_count': 3, 'seed': 2, 'shuffle_rows': True},
        {'schema_fields': ['photo', 'id'], 'predicate': in_lambda(['id'], lambda i: i > 40)},
    ]
    for index, case in enumerate(cases):
        options = {'reader_pool_type': 'thread', 'workers_count': 2, 'shuffle_row_groups': False, **case}
        plain = _items(make_reader, url, **options)
        assert plain, case
        for _ in range(2):  # cold, then warm
            _same(_items(make_reader, url, **options, **_cache_args(tmp_path / f'c{index}')), plain, str(case))


def test_batch_reader_transforms_and_filters_give_the_same_batches(url, tmp_path):
    def shrink(frame):
        frame['image'] = frame['image'].map(lambda image: image[:2])
        return frame

    options = {'reader_pool_type': 'dummy', 'shuffle_row_groups': False, 'filters': [('id', '>=', 10)],
               'transform_spec': TransformSpec(shrink, edit_fields=[('image', np.uint8, (2, 12, 3), False)])}
    plain = _items(make_batch_reader, url, **options)
    _same(_items(make_batch_reader, url, **options, **_cache_args(tmp_path / 'c')), plain)
    _same(_items(make_batch_reader, url, **options, **_cache_args(tmp_path / 'c')), plain)


def test_ngram_windows_through_the_cache(url, tmp_path):
    def windows(**extra):
        ngram = NGram({0: ['id', 'image'], 1: ['id', 'photo']}, delta_threshold=1, timestamp_field='id')
        with make_reader(url, schema_fields=ngram, reader_pool_type='dummy', shuffle_row_groups=False,
                         **extra) as reader:
            return [(w[0].id, w[0].image, w[1].id, w[1].photo) for w in reader]

    plain = windows()
    assert plain
    _same(windows(**_cache_args(tmp_path / 'c')), plain)
    _same(windows(**_cache_args(tmp_path / 'c')), plain)


def _corrupt_one_image(url, row_id):
    """Replace the stored PNG of row ``row_id`` by bytes that are no image, keeping the row groups; its file."""
    root = Path(url[len('file://'):])
    for path in sorted(root.rglob('*.parquet')):
        parquet = pq.ParquetFile(path)
        groups = [parquet.read_row_group(i) for i in range(parquet.num_row_groups)]
        if not any(row_id in group.column('id').to_pylist() for group in groups):
            continue
        metadata = parquet.schema_arrow.metadata
        with pq.ParquetWriter(str(path) + '.new', parquet.schema_arrow.with_metadata(metadata)) as writer:
            for group in groups:
                ids = group.column('id').to_pylist()
                images = [b'not an image' if i == row_id else v for i, v in zip(
                    ids, group.column('image').to_pylist(), strict=True)]
                index = group.schema.get_field_index('image')
                writer.write_table(group.set_column(index, group.schema.field(index),
                                                    pa.array(images, type=group.schema.field(index).type)))
        os.replace(str(path) + '.new', path)
        return path
    raise AssertionError(f'row {row_id} not found')


def test_a_row_that_cannot_be_decoded_fails_exactly_where_it_fails_without_the_cache(tmp_path):
    url = _write(tmp_path / 'ds')
    _corrupt_one_image(url, 17)
    skip_it = {'predicate': in_lambda(['id'], lambda i: i != 17), 'reader_pool_type': 'dummy',
               'shuffle_row_groups': False}
    plain = _items(make_reader, url, **skip_it)
    assert len(plain) == ROWS - 1
    for _ in range(2):
        _same(_items(make_reader, url, **skip_it, **_cache_args(tmp_path / 'c')), plain)
    messages = []
    for extra in ({}, _cache_args(tmp_path / 'c'), _cache_args(tmp_path / 'c')):
        with pytest.raises(DecodeFieldError) as raised:
            _items(make_reader, url, reader_pool_type='dummy', shuffle_row_groups=False, **extra)
        messages.append(str(raised.value))
    assert messages[0] == messages[1] == messages[2]
    assert 'Decoding field "image" failed' in messages[0]


def test_a_rewritten_file_is_decoded_again(tmp_path):
    url = _write(tmp_path / 'ds')
    args = _cache_args(tmp_path / 'c')
    options = {'reader_pool_type': 'dummy', 'shuffle_row_groups': False, 'schema_fields': ['id', 'image']}
    _items(make_reader, url, **options, **args)
    path = _corrupt_one_image(url, 5)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    with pytest.raises(DecodeFieldError):  # the new content, not the entry of the old one
        _items(make_reader, url, **options, **args)


def test_eviction_keeps_the_size_limit_and_the_values(url, tmp_path):
    options = {'reader_pool_type': 'dummy', 'shuffle_row_groups': False}
    plain = _items(make_batch_reader, url, **options)
    _items(make_batch_reader, url, **options, **_cache_args(tmp_path / 'probe'))
    limit = 3 * max(entry.stat().st_size for entry in _entries(tmp_path / 'probe'))  # room for about 3 entries
    args = _cache_args(tmp_path / 'c', cache_size_limit=limit, cache_row_size_estimate=None)
    for _ in range(2):
        _same(_items(make_batch_reader, url, **options, **args), plain)
    assert 0 < LocalDiskCache(tmp_path / 'c', limit, None).volume() <= limit


def test_options_name_the_decoded_cache(url, tmp_path):
    with pytest.raises(ValueError, match="cache_type='local-disk-decoded' needs cache_location"):
        make_reader(url, cache_type='local-disk-decoded', cache_size_limit=LIMIT)
    with pytest.raises(ValueError, match="Unknown cache_type: 'decoded'; expected one of 'null', 'local-disk', "
                                         "'local-disk-decoded'"):
        make_batch_reader(url, cache_type='decoded')


def test_the_reader_removes_the_decoded_cache_on_exit_by_default(url, tmp_path):
    location = tmp_path / 'c'
    with make_reader(url, reader_pool_type='thread', **{**_cache_args(location), 'cache_extra_settings': None}) \
            as reader:
        assert isinstance(reader.cache, LocalDiskCache)
        assert len(list(reader)) == ROWS
        assert _entries(location)
    assert not location.exists()


def _read_in_process(url, cache_dir, counter_path, seed, go):
    original = CompressedImageCodec.decode_column

    def counting(self, field, column):
        with open(counter_path, 'a') as counter:
            counter.write(f'{field.name}\n')
        time.sleep(0.02)
        return original(self, field, column)

    CompressedImageCodec.decode_column = counting
    go.wait(30)
    with make_reader(url, reader_pool_type='thread', workers_count=2, seed=seed, schema_fields=['id', 'image'],
                     **_cache_args(cache_dir)) as reader:
        ids = sorted(int(row.id) for row in reader)
    if ids != list(range(ROWS)):
        raise AssertionError(f'wrong rows: {ids}')


def test_ranks_of_one_node_decode_each_row_group_once(url, tmp_path):
    counter = tmp_path / 'decodes.txt'
    assert run_ranks_together(_read_in_process, url, tmp_path / 'c', counter) == [0, 0]
    assert len(counter.read_text().split()) == row_group_count(url)


def test_the_decoded_cache_benchmark_runs(tmp_path):
    completed = subprocess.run([sys.executable, str(BENCH), '--quick', '--data', str(tmp_path)], capture_output=True,
                               text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr
    rows = {line.split('|')[1].strip(): line for line in completed.stdout.splitlines() if line.startswith('| ')}
    assert {'no cache', 'decoded cache, first epoch', 'decoded cache, later epochs'} <= set(rows)
    assert 'decoded cache, first epoch / no cache: ' in completed.stdout
    assert 'bytes on disk / Parquet store' in completed.stdout
