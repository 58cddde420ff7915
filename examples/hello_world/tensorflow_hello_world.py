"""Reads the hello-world dataset as a ``tf.data.Dataset`` with ``petastorm.tf_utils.make_petastorm_dataset``.

Write the dataset first (``generate_hello_world_dataset.py`` with Spark, or ``write_hello_world_dataset.py``
without), then run ``python examples/hello_world/tensorflow_hello_world.py [DATASET_URL]`` (needs
``pip install 'neo-petastorm[tf]'``).
"""

import argparse

from petastorm import make_reader
from petastorm.tf_utils import make_petastorm_dataset


def tensorflow_hello_world(dataset_url='file:///tmp/hello_world_dataset'):
    with make_reader(dataset_url, num_epochs=1) as reader:
        dataset = make_petastorm_dataset(reader)
        # Eager iteration: each element is the row's namedtuple of tensors with the schema's dtypes and shapes.
        for row in dataset:
            print(int(row.id), tuple(row.image1.shape), tuple(row.array_4d.shape))


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Read the hello-world dataset as a tf.data.Dataset.')
    parser.add_argument('dataset_url', nargs='?', default='file:///tmp/hello_world_dataset',
                        help='dataset URL (default: %(default)s)')
    tensorflow_hello_world(parser.parse_args().dataset_url)
