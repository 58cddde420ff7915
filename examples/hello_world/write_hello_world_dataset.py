"""Writes the hello-world dataset without Spark (``petastorm.write_dataset``), then reads it back.

Run it with ``python examples/hello_world/write_hello_world_dataset.py [OUTPUT_URL]``; the dataset goes to
``file:///tmp/hello_world_dataset`` unless another URL is given (what was there is replaced). It is the dataset
``generate_hello_world_dataset.py`` writes with Spark: the same schema, ten rows of random images and arrays.
``python_hello_world.py``, ``pytorch_hello_world.py`` and ``tensorflow_hello_world.py`` read it.
"""

import argparse

import numpy as np
import pyarrow as pa

from petastorm import make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import get_schema_from_dataset_url, load_row_groups
from petastorm.unischema import Unischema, UnischemaField

# Spark's ScalarCodec(IntegerType()) stores the same column; the Arrow type needs no Spark.
HelloWorldSchema = Unischema('HelloWorldSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png'), False),
    UnischemaField('array_4d', np.uint8, (None, 128, 30, None), NdarrayCodec(), False),
])


def row_generator(x, rng):
    """One row of the dataset: its id and random values."""
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
    with make_reader(output_url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        for row in reader:
            print(f'read id={row.id} image1 {row.image1.shape} {row.image1.dtype} '
                  f'array_4d {row.array_4d.shape} {row.array_4d.dtype}')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Write the hello-world dataset without Spark and read it back.')
    parser.add_argument('output_url', nargs='?', default='file:///tmp/hello_world_dataset',
                        help='dataset URL (default: %(default)s)')
    main(parser.parse_args().output_url)
