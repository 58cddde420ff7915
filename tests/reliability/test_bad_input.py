"""Bad input catalog: every case raises a documented exception whose message names the culprit and what was expected.

Each row of ``CASES`` is ``(case id, what to run, exception type, texts the message must contain)``. A builder gets
the test's :class:`Env` and returns the call that must fail; the texts may use ``{url}``, ``{file}``, ``{root}``
and ``{marker}``, which the builder sets on the env. A write that fails must leave no dataset that looks complete
(no ``_common_metadata`` and no Parquet file under the target), and a hostile pickle must not run anything (its
marker file is never created). Everything runs in the test process: nothing may crash the interpreter or hang.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import TransformSpec, make_batch_reader, make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.errors import (
    CorruptDataError,
    DatasetWriteError,
    DecodeFieldError,
    MissingDataFilesError,
    PetastormError,
    PetastormMetadataError,
    SchemaError,
    StorageNotFoundError,
)
from petastorm.metadata.legacy import LegacyPickleRefusedError
from petastorm.metadata.write import update_common_metadata
from petastorm.predicates import in_set
from petastorm.store import keys
from petastorm.unischema import Unischema, UnischemaField
from reliability.helpers import SMALL_DATASET_SIZES, SMALL_ROWS, SmallSchema, small_row

pytestmark = pytest.mark.timeout(60)


@dataclass
class Env:
    tmp: pathlib.Path
    dataset_root: pathlib.Path  # the shared small dataset: read only, builders that damage one damage a copy
    url: str = ''
    file: str = ''
    root: str = ''
    marker: str = ''
    writes: bool = False  # the call writes to ``root``: a failure must leave nothing there that looks complete

    def copy_dataset(self) -> pathlib.Path:
        target = self.tmp / 'copy'
        shutil.copytree(self.dataset_root, target)
        self.root = str(target)
        self.url = 'file://' + str(target)
        return target

    def data_files(self, root: pathlib.Path) -> list[pathlib.Path]:
        return sorted(root.glob('*.parquet'))


# -- builders: each returns the call that must fail -----------------------------------------------------------------

def _read_all(factory, url, **kwargs) -> Callable[[], None]:
    kwargs.setdefault('reader_pool_type', 'dummy')

    def run():
        with factory(url, **kwargs) as reader:
            for _ in reader:
                pass
    return run


def reader_on(store: Callable[[Env], str], factory=make_reader, **kwargs):
    def build(env: Env):
        env.url = store(env)
        return _read_all(factory, env.url, **kwargs)
    return build


def good_store(env: Env) -> str:
    env.url = 'file://' + str(env.dataset_root)
    env.root = str(env.dataset_root)
    return env.url


def missing_store(env: Env) -> str:
    return 'file://' + str(env.tmp / 'does-not-exist')


def empty_store(env: Env) -> str:
    (env.tmp / 'empty').mkdir()
    return 'file://' + str(env.tmp / 'empty')


def text_files_store(env: Env) -> str:
    root = env.tmp / 'texts'
    root.mkdir()
    for i in range(3):
        (root / f'notes-{i}.parquet').write_text('these are not parquet files\n' * 20)
    env.file = str(root / 'notes-0.parquet')
    return 'file://' + str(root)


def _damaged(damage: Callable[[pathlib.Path], None]) -> Callable[[Env], str]:
    def store(env: Env) -> str:
        root = env.copy_dataset()
        victim = env.data_files(root)[-1]
        env.file = str(victim)
        damage(victim)
        return env.url
    return store


def _truncate_footer(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-20])


def _garble_footer(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    footer_length = int.from_bytes(data[-8:-4], 'little')
    start = len(data) - 8 - footer_length
    data[start:len(data) - 8] = bytes((b * 7 + 13) % 256 for b in data[start:len(data) - 8])
    path.write_bytes(bytes(data))


def _garble_data_pages(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    footer_length = int.from_bytes(data[-8:-4], 'little')
    end = len(data) - 8 - footer_length
    data[4:end] = b'\xff' * (end - 4)
    path.write_bytes(bytes(data))


def _deleted_while_reading(env: Env):
    root = env.copy_dataset()
    victim = env.data_files(root)[-1]
    env.file = str(victim)
    reader = make_reader(env.url, reader_pool_type='dummy', shuffle_row_groups=False)

    def run():
        with reader:
            next(reader)
            victim.unlink()
            for _ in reader:
                pass
    return run


def other_schema_store(env: Env) -> str:
    root = env.tmp / 'mixed'
    root.mkdir()
    pq.write_table(pa.table({'id': np.arange(5, dtype=np.int64)}), root / 'part-0.parquet')
    pq.write_table(pa.table({'id': pa.array(['a', 'b'])}), root / 'part-1.parquet')
    env.file = str(root / 'part-1.parquet')
    return 'file://' + str(root)


def _metadata(updates: dict[bytes, bytes | None]) -> Callable[[Env], str]:
    def store(env: Env) -> str:
        root = env.copy_dataset()
        update_common_metadata(pafs.LocalFileSystem(), str(root), updates)
        env.file = str(root / '_common_metadata')
        return env.url
    return store


class _RunsCode:
    """Pickles to a call of ``function(*args)``: what a hostile pickle does."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def _hostile_pickle(make_payload: Callable[[str], object]) -> Callable[[Env], str]:
    def store(env: Env) -> str:
        env.marker = str(env.tmp / 'pwned')
        payload = pickle.dumps(make_payload(env.marker), protocol=2)
        return _metadata({keys.SCHEMA_JSON_KEY: None, keys.UNISCHEMA_KEY: payload})(env)
    return store


# Codec payload cases: a one-row-group store whose one field holds the given bytes.
ImageSchema = Unischema('ImageSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (4, 4, 3), CompressedImageCodec('png'), False),
    UnischemaField('matrix', np.float32, (2, 2), NdarrayCodec(), False),
    UnischemaField('packed', np.int16, (3,), CompressedNdarrayCodec(), False),
])


def _image_row(i: int) -> dict:
    return {'id': i, 'image': np.full((4, 4, 3), i, dtype=np.uint8), 'matrix': np.eye(2, dtype=np.float32),
            'packed': np.arange(3, dtype=np.int16)}


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _npy_with_header(header: str) -> bytes:
    text = header.encode('latin1')
    text += b' ' * ((64 - (10 + len(text) + 1) % 64) % 64) + b'\n'
    return b'\x93NUMPY\x01\x00' + len(text).to_bytes(2, 'little') + text + b'\x00' * 16


def _payload_store(column: str, payload: Callable[[Env], bytes]) -> Callable[[Env], str]:
    def store(env: Env) -> str:
        url = 'file://' + str(env.tmp / 'images')
        write_dataset(url, ImageSchema, [_image_row(i) for i in range(4)])
        path = sorted((env.tmp / 'images').glob('*.parquet'))[0]
        table = pq.read_table(path)
        index = table.schema.get_field_index(column)
        bad = pa.array([payload(env)] * table.num_rows, type=table.schema.field(column).type)
        pq.write_table(table.set_column(index, table.schema.field(column), bad), path)
        env.file = str(path)
        env.url = url
        return url
    return store


def _object_npy(env: Env) -> bytes:
    env.marker = str(env.tmp / 'pwned')
    buffer = io.BytesIO()
    np.save(buffer, np.array([_RunsCode(pathlib.Path.touch, pathlib.Path(env.marker))], dtype=object),
            allow_pickle=True)
    return buffer.getvalue()


# -- write cases ----------------------------------------------------------------------------------------------------

def write_rows(rows: Callable[[], object], schema: Unischema = SmallSchema, into: str = 'new', **kwargs):
    def build(env: Env):
        target = env.tmp / into
        env.writes = True
        env.root = str(target)
        env.url = 'file://' + str(target)
        sizes = {**SMALL_DATASET_SIZES, **kwargs}
        return lambda: write_dataset(env.url, schema, rows(), **sizes)
    return build


def _rows_with(index: int, **changes) -> Callable[[], list]:
    def rows():
        result = [small_row(i) for i in range(SMALL_ROWS)]
        result[index] = {**result[index], **changes}
        return result
    return rows


def _rows_then_failure():
    for i in range(SMALL_ROWS):
        if i == 45:
            raise ConnectionAbortedError('the upstream source of rows went away at row 45')
        yield small_row(i)


def _existing(kind: str):
    def build(env: Env):
        target = env.tmp / 'existing'
        env.writes = True
        if kind == 'file':
            target.write_text('I am a file')
        else:
            target.mkdir()
            (target / 'keep.txt').write_text('precious')
        env.root = str(target)
        env.url = 'file://' + str(target)
        return lambda: write_dataset(env.url, SmallSchema, [small_row(i) for i in range(3)])
    return build


NanSchema = Unischema('NanSchema', [UnischemaField('count', np.int64, (), ScalarCodec(pa.int64()), False)])
HugeSchema = Unischema('HugeSchema', [UnischemaField('giant', np.uint8, (2**40, 2**40), NdarrayCodec(), False)])
RgbSchema = Unischema('RgbSchema', [UnischemaField('image', np.uint8, (4, 4, 3), CompressedImageCodec(), False)])
Other = UnischemaField('not_in_dataset', np.int64, (), ScalarCodec(pa.int64()), False)


def _reader_call(**kwargs):
    return reader_on(good_store, **kwargs)


# -- the catalog ----------------------------------------------------------------------------------------------------

CASES = [
    # URLs and stores
    ('missing-url', reader_on(missing_store), StorageNotFoundError, ['{url}', 'does not exist']),
    ('missing-url-batch', reader_on(missing_store, make_batch_reader), StorageNotFoundError, ['{url}',
                                                                                               'does not exist']),
    ('empty-dir', reader_on(empty_store), PetastormMetadataError, ['{url}', 'no Parquet']),
    ('empty-dir-batch', reader_on(empty_store, make_batch_reader), PetastormMetadataError, ['{url}', 'no Parquet']),
    ('non-parquet-files', reader_on(text_files_store, make_batch_reader), PetastormMetadataError,
     ['{file}', 'Parquet']),
    ('non-parquet-files-rows', reader_on(text_files_store), PetastormMetadataError, ['{file}', 'Parquet']),
    ('truncated-footer', reader_on(_damaged(_truncate_footer)), CorruptDataError, ['{file}', 'Parquet']),
    ('garbled-footer', reader_on(_damaged(_garble_footer)), CorruptDataError, ['{file}', 'Parquet']),
    ('garbled-data-pages', reader_on(_damaged(_garble_data_pages)), CorruptDataError, ['{file}', 'row group']),
    ('data-file-deleted-while-reading', _deleted_while_reading, StorageNotFoundError, ['{file}', 'no longer']),
    ('file-with-other-schema', reader_on(other_schema_store, make_batch_reader), PetastormError,
     ['{file}', 'id']),
    ('relative-path', lambda env: lambda: make_reader('relative/dataset'), ValueError, ['file://']),
    ('url-not-a-string', lambda env: lambda: make_reader(123), ValueError, ['must be a string']),
    ('empty-url-list', lambda env: lambda: make_batch_reader([]), ValueError, ['non-empty']),
    ('mixed-url-list', lambda env: lambda: make_batch_reader(['file:///a/x.parquet', 's3://b/y.parquet']),
     ValueError, ['same scheme']),
    ('unknown-scheme', lambda env: lambda: make_reader('nosuchscheme://bucket/data'), ValueError,
     ['nosuchscheme']),
    # metadata
    ('malformed-json', reader_on(_metadata({keys.SCHEMA_JSON_KEY: b'{"format_version": 1, "fields": ['})),
     PetastormMetadataError, ['{file}', 'not valid JSON']),
    ('future-format', reader_on(_metadata({keys.SCHEMA_JSON_KEY: b'{"format_version": 99, "fields": []}'})),
     PetastormMetadataError, ['{file}', 'format_version 99', 'Upgrade']),
    ('fields-not-a-list', reader_on(_metadata({keys.SCHEMA_JSON_KEY: b'{"format_version": 1, "fields": 7}'})),
     PetastormMetadataError, ['{file}', '"fields" list']),
    ('unknown-dtype', reader_on(_metadata({keys.SCHEMA_JSON_KEY: b'{"format_version": 1, "fields": [{"name": "x", '
                                                                  b'"numpy_dtype": "os.system", "shape": []}]}'})),
     PetastormMetadataError, ['os.system', 'expected one of']),
    ('unknown-codec', reader_on(_metadata({keys.SCHEMA_JSON_KEY: b'{"format_version": 1, "fields": [{"name": "x", '
                                                                  b'"numpy_dtype": "int64", "shape": [], '
                                                                  b'"codec": {"codec": "evil"}}]}'})),
     PetastormError, ["'evil'", 'known codecs']),
    ('row-groups-json-malformed', reader_on(_metadata({keys.ROW_GROUPS_JSON_KEY: b'[[[', })), PetastormMetadataError,
     ['{file}', 'row']),
    ('legacy-pickle-os-system', reader_on(_hostile_pickle(lambda m: _RunsCode(os.system, f'touch {m}'))),
     LegacyPickleRefusedError, ['{file}', 'system', 'forbidden']),
    ('legacy-pickle-eval', reader_on(_hostile_pickle(lambda m: _RunsCode(eval, f'open({m!r}, "w")'))),
     LegacyPickleRefusedError, ['{file}', 'eval', 'forbidden']),
    ('legacy-pickle-path-touch', reader_on(_hostile_pickle(lambda m: _RunsCode(pathlib.Path.touch, pathlib.Path(m)))),
     LegacyPickleRefusedError, ['{file}', 'forbidden']),
    ('legacy-pickle-other-class', reader_on(_hostile_pickle(lambda m: io.BytesIO(b'x'))), LegacyPickleRefusedError,
     ['{file}', 'BytesIO', 'forbidden']),
    ('legacy-pickle-garbage', reader_on(_metadata({keys.SCHEMA_JSON_KEY: None, keys.UNISCHEMA_KEY: b'\x80\x02}q'})),
     PetastormMetadataError, ['{file}', 'cannot be read']),
    # field selection and options
    ('unknown-field-regex', _reader_call(schema_fields=['nothing_matches.*']), RuntimeError,
     ['nothing_matches', 'No fields matching']),
    ('bad-regex', _reader_call(schema_fields=['id', '(unclosed']), ValueError, ['(unclosed', 'regular expression']),
    ('unknown-field', _reader_call(schema_fields=[Other]), ValueError, ['not_in_dataset', 'does not belong']),
    ('fields-not-iterable', _reader_call(schema_fields=42), ValueError, ['Fields must be']),
    ('workers-zero', _reader_call(workers_count=0), ValueError, ['workers_count', 'positive integer']),
    ('workers-string', _reader_call(workers_count='2'), ValueError, ['workers_count', 'positive integer']),
    ('queue-zero', _reader_call(results_queue_size=0), ValueError, ['results_queue_size', 'positive integer']),
    ('shard-out-of-range', _reader_call(cur_shard=3, shard_count=3), ValueError, ['cur_shard=3', 'shard_count']),
    ('shard-without-count', _reader_call(cur_shard=1), ValueError, ['cur_shard=1', 'shard_count=None']),
    ('negative-epochs', _reader_call(num_epochs=-1), ValueError, ['num_epochs=-1', 'positive integer or None']),
    ('zero-epochs', _reader_call(num_epochs=0), ValueError, ['num_epochs=0', 'positive integer or None']),
    ('fractional-epochs', _reader_call(num_epochs=1.5), ValueError, ['num_epochs=1.5', 'positive integer']),
    ('unknown-pool', _reader_call(reader_pool_type='fork'), ValueError, ["'fork'", 'thread']),
    ('drop-partitions-zero', _reader_call(shuffle_row_drop_partitions=0), ValueError,
     ['shuffle_row_drop_partitions', '>= 1']),
    ('predicate-not-a-predicate', _reader_call(predicate='id > 3'), ValueError, ['PredicateBase']),
    ('predicate-unknown-field', _reader_call(predicate=in_set({1}, 'nope')), ValueError, ["'nope'", 'predicate']),
    ('unknown-cache', _reader_call(cache_type='redis'), ValueError, ["'redis'", 'local-disk']),
    ('cache-without-location', _reader_call(cache_type='local-disk', cache_size_limit=10**6), ValueError,
     ['cache_location']),
    ('transform-not-a-spec', _reader_call(transform_spec=lambda row: row), ValueError, ['transform_spec',
                                                                                         'TransformSpec']),
    ('transform-returns-wrong-type', _reader_call(factory=make_batch_reader,
                                                  transform_spec=TransformSpec(lambda frame: 'oops')),
     ValueError, ['DataFrame', 'str']),
    ('seed-not-int', _reader_call(seed='abc'), ValueError, ['seed', "'abc'"]),
    ('filters-not-a-list', _reader_call(filters='id > 3'), ValueError, ['filters', 'id > 3']),
    # codec payloads at read time
    ('image-not-png', reader_on(_payload_store('image', lambda env: b'GIF89a not a png')), DecodeFieldError,
     ['"image"', '{file}', 'row group']),
    ('npy-garbage', reader_on(_payload_store('matrix', lambda env: b'no npy magic here')), DecodeFieldError,
     ['"matrix"', '{file}', '.npy']),
    ('npz-garbage', reader_on(_payload_store('packed', lambda env: b'PK not a zip')), DecodeFieldError,
     ['"packed"', '{file}', '.npz']),
    ('npy-huge-declared-shape', reader_on(_payload_store('matrix', lambda env: _npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 1000000000000), }"))),
     DecodeFieldError, ['"matrix"', '{file}']),
    ('npy-object-pickle', reader_on(_payload_store('matrix', _object_npy)), DecodeFieldError, ['"matrix"', '{file}']),
    ('npy-wrong-dtype', reader_on(_payload_store('matrix', lambda env: _npy(np.eye(2, dtype=np.int64)))),
     DecodeFieldError, ['"matrix"', 'float32', 'int64']),
    ('npy-wrong-shape', reader_on(_payload_store('matrix', lambda env: _npy(np.zeros((3, 3), np.float32)))),
     DecodeFieldError, ['"matrix"', '(2, 2)', '(3, 3)']),
    # writes
    ('write-wrong-shape', write_rows(_rows_with(50, vec=np.zeros(3, np.float32))), SchemaError,
     ['vec', '(2,)', '(3,)']),
    ('write-wrong-dtype', write_rows(_rows_with(50, vec=np.zeros(2, np.float64))), SchemaError,
     ['vec', 'float32', 'float64']),
    ('write-none-non-nullable', write_rows(_rows_with(50, id=None)), SchemaError, ['id', 'nullable']),
    ('write-nan-in-int-field', write_rows(lambda: [{'count': 1}, {'count': float('nan')}], schema=NanSchema),
     SchemaError, ['count', 'int64']),
    ('write-missing-field', write_rows(lambda: [small_row(0), {'id': 1}]), SchemaError, ['vec']),
    ('write-extra-field', write_rows(_rows_with(3, color='red')), SchemaError, ['color']),
    ('write-rgba-image', write_rows(lambda: [{'image': np.zeros((4, 4, 4), np.uint8)}], schema=RgbSchema),
     SchemaError, ['image', '(4, 4, 3)']),
    ('write-huge-declared-shape', write_rows(lambda: [{'giant': np.zeros((2, 2), np.uint8)}], schema=HugeSchema),
     SchemaError, ['giant', '(2, 2)']),
    ('write-source-fails-midway', write_rows(_rows_then_failure), DatasetWriteError,
     ['{url}', 'row 45', 'rolled back']),
    ('write-no-rows', write_rows(lambda: []), SchemaError, ['{url}', 'no rows']),
    ('write-not-a-unischema', lambda env: lambda: write_dataset('file://' + str(env.tmp / 'x'), {'id': int}, []),
     SchemaError, ['Unischema', 'dict']),
    ('write-bad-row-group-size', write_rows(lambda: [small_row(0)], row_group_size_mb=0), ValueError,
     ['row_group_size_mb', 'positive']),
    ('write-onto-a-file', _existing('file'), FileExistsError, ['{url}', 'file']),
    ('write-into-non-empty-dir', _existing('dir'), FileExistsError, ['{url}', 'not empty']),
]


def _catalog_params() -> list:
    # Checked while collecting: pytest would quietly suffix a duplicated id, and one more test could not stop the
    # catalog from shrinking unnoticed.
    repeated = sorted(case_id for case_id, uses in Counter(case[0] for case in CASES).items() if uses > 1)
    assert not repeated, f'case ids used more than once: {repeated}'
    assert len(CASES) >= 40, f'the bad input catalog shrank to {len(CASES)} cases'
    return [pytest.param(*case[1:], id=case[0]) for case in CASES]


@pytest.fixture(scope='module')
def pristine_dataset(small_dataset_url) -> pathlib.Path:
    """The directory of the session's small dataset (builders copy it before damaging it)."""
    return pathlib.Path(small_dataset_url.removeprefix('file://'))


def _looks_complete(root: pathlib.Path) -> bool:
    return root.exists() and root.is_dir() and (
        (root / '_common_metadata').exists() or any(root.rglob('*.parquet')))


@pytest.mark.parametrize(('build', 'raises', 'mentions'), _catalog_params())
def test_bad_input_raises_a_documented_error_naming_the_culprit(build, raises, mentions, pristine_dataset, tmp_path,
                                                                figures):
    env = Env(tmp=tmp_path, dataset_root=pristine_dataset)
    action = build(env)
    with pytest.raises(raises) as info:
        action()
    message = str(info.value)
    for text in mentions:
        expected = text.format(url=env.url, file=env.file, root=env.root, marker=env.marker)
        assert expected in message, f'{expected!r} is not in the message: {message}'
    if env.marker:
        assert not os.path.exists(env.marker), 'the hostile payload ran code'
    if env.writes:
        root = pathlib.Path(env.root)
        if root.name == 'existing':  # what was there before is untouched, and nothing was added
            contents = sorted(p.name for p in root.iterdir()) if root.is_dir() else root.read_text()
            assert contents in (['keep.txt'], 'I am a file')
        else:
            assert not _looks_complete(root), f'a failed write left {sorted(root.rglob("*"))}'
    figures.tally('bad input catalog', 'cases', passed=1)


@pytest.mark.parametrize('deleted', ['one', 'all'])
@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_metadata_naming_missing_files_is_an_error_at_planning_naming_them(pristine_dataset, tmp_path, deleted,
                                                                           factory):
    # Reading the rest would deliver a smaller (or empty) epoch that looks like success.
    env = Env(tmp=tmp_path, dataset_root=pristine_dataset)
    root = env.copy_dataset()
    victims = env.data_files(root)[-1:] if deleted == 'one' else env.data_files(root)
    for victim in victims:
        victim.unlink()
    with pytest.raises(MissingDataFilesError) as raised:
        factory(env.url, reader_pool_type='dummy')
    message = str(raised.value)
    assert all(f'{env.url}/{victim.name}' in message for victim in victims[:5])
    assert f'{env.url}/_common_metadata' in message
    assert 'petastorm-generate-metadata.py' in message
    assert raised.value.urls == tuple(f'{env.url}/{victim.name}' for victim in victims)
    assert isinstance(raised.value, FileNotFoundError)
    assert isinstance(raised.value, PetastormMetadataError)
