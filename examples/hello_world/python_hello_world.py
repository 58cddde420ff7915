"""Reads the hello-world dataset with plain Python: one row at a time, then one row group at a time.

Write the dataset first (``generate_hello_world_dataset.py`` with Spark, or ``write_hello_world_dataset.py``
without), then run ``python examples/hello_world/python_hello_world.py [DATASET_URL]``.
"""

import argparse

from petastorm import make_batch_reader, make_reader


def python_hello_world(dataset_url='file:///tmp/hello_world_dataset'):
    # make_reader yields one namedtuple per row, every field decoded (images and arrays as numpy arrays).
    with make_reader(dataset_url) as reader:
        for row in reader:
            print(row.id, row.image1.shape, row.array_4d.shape)

    # make_batch_reader yields one namedtuple of column arrays per row group (images and arrays decoded too);
    # here only the scalar column is read.
    with make_batch_reader(dataset_url, schema_fields=['id']) as reader:
        for batch in reader:
            print(batch.id)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Print the rows of the hello-world dataset.')
    parser.add_argument('dataset_url', nargs='?', default='file:///tmp/hello_world_dataset',
                        help='dataset URL (default: %(default)s)')
    python_hello_world(parser.parse_args().dataset_url)
