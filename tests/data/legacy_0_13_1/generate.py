"""Regenerates the legacy golden datasets in this directory.

These datasets are written by the *original* Petastorm 0.13.1 (with PySpark) so that the
test-suite can check that datasets produced by that release keep being readable.  This
script must be run with an interpreter that has petastorm==0.13.1 and pyspark installed,
e.g.::

    /tmp/petastorm-anchor-venv/bin/python tests/data/legacy_0_13_1/generate.py

It deletes and rewrites every dataset directory plus the ``*.expected.json`` files and
``manifest.json``.  See README.md in this directory for the file formats.
"""

import base64
import datetime
import decimal
import json
import os
import pickletools
import shutil
import sys
import time
import warnings

import numpy as np
import pyarrow
import pyarrow.parquet as pq
import pyspark
from pyspark.sql import SparkSession
from pyspark.sql import types as T

import petastorm
import petastorm.selectors
from petastorm import make_batch_reader, make_reader
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.etl.rowgroup_indexers import FieldNotNullIndexer, SingleFieldIndexer
from petastorm.etl.rowgroup_indexing import build_rowgroup_index, get_row_group_indexes
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row

warnings.filterwarnings('ignore', category=FutureWarning)
warnings.filterwarnings('ignore', category=DeprecationWarning)

HERE = os.path.dirname(os.path.abspath(__file__))

UNISCHEMA_KEY = b'dataset-toolkit.unischema.v1'
ROWGROUPS_INDEX_KEY = b'dataset-toolkit.rowgroups_index.v1'

IMG_H, IMG_W = 8, 6

NOTES = []  # human readable notes about things that could not be written


# --------------------------------------------------------------------------------------------
# JSON encoding of values (lossless, no pickle).  Documented in README.md.
# --------------------------------------------------------------------------------------------

def _encode_float(x):
    # repr() of a Python float is the shortest string that round-trips exactly.
    return float(x)


def encode_value(v):
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        desc = {'dtype': str(v.dtype), 'shape': list(v.shape)}
        if v.dtype.kind in ('U', 'S', 'O'):
            desc['list'] = [_plain(x) for x in v.ravel(order='C').tolist()]
            desc['list'] = _nest(desc['list'], v.shape)
        else:
            desc['b64'] = base64.b64encode(np.ascontiguousarray(v).tobytes(order='C')).decode('ascii')
        return {'ndarray': desc}
    if isinstance(v, np.datetime64):
        return {'datetime64': str(v), 'dtype': str(v.dtype)}
    if isinstance(v, np.generic):
        kind = v.dtype.kind
        if kind == 'f':
            value = _encode_float(v)
        elif kind == 'b':
            value = bool(v)
        elif kind in ('i', 'u'):
            value = int(v)
        elif kind in ('U', 'S'):
            value = v.item() if kind == 'U' else base64.b64encode(v.item()).decode('ascii')
        else:
            raise TypeError(f'Unsupported numpy scalar {v!r} ({type(v)})')
        return {'scalar': {'dtype': str(v.dtype), 'value': value}}
    if isinstance(v, decimal.Decimal):
        return {'decimal': str(v)}
    if isinstance(v, bool):
        return {'bool': v}
    if isinstance(v, int):
        return {'int': v}
    if isinstance(v, float):
        return {'float': v}
    if isinstance(v, str):
        return {'str': v}
    if isinstance(v, (bytes, bytearray)):
        return {'bytes_b64': base64.b64encode(bytes(v)).decode('ascii')}
    if isinstance(v, datetime.datetime):
        return {'datetime': v.isoformat()}
    raise TypeError(f'Unsupported value {v!r} ({type(v)})')


def _plain(x):
    if isinstance(x, bytes):
        return base64.b64encode(x).decode('ascii')
    return x


def _nest(flat, shape):
    if len(shape) <= 1:
        return flat
    step = int(np.prod(shape[1:]))
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _type_name(t):
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', repr(t))}"


def describe_field(f):
    return {
        'name': f.name,
        'numpy_dtype': _type_name(f.numpy_dtype),
        'shape': None if f.shape is None else [None if d is None else int(d) for d in f.shape],
        'codec': None if f.codec is None else str(f.codec),
        'nullable': bool(f.nullable),
        # ScalarCodec's str() drops type parameters (e.g. DecimalType precision/scale); keep them here.
        'spark_type': repr(f.codec._spark_type) if hasattr(f.codec, '_spark_type') else None,
    }


# --------------------------------------------------------------------------------------------
# Pickle inspection (opcode level, the payload is never executed here).
# --------------------------------------------------------------------------------------------

_STRING_OPS = {'SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8', 'UNICODE',
               'SHORT_BINSTRING', 'BINSTRING', 'STRING'}


def pickle_globals(data):
    """Returns (protocol, sorted list of 'module.qualname' referenced by GLOBAL/STACK_GLOBAL/INST)."""
    protocol = None
    found = set()
    memo = {}
    recent = []  # values pushed by string / memo-get opcodes (approximate stack tail)
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name == 'PROTO':
            protocol = arg
        if name in _STRING_OPS:
            recent.append(arg)
        elif name in ('BINGET', 'LONG_BINGET', 'GET'):
            recent.append(memo.get(int(arg)))
        elif name in ('MEMOIZE', 'BINPUT', 'LONG_BINPUT', 'PUT'):
            key = len(memo) if name == 'MEMOIZE' else int(arg)
            memo[key] = recent[-1] if recent else None
            continue
        elif name == 'STACK_GLOBAL':
            module, qualname = recent[-2], recent[-1]
            found.add(f'{module}.{qualname}')
            recent.append(None)
        elif name in ('GLOBAL', 'INST'):
            module, qualname = arg.split(' ', 1)
            found.add(f'{module}.{qualname}')
            recent.append(None)
        else:
            recent.append(None)
    if protocol is None:
        protocol = 0
    return protocol, sorted(found)


# --------------------------------------------------------------------------------------------
# Dataset definitions
# --------------------------------------------------------------------------------------------

AllTypesSchema = Unischema('AllTypesSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('int8', np.int8, (), ScalarCodec(T.ByteType()), False),
    UnischemaField('int16', np.int16, (), ScalarCodec(T.ShortType()), False),
    UnischemaField('int32', np.int32, (), ScalarCodec(T.IntegerType()), False),
    UnischemaField('uint8', np.uint8, (), ScalarCodec(T.ShortType()), False),
    UnischemaField('float32', np.float32, (), ScalarCodec(T.FloatType()), False),
    UnischemaField('float64', np.float64, (), ScalarCodec(T.DoubleType()), False),
    UnischemaField('bool', np.bool_, (), ScalarCodec(T.BooleanType()), False),
    UnischemaField('string', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('decimal', decimal.Decimal, (), ScalarCodec(T.DecimalType(10, 9)), False),
    UnischemaField('nullable_int', np.int32, (), ScalarCodec(T.IntegerType()), True),
    UnischemaField('nullable_string', np.str_, (), ScalarCodec(T.StringType()), True),
    UnischemaField('image_png', np.uint8, (IMG_H, IMG_W, 3), CompressedImageCodec('png'), False),
    UnischemaField('image_gray_png', np.uint8, (IMG_H, IMG_W), CompressedImageCodec('png'), False),
    UnischemaField('image_uint16_png', np.uint16, (IMG_H, IMG_W), CompressedImageCodec('png'), False),
    UnischemaField('image_jpeg', np.uint8, (IMG_H, IMG_W, 3), CompressedImageCodec('jpeg', quality=90),
                   False),
    UnischemaField('ndarray_float32', np.float32, (2, 3), NdarrayCodec(), False),
    UnischemaField('ndarray_var_uint8', np.uint8, (None, 4), NdarrayCodec(), False),
    UnischemaField('ndarray_string', np.str_, (None,), NdarrayCodec(), False),
    UnischemaField('compressed_ndarray_int32', np.int32, (3, 3), CompressedNdarrayCodec(), False),
    UnischemaField('nullable_ndarray', np.float64, (4,), NdarrayCodec(), True),
])

TimestampField = UnischemaField('timestamp', np.datetime64, (), ScalarCodec(T.TimestampType()), False)

_WORDS = ['alpha', 'beta', 'gamma', 'délta', 'ε-psilon', '', 'zeta zeta', '日本']


def all_types_row(i, timestamp_as):
    rng = np.random.RandomState(1000 + i)
    row = {
        'id': np.int64(i),
        'int8': np.int8(rng.randint(-128, 128)),
        'int16': np.int16(rng.randint(-32768, 32768)),
        'int32': np.int32(rng.randint(-2 ** 31, 2 ** 31, dtype=np.int64)),
        'uint8': np.uint8(rng.randint(0, 256)),
        'float32': np.float32(rng.randn()),
        'float64': np.float64(rng.randn() * 1e3),
        'bool': np.bool_(i % 3 == 0),
        'string': f'{_WORDS[i % len(_WORDS)]}_{i}',
        'decimal': decimal.Decimal(int(rng.randint(-9999999999, 9999999999, dtype=np.int64))).scaleb(-9),
        'nullable_int': None if i % 3 == 1 else np.int32(rng.randint(-1000, 1000)),
        'nullable_string': None if i % 4 == 2 else f'nullable_{i}',
        'image_png': rng.randint(0, 256, size=(IMG_H, IMG_W, 3)).astype(np.uint8),
        'image_gray_png': rng.randint(0, 256, size=(IMG_H, IMG_W)).astype(np.uint8),
        'image_uint16_png': rng.randint(0, 65536, size=(IMG_H, IMG_W)).astype(np.uint16),
        'image_jpeg': rng.randint(0, 256, size=(IMG_H, IMG_W, 3)).astype(np.uint8),
        'ndarray_float32': rng.randn(2, 3).astype(np.float32),
        'ndarray_var_uint8': rng.randint(0, 256, size=(i % 4, 4)).astype(np.uint8),
        'ndarray_string': np.array([_WORDS[(i + k) % len(_WORDS)] for k in range(i % 3)], dtype=np.str_),
        'compressed_ndarray_int32': rng.randint(-10 ** 6, 10 ** 6, size=(3, 3)).astype(np.int32),
        'nullable_ndarray': None if i % 5 == 3 else rng.randn(4).astype(np.float64),
    }
    if timestamp_as is not None:
        # 2021-01-01T00:00:00 UTC plus i days, i hours and i*1000+7 microseconds.
        base = datetime.datetime(2021, 1, 1) + datetime.timedelta(days=i, hours=i, microseconds=i * 1000 + 7)
        row['timestamp'] = np.datetime64(base, 'us') if timestamp_as == 'datetime64' else base
    return row


PartitionedSchema = Unischema('PartitionedSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('partition_key', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('matrix', np.float32, (2, 2), NdarrayCodec(), False),
])


def partitioned_row(i):
    rng = np.random.RandomState(2000 + i)
    return {
        'id': np.int64(i),
        'partition_key': f'p_{i % 4}',
        'matrix': rng.randn(2, 2).astype(np.float32),
    }


IndexedSchema = Unischema('IndexedSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('label', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('image', np.uint8, (IMG_H, IMG_W, 3), CompressedImageCodec('png'), True),
    UnischemaField('vector', np.float32, (4,), NdarrayCodec(), False),
])

INDEXED_ROWS = 16
INDEXED_FILES = 4


def indexed_row(i):
    rng = np.random.RandomState(3000 + i)
    return {
        'id': np.int64(i),
        'label': ['cat', 'dog', 'bird'][i % 3],
        # The last file (ids 12..15) has no images at all, so 'image_not_null' excludes its piece.
        'image': None if i >= 12 else rng.randint(0, 256, size=(IMG_H, IMG_W, 3)).astype(np.uint8),
        'vector': rng.randn(4).astype(np.float32),
    }


SummarySchema = Unischema('SummarySchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(T.StringType()), False),
    UnischemaField('tensor', np.int16, (2, 3), NdarrayCodec(), False),
])


def summary_row(i):
    rng = np.random.RandomState(4000 + i)
    return {
        'id': np.int64(i),
        'name': f'row_{i:02d}',
        'tensor': rng.randint(-500, 500, size=(2, 3)).astype(np.int16),
    }


# --------------------------------------------------------------------------------------------
# Writing helpers
# --------------------------------------------------------------------------------------------

def _url(path):
    return 'file://' + path


def _fresh_dir(name):
    path = os.path.join(HERE, name)
    if os.path.exists(path):
        shutil.rmtree(path)
    return path


def _cleanup_spark_files(path):
    """Removes Spark bookkeeping files (.crc checksums and _SUCCESS markers)."""
    for root, _dirs, files in os.walk(path):
        for f in files:
            if f.endswith('.crc') or f == '_SUCCESS':
                os.remove(os.path.join(root, f))


def write_petastorm(spark, name, schema, rows, num_files, partition_by=None, use_summary_metadata=False):
    path = _fresh_dir(name)
    url = _url(path)
    encoded = [dict_to_spark_row(schema, r) for r in rows]
    with materialize_dataset(spark, url, schema, row_group_size_mb=1,
                             use_summary_metadata=use_summary_metadata):
        rdd = spark.sparkContext.parallelize(encoded, num_files)
        df = spark.createDataFrame(rdd, schema.as_spark_schema())
        writer = df.write.mode('overwrite')
        if partition_by:
            writer = writer.partitionBy(partition_by)
        writer.parquet(url)
    return path, url


def write_all_types(spark, n=20):
    """Writes 'all_types'.  The timestamp field is attempted first with np.datetime64 values, then with
    datetime.datetime values (the field's numpy_dtype stays np.datetime64), then dropped."""
    ts_schema = Unischema('AllTypesSchema', list(AllTypesSchema.fields.values()) + [TimestampField])
    for timestamp_as in ('datetime64', 'datetime'):
        try:
            rows = [all_types_row(i, timestamp_as) for i in range(n)]
            path, url = write_petastorm(spark, 'all_types', ts_schema, rows, 2)
            # Make sure the original reader can read it back too.
            with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
                for _ in reader:
                    pass
            if timestamp_as != 'datetime64':
                NOTES.append('all_types.timestamp: values had to be given to dict_to_spark_row as '
                             'datetime.datetime (Spark rejects numpy.datetime64 for TimestampType); '
                             'the field is still declared with numpy_dtype numpy.datetime64.')
            return path, url
        except Exception as e:  # depends on the original library's capabilities
            msg = [line for line in str(e).splitlines() if 'Error' in line or 'error' in line]
            detail = (msg[-1] if msg else str(e).splitlines()[0])[:300]
            NOTES.append(f'all_types.timestamp given as {timestamp_as} values could not be written/read by '
                         f'petastorm 0.13.1: {detail}')
    rows = [all_types_row(i, None) for i in range(n)]
    return write_petastorm(spark, 'all_types', AllTypesSchema, rows, 2)


def write_plain_parquet(spark, n=12):
    path = _fresh_dir('plain_parquet')
    schema = T.StructType([
        T.StructField('id', T.LongType(), False),
        T.StructField('int_col', T.IntegerType(), False),
        T.StructField('float_col', T.DoubleType(), False),
        T.StructField('string_col', T.StringType(), False),
        T.StructField('list_col', T.ArrayType(T.IntegerType(), False), False),
    ])
    rows = []
    for i in range(n):
        rng = np.random.RandomState(5000 + i)
        rows.append((i, int(rng.randint(-1000, 1000)), float(rng.randn()), f'str_{i}',
                     [int(x) for x in rng.randint(-50, 50, size=3)]))
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), schema)
    df.write.mode('overwrite').parquet(_url(path))
    return path, _url(path)


# --------------------------------------------------------------------------------------------
# Expected values / manifest
# --------------------------------------------------------------------------------------------

def read_expected_rows(url):
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        schema_fields = list(reader.schema.fields.values())
        rows = [r._asdict() for r in reader]
    rows.sort(key=lambda r: int(r['id']))
    return schema_fields, rows


def write_expected(name, schema_fields, rows, extra=None):
    doc = {
        'schema': [describe_field(f) for f in schema_fields],
        'rows': [{f.name: encode_value(r[f.name]) for f in schema_fields} for r in rows],
    }
    if extra:
        doc.update(extra)
    with open(os.path.join(HERE, name + '.expected.json'), 'w', encoding='utf-8') as fh:
        json.dump(doc, fh, indent=1, ensure_ascii=False, sort_keys=False)
        fh.write('\n')


def read_batch_expected(url):
    columns = {}
    with make_batch_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        schema_fields = list(reader.schema.fields.values())
        for batch in reader:
            for k, v in batch._asdict().items():
                columns.setdefault(k, []).append(v)
    columns = {k: np.concatenate(v) for k, v in columns.items()}
    order = np.argsort(columns['id'], kind='stable')
    columns = {k: v[order] for k, v in columns.items()}
    n = len(order)
    rows = [{k: columns[k][i] for k in columns} for i in range(n)]
    column_dtypes = {k: {'dtype': str(v.dtype), 'shape': list(v.shape)} for k, v in columns.items()}
    return schema_fields, rows, column_dtypes


def _kv_keys(path):
    md = pq.read_metadata(path).metadata or {}
    return sorted(k.decode('utf-8') for k in md)


def manifest_entry(path, url, petastorm_dataset=True):
    data_files = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in files:
            if f.startswith('.') or f.startswith('_'):
                continue
            data_files.append(os.path.relpath(os.path.join(root, f), path))
    data_files.sort()
    row_groups = {}
    total_rows = 0
    for rel in data_files:
        md = pq.read_metadata(os.path.join(path, rel))
        row_groups[rel] = md.num_row_groups
        total_rows += md.num_rows
    entry = {
        'data_files': data_files,
        'row_groups_per_file': row_groups,
        'total_rows': total_rows,
        'all_files': sorted(os.path.relpath(os.path.join(r, f), path)
                            for r, _d, fs in os.walk(path) for f in fs),
    }
    common = os.path.join(path, '_common_metadata')
    summary = os.path.join(path, '_metadata')
    entry['common_metadata_keys'] = _kv_keys(common) if os.path.exists(common) else None
    entry['metadata_keys'] = _kv_keys(summary) if os.path.exists(summary) else None
    if os.path.exists(common):
        kv = pq.read_metadata(common).metadata or {}
        pickles = {}
        for key in (UNISCHEMA_KEY, ROWGROUPS_INDEX_KEY):
            if key in kv:
                protocol, names = pickle_globals(kv[key])
                pickles[key.decode('utf-8')] = {'pickle_protocol': protocol, 'globals': names}
        entry['pickles'] = pickles
        rg_key = b'dataset-toolkit.num_row_groups_per_file.v1'
        if rg_key in kv:
            entry['num_row_groups_per_file_value'] = json.loads(kv[rg_key].decode('utf-8'))
    return entry


def row_group_index_contents(path):
    dataset = pq.ParquetDataset(path, validate_schema=False, use_legacy_dataset=True)
    indexes = get_row_group_indexes(dataset)
    out = {}
    for index_name in sorted(indexes):
        indexer = indexes[index_name]
        values = {}
        for value in indexer.indexed_values:
            values[str(value)] = sorted(int(p) for p in indexer.get_row_group_indexes(value))
        out[index_name] = {
            'indexer_class': _type_name(type(indexer)),
            'column_names': list(indexer.column_names),
            'values': dict(sorted(values.items())),
        }
    return out


def selector_examples(url):
    """Ids returned by the original reader for a few rowgroup_selector queries."""
    examples = [
        ('SingleIndexSelector', 'id_index', [3, 13]),
        ('SingleIndexSelector', 'label_index', ['cat']),
        ('SingleIndexSelector', 'image_not_null', ['Field is Not Null']),
    ]
    out = []
    for cls_name, index_name, values in examples:
        selector = getattr(petastorm.selectors, cls_name)(index_name, values)
        with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False,
                         rowgroup_selector=selector) as reader:
            ids = sorted(int(r.id) for r in reader)
        out.append({'selector': cls_name, 'index_name': index_name, 'values': values, 'ids': ids})
    return out


# --------------------------------------------------------------------------------------------

def main():
    if petastorm.__version__ != '0.13.1':
        raise SystemExit(f'needs the original petastorm 0.13.1, found {petastorm.__version__} '
                         f'at {petastorm.__file__}')
    # Deterministic timestamps: make Python, the Python workers and the JVM all run in UTC.
    os.environ['TZ'] = 'UTC'
    time.tzset()
    os.environ.setdefault('PYSPARK_PYTHON', sys.executable)
    os.environ.setdefault('PYSPARK_DRIVER_PYTHON', sys.executable)
    spark = (SparkSession.builder
             .master('local[2]')
             .appName('petastorm-legacy-golden')
             .config('spark.driver.memory', '1g')
             .config('spark.ui.enabled', 'false')
             .config('spark.sql.shuffle.partitions', '2')
             .config('spark.sql.session.timeZone', 'UTC')
             .config('spark.driver.extraJavaOptions', '-Duser.timezone=UTC')
             .config('spark.executor.extraJavaOptions', '-Duser.timezone=UTC')
             .getOrCreate())
    spark.sparkContext.setLogLevel('ERROR')

    written = {}
    written['all_types'] = write_all_types(spark)
    written['partitioned'] = write_petastorm(spark, 'partitioned', PartitionedSchema,
                                             [partitioned_row(i) for i in range(16)], 2,
                                             partition_by='partition_key')
    written['with_index'] = write_petastorm(spark, 'with_index', IndexedSchema,
                                            [indexed_row(i) for i in range(INDEXED_ROWS)], INDEXED_FILES)
    build_rowgroup_index(written['with_index'][1], spark.sparkContext, [
        SingleFieldIndexer('id_index', 'id'),
        SingleFieldIndexer('label_index', 'label'),
        FieldNotNullIndexer('image_not_null', 'image'),
    ])
    written['summary_metadata'] = write_petastorm(spark, 'summary_metadata', SummarySchema,
                                                  [summary_row(i) for i in range(10)], 2,
                                                  use_summary_metadata=True)
    written['plain_parquet'] = write_plain_parquet(spark)
    spark.stop()

    for path, _ in written.values():
        _cleanup_spark_files(path)

    manifest = {
        'written_by': {
            'petastorm': petastorm.__version__,
            'pyspark': pyspark.__version__,
            'pyarrow': pyarrow.__version__,
            'numpy': np.__version__,
            'python': '.'.join(str(x) for x in sys.version_info[:3]),
        },
        'notes': NOTES,
        'datasets': {},
    }

    for name, (path, url) in written.items():
        entry = manifest_entry(path, url)
        if name == 'plain_parquet':
            fields, rows, column_dtypes = read_batch_expected(url)
            write_expected(name, fields, rows, {'reader': 'make_batch_reader',
                                                'column_dtypes': column_dtypes})
        else:
            fields, rows = read_expected_rows(url)
            write_expected(name, fields, rows, {'reader': 'make_reader'})
        entry['expected_rows'] = len(rows)
        if name == 'with_index':
            entry['row_group_indexes'] = row_group_index_contents(path)
            entry['selector_examples'] = selector_examples(url)
        manifest['datasets'][name] = entry

    with open(os.path.join(HERE, 'manifest.json'), 'w', encoding='utf-8') as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
        fh.write('\n')

    for note in NOTES:
        print('NOTE:', note)
    print('done')


if __name__ == '__main__':
    main()
