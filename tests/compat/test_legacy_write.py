"""Datasets we write also carry Petastorm's pickled schema entry, so that Petastorm 0.13.1 opens them.

The pickle is produced from a description of Petastorm's classes (no Petastorm needed); the ``legacy`` test
reads a dataset we wrote with the original Petastorm 0.13.1 from its side environment.
"""

from __future__ import annotations

import base64
import decimal
import json
import logging
import os
import pathlib
import pickletools
import subprocess
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from petastorm import make_reader, write_dataset
from petastorm.codecs import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    DataframeColumnCodec,
    NdarrayCodec,
    ScalarCodec,
)
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url
from petastorm.metadata.legacy import unischema_from_legacy_pickle
from petastorm.metadata.legacy_write import LegacySchemaError, unischema_to_legacy_pickle
from petastorm.metadata.write import write_dataset_metadata
from petastorm.store import keys
from petastorm.unischema import Unischema, UnischemaField

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = REPO.parent / 'shared'
SETUP_SCRIPT = SHARED / 'bench' / 'setup_anchor_venv.sh'
ANCHOR_VENV = pathlib.Path(os.environ.get('ANCHOR_VENV', '/tmp/petastorm-anchor-venv'))

AllCodecs = Unischema('AllCodecs', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('int8', np.int8, (), ScalarCodec(pa.int8()), False),
    UnischemaField('int16', np.int16, (), ScalarCodec(pa.int16()), False),
    UnischemaField('int32', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('uint8', np.uint8, (), None, False),
    UnischemaField('uint16', np.uint16, (), None, False),
    UnischemaField('float32', np.float32, (), ScalarCodec(pa.float32()), False),
    UnischemaField('float64', np.float64, (), None, False),
    UnischemaField('bool', np.bool_, (), None, False),
    UnischemaField('string', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('decimal', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 9)), False),
    UnischemaField('nullable_int', np.int32, (), ScalarCodec(pa.int32()), True),
    UnischemaField('nullable_string', np.str_, (), None, True),
    UnischemaField('image_png', np.uint8, (8, 6, 3), CompressedImageCodec('png'), False),
    UnischemaField('image_gray_png', np.uint8, (8, 6), CompressedImageCodec('png'), False),
    UnischemaField('image_uint16_png', np.uint16, (8, 6), CompressedImageCodec('png'), False),
    UnischemaField('image_jpeg', np.uint8, (8, 6, 3), CompressedImageCodec('jpeg', 90), False),
    UnischemaField('ndarray_float32', np.float32, (2, 3), NdarrayCodec(), False),
    UnischemaField('ndarray_var_uint8', np.uint8, (None, 4), NdarrayCodec(), False),
    UnischemaField('ndarray_string', np.str_, (None,), NdarrayCodec(), False),
    UnischemaField('compressed_int32', np.int32, (3, 3), CompressedNdarrayCodec(), False),
    UnischemaField('nullable_ndarray', np.float64, (4,), NdarrayCodec(), True),
])

JPEG_TOLERANCE = 8


def _row(i):
    rng = np.random.default_rng(i)
    gradient = (np.arange(8)[:, None, None] * 20 + np.arange(6)[None, :, None] * 10 + np.arange(3) * 5 + i)
    return {
        'id': i, 'int8': np.int8(-i), 'int16': np.int16(300 * i), 'int32': np.int32(-70000 * i),
        'uint8': np.uint8(250 - i), 'uint16': np.uint16(65000 - i), 'float32': np.float32(i / 3),
        'float64': np.float64(i * 1.5e10), 'bool': np.bool_(i % 2 == 0), 'string': f'ünïcode-{i}' if i else '',
        'decimal': decimal.Decimal(f'{i % 10}.{i:09d}'),
        'nullable_int': None if i % 3 == 0 else np.int32(i), 'nullable_string': None if i % 4 == 0 else f's{i}',
        'image_png': rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
        'image_gray_png': rng.integers(0, 256, (8, 6), dtype=np.uint8),
        'image_uint16_png': rng.integers(0, 65536, (8, 6), dtype=np.uint16),
        'image_jpeg': gradient.astype(np.uint8),
        'ndarray_float32': rng.standard_normal((2, 3)).astype(np.float32),
        'ndarray_var_uint8': rng.integers(0, 256, (i % 4, 4), dtype=np.uint8),
        'ndarray_string': np.array([f'a{j}' * (j + 1) for j in range(i % 3)], dtype=np.str_),
        'compressed_int32': rng.integers(-1000, 1000, (3, 3), dtype=np.int32),
        'nullable_ndarray': None if i % 5 == 1 else rng.standard_normal(4),
    }


ROWS = [_row(i) for i in range(12)]


def _stored_metadata(path: pathlib.Path) -> dict:
    return pq.read_schema(path / '_common_metadata').metadata


def _assert_same_schema(ours: Unischema, back: Unischema) -> None:
    assert back == ours
    for name, field in ours.fields.items():
        other = back.fields[name]
        assert type(other.codec) is type(field.codec), name
        if isinstance(field.codec, DataframeColumnCodec):
            assert other.codec.to_json() == field.codec.to_json(), name


# ------------------------------------------------------------------ the pickle itself


def test_pickle_round_trips_through_our_guarded_reader():
    _assert_same_schema(AllCodecs, unischema_from_legacy_pickle(unischema_to_legacy_pickle(AllCodecs)))


def test_pickle_has_petastorm_structure_and_only_allowed_globals():
    data = unischema_to_legacy_pickle(AllCodecs)
    ops = list(pickletools.genops(data))
    assert (ops[0][0].name, ops[0][1]) == ('PROTO', 4)
    globals_ = {arg for op, arg, _ in ops if op.name == 'GLOBAL'}
    assert {g.split(' ')[0] for g in globals_} == {'petastorm.unischema', 'petastorm.codecs', 'pyspark.sql.types',
                                                   'numpy', 'decimal', 'collections'}
    assert {'petastorm.unischema Unischema', 'petastorm.unischema UnischemaField', 'numpy str_', 'numpy bool_',
            'decimal Decimal', 'pyspark.sql.types DecimalType', 'pyspark.sql.types ShortType',
            'petastorm.codecs CompressedImageCodec', 'petastorm.codecs CompressedNdarrayCodec'} <= globals_
    # The Unischema: NEWOBJ of no arguments, then BUILD of its state; the last opcodes are BUILD, STOP.
    assert [op.name for op, _, _ in ops[1:4]] == ['GLOBAL', 'MEMOIZE', 'EMPTY_TUPLE']
    assert ops[4][0].name == 'NEWOBJ'
    assert [op.name for op, _, _ in ops[-2:]] == ['BUILD', 'STOP']


def test_field_attributes_share_the_field_objects_and_skip_class_attributes():
    # Our own Unischema, like Petastorm's, refuses a dynamic attribute that would hide ``fields``.
    with pytest.warns(UserWarning, match='dynamic property fields'):
        schema = Unischema('S', [UnischemaField('fields', np.int32, (), None, False),
                                 UnischemaField('x', np.float32, (), None, True)])
    with pytest.warns(UserWarning, match='dynamic property fields'):
        back = unischema_from_legacy_pickle(unischema_to_legacy_pickle(schema))
    assert list(back.fields) == ['fields', 'x']
    ops = [op.name for op, _, _ in pickletools.genops(unischema_to_legacy_pickle(schema))]
    assert ops.count('BINGET') >= 2  # 'x' refers back to the field in _fields instead of a copy


def test_unexpressible_schema_is_refused_by_the_describer():
    class CustomCodec(NdarrayCodec):
        pass

    class Other(DataframeColumnCodec):
        codec_name = 'other'

        def encode(self, unischema_field, value):
            return value

        def decode(self, unischema_field, value):
            return value

        def spark_dtype(self):
            return None

        def arrow_type(self):
            return pa.binary()

    # A subclass of one of ours is written as its base; an unrelated codec cannot be expressed.
    ok = Unischema('S', [UnischemaField('a', np.uint8, (None,), CustomCodec(), False)])
    assert isinstance(unischema_from_legacy_pickle(unischema_to_legacy_pickle(ok)).a.codec, NdarrayCodec)
    with pytest.raises(LegacySchemaError, match="field 'b'"):
        unischema_to_legacy_pickle(Unischema('S', [UnischemaField('b', np.uint8, (None,), Other(), False)]))
    with pytest.raises(LegacySchemaError, match='numpy type'):
        unischema_to_legacy_pickle(Unischema('S', [UnischemaField('c', object, (), None, False)]))


# ------------------------------------------------------------------ the datasets


def test_write_dataset_stores_the_legacy_entry_by_default(tmp_path):
    write_dataset(f'file://{tmp_path}/d', AllCodecs, ROWS[:3])
    metadata = _stored_metadata(tmp_path / 'd')
    assert keys.SCHEMA_JSON_KEY in metadata
    _assert_same_schema(AllCodecs, unischema_from_legacy_pickle(metadata[keys.UNISCHEMA_KEY]))
    _assert_same_schema(AllCodecs, get_schema_from_dataset_url(f'file://{tmp_path}/d'))


def test_legacy_metadata_false_writes_and_leaves_no_pickle(tmp_path):
    url = f'file://{tmp_path}/d'
    write_dataset(url, AllCodecs, ROWS[:3], legacy_metadata=False)
    assert keys.UNISCHEMA_KEY not in _stored_metadata(tmp_path / 'd')
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        assert [int(r.id) for r in reader] == [0, 1, 2]
    # Rewriting the metadata without the entry also drops an entry left by an earlier write.
    fs = pafs.LocalFileSystem()
    write_dataset_metadata(fs, str(tmp_path / 'd'), AllCodecs)
    assert keys.UNISCHEMA_KEY in _stored_metadata(tmp_path / 'd')
    write_dataset_metadata(fs, str(tmp_path / 'd'), AllCodecs, legacy_metadata=False)
    assert keys.UNISCHEMA_KEY not in _stored_metadata(tmp_path / 'd')


def test_unexpressible_schema_writes_the_metadata_without_the_entry(tmp_path, caplog):
    class Odd(ScalarCodec):
        def arrow_type(self):
            return pa.duration('s')

    plain = Unischema('S', [UnischemaField('id', np.int64, (), None, False)])
    write_dataset(f'file://{tmp_path}/odd', plain, [{'id': 1}], legacy_metadata=False)
    odd = Unischema('S', [UnischemaField('id', np.int64, (), Odd(pa.int64()), False)])
    with caplog.at_level(logging.WARNING, logger='petastorm.metadata.write'):
        write_dataset_metadata(pafs.LocalFileSystem(), str(tmp_path / 'odd'), odd)
    assert 'not writing the Petastorm 0.x schema entry' in caplog.text
    metadata = _stored_metadata(tmp_path / 'odd')
    assert keys.UNISCHEMA_KEY not in metadata
    assert keys.SCHEMA_JSON_KEY in metadata


@pytest.mark.spark
def test_materialize_dataset_stores_the_legacy_entry(spark, tmp_path):
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row

    schema = Unischema('Small', [AllCodecs.id, AllCodecs.string, AllCodecs.decimal, AllCodecs.image_png,
                                 AllCodecs.ndarray_var_uint8])
    rows = [{k: r[k] for k in schema.fields} for r in ROWS[:4]]
    for legacy, name in ((True, 'on'), (False, 'off')):
        url = f'file://{tmp_path}/{name}'
        with materialize_dataset(spark, url, schema, legacy_metadata=legacy):
            spark.createDataFrame([dict_to_spark_row(schema, r) for r in rows], schema.as_spark_schema()) \
                .coalesce(1).write.parquet(url)
        metadata = _stored_metadata(tmp_path / name)
        if legacy:
            _assert_same_schema(schema, unischema_from_legacy_pickle(metadata[keys.UNISCHEMA_KEY]))
        else:
            assert keys.UNISCHEMA_KEY not in metadata


@pytest.mark.spark
@pytest.mark.legacy
def test_petastorm_0_13_1_reads_what_materialize_dataset_wrote(spark, tmp_path):
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row

    python = _anchor_python()
    schema = Unischema('Small', [AllCodecs.id, AllCodecs.string, AllCodecs.decimal, AllCodecs.image_png,
                                 AllCodecs.ndarray_var_uint8])
    rows = [{k: r[k] for k in schema.fields} for r in ROWS[:4]]
    url = f'file://{tmp_path}/spark'
    with materialize_dataset(spark, url, schema):
        spark.createDataFrame([dict_to_spark_row(schema, r) for r in rows], schema.as_spark_schema()) \
            .coalesce(2).write.parquet(url)
    theirs = {row['id']['value']: row for row in _read_with_petastorm(python, url, tmp_path)['rows']}
    assert sorted(theirs) == [0, 1, 2, 3]
    for r in rows:
        row = theirs[r['id']]
        assert row['string'] == {'type': 'str_', 'value': r['string']}
        assert decimal.Decimal(row['decimal']['value']) == r['decimal']
        np.testing.assert_array_equal(_decode(row['image_png']), r['image_png'])
        np.testing.assert_array_equal(_decode(row['ndarray_var_uint8']), r['ndarray_var_uint8'])


# ------------------------------------------------------------------ read by the original Petastorm 0.13.1

_READ_WITH_PETASTORM = textwrap.dedent('''
    import base64, decimal, json, sys
    import numpy as np
    import petastorm
    from petastorm import make_reader

    def enc(v):
        if v is None:
            return None
        if isinstance(v, np.ndarray):
            return {'dtype': v.dtype.str, 'shape': list(v.shape), 'b64': base64.b64encode(v.tobytes()).decode()}
        if isinstance(v, decimal.Decimal):
            return {'type': 'Decimal', 'value': str(v)}
        return {'type': type(v).__name__, 'value': v.item() if isinstance(v, np.generic) else v}

    out = {'version': petastorm.__version__, 'rows': []}
    with make_reader(sys.argv[1], reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        out['schema'] = str(reader.schema)
        for row in reader:
            out['rows'].append({k: enc(v) for k, v in row._asdict().items()})
    print(json.dumps(out))
''')


def _anchor_python() -> pathlib.Path:
    python = ANCHOR_VENV / 'bin' / 'python'
    if not SETUP_SCRIPT.is_file():
        pytest.skip(f'the shared benchmark directory ({SETUP_SCRIPT.parent}) is absent: cannot build the '
                    f'Petastorm 0.13.1 side environment')
    if not python.is_file():
        try:
            subprocess.run(['bash', str(SETUP_SCRIPT), str(ANCHOR_VENV)], check=True, capture_output=True,
                           timeout=300)
        except (OSError, subprocess.SubprocessError) as err:
            pytest.skip(f'could not build the Petastorm 0.13.1 side environment at {ANCHOR_VENV}: {err}')
    if not python.is_file():
        pytest.skip(f'the Petastorm 0.13.1 side environment at {ANCHOR_VENV} has no python')
    return python


def _read_with_petastorm(python: pathlib.Path, url: str, tmp_path: pathlib.Path) -> dict:
    script = tmp_path / 'read_with_petastorm.py'
    script.write_text(_READ_WITH_PETASTORM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'VIRTUAL_ENV'))}
    done = subprocess.run([str(python), str(script), url], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result['version'] == '0.13.1'
    return result


def _decode(value):
    if value is None or 'b64' not in value:
        return value
    return np.frombuffer(base64.b64decode(value['b64']), dtype=value['dtype']).reshape(value['shape'])


@pytest.mark.legacy
def test_petastorm_0_13_1_reads_what_we_wrote(tmp_path):
    python = _anchor_python()
    url = f'file://{tmp_path}/all_codecs'
    write_dataset(url, AllCodecs, ROWS, row_group_size_mb=0.002)  # several row groups
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        ours = {int(r.id): r._asdict() for r in reader}
    result = _read_with_petastorm(python, url, tmp_path)
    assert 'CompressedImageCodec(\'jpeg\', 90)' in result['schema']
    theirs = {row['id']['value']: row for row in result['rows']}
    assert sorted(theirs) == list(range(len(ROWS)))
    for written in ROWS:
        row = theirs[written['id']]
        assert list(row) == list(AllCodecs.fields)
        for name, field in AllCodecs.fields.items():
            expected, got = written[name], row[name]
            if expected is None:
                assert got is None, name
            elif field.shape:
                got = _decode(got)
                assert got.dtype == expected.dtype, name
                assert got.shape == np.shape(expected), name
                if name == 'image_jpeg':
                    ours_jpeg = ours[written['id']][name]
                    assert np.abs(got.astype(int) - ours_jpeg.astype(int)).max() <= JPEG_TOLERANCE, name
                    assert np.abs(got.astype(int) - expected.astype(int)).max() <= 3 * JPEG_TOLERANCE, name
                else:
                    np.testing.assert_array_equal(got, expected, err_msg=name)
            elif field.numpy_dtype is decimal.Decimal:
                assert got['type'] == 'Decimal', name
                assert decimal.Decimal(got['value']) == expected, name
            else:
                assert got['type'] == field.numpy_dtype.__name__ or \
                    np.dtype(getattr(np, got['type'])) == np.dtype(field.numpy_dtype), (name, got)
                assert field.numpy_dtype(got['value']) == field.numpy_dtype(expected), name
