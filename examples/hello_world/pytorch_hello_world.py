"""Reads the hello-world dataset into PyTorch batches with ``petastorm.pytorch.DataLoader``.

Write the dataset first (``generate_hello_world_dataset.py`` with Spark, or ``write_hello_world_dataset.py``
without), then run ``python examples/hello_world/pytorch_hello_world.py [DATASET_URL]``.
"""

import argparse

from petastorm import make_reader
from petastorm.pytorch import DataLoader


def pytorch_hello_world(dataset_url='file:///tmp/hello_world_dataset'):
    with DataLoader(make_reader(dataset_url), batch_size=4) as train_loader:
        for batch in train_loader:
            # Each batch maps field names to tensors whose first dimension is the batch.
            print(batch['id'], batch['image1'].shape)


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='Batch the hello-world dataset with the PyTorch DataLoader.')
    parser.add_argument('dataset_url', nargs='?', default='file:///tmp/hello_world_dataset',
                        help='dataset URL (default: %(default)s)')
    pytorch_hello_world(parser.parse_args().dataset_url)
