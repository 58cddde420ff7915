"""Writes the hello-world dataset with the Spark-free writer, then reads it back.

Run with `make demo`. The dataset goes to /tmp/hello_world_dataset (or the URL given as the first argument).
"""

import sys

import numpy as np

from petastorm import write_dataset
from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url, load_row_groups
from petastorm.unischema import Unischema, UnischemaField

try:
    from pyspark.sql.types import IntegerType

    ID_TYPE = IntegerType()
except ImportError:  # the demo runs without Spark: the same column type, given as an Arrow type
    import pyarrow as pa

    ID_TYPE = pa.int32()

HelloWorldSchema = Unischema('HelloWorldSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(ID_TYPE), False),
    UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png'), False),
    UnischemaField('array_4d', np.uint8, (None, 128, 30, None), NdarrayCodec(), False),
])


def row_generator(x, rng):
    return {'id': x,
            'image1': rng.integers(0, 255, dtype=np.uint8, size=(128, 256, 3)),
            'array_4d': rng.integers(0, 255, dtype=np.uint8, size=(4, 128, 30, 3))}


def main(output_url='file:///tmp/hello_world_dataset', rows_count=10):
    rng = np.random.default_rng(0)
    result = write_dataset(output_url, HelloWorldSchema, (row_generator(i, rng) for i in range(rows_count)),
                           row_group_size_mb=1, mode='overwrite')
    print(f'wrote {result.num_rows} rows in {len(result.files)} file(s) to {output_url}')
    print(get_schema_from_dataset_url(output_url))
    pieces = load_row_groups(output_url)
    print(f'{len(pieces)} row group(s), {sum(p.num_rows for p in pieces)} rows')
    try:
        from petastorm import make_reader
    except ImportError:
        return
    with make_reader(output_url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        for row in reader:
            print(f'read id={row.id} image1 {row.image1.shape} {row.image1.dtype} '
                  f'array_4d {row.array_4d.shape} {row.array_4d.dtype}')


if __name__ == '__main__':
    main(*sys.argv[1:2])
