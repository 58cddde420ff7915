"""Writes an MNIST-style Petastorm dataset of real handwritten digits (scikit-learn's 8x8 digits, upsampled).

The images are scikit-learn's ``load_digits`` scans (1,797 digits, 8x8, values 0..16), scaled to 0..255,
enlarged 3x to 24x24 and framed with a 2-pixel border to 28x28 uint8, like MNIST. Each row holds ``idx``,
``digit`` (the label) and ``image``; a seeded split writes ``<output>/train`` and ``<output>/test``.

    python examples/mnist/generate_petastorm_mnist.py --output-url file:///tmp/mnist
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

MnistSchema = Unischema('MnistSchema', [
    UnischemaField('idx', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('digit', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (28, 28), NdarrayCodec(), False),
])


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)``: every scikit-learn digit as a 28x28 uint8 image, and its label."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    scaled = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (n, 8, 8), 0..255
    enlarged = scaled.repeat(3, axis=1).repeat(3, axis=2)  # (n, 24, 24)
    images = np.pad(enlarged, ((0, 0), (2, 2), (2, 2)))  # (n, 28, 28)
    return images, digits.target.astype(np.int64)


def generate(output_url: str = 'file:///tmp/mnist', test_fraction: float = 0.2, seed: int = 0,
             row_group_size_mb: float = 0.25, max_rows: int | None = None) -> dict[str, int]:
    """Write the train and test datasets under ``output_url``; returns the number of rows of each.

    ``max_rows`` keeps only the first digits (for quick runs).
    """
    images, labels = digit_images()
    if max_rows is not None:
        images, labels = images[:max_rows], labels[:max_rows]
    order = np.random.default_rng(seed).permutation(len(labels))
    test_count = int(round(len(labels) * test_fraction))
    splits = {'train': order[test_count:], 'test': order[:test_count]}
    counts = {}
    for name, indexes in splits.items():
        rows = ({'idx': int(i), 'digit': int(labels[i]), 'image': images[i]} for i in np.sort(indexes))
        result = write_dataset(f'{output_url.rstrip("/")}/{name}', MnistSchema, rows,
                               row_group_size_mb=row_group_size_mb, mode='overwrite')
        counts[name] = result.num_rows
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('-o', '--output-url', default='file:///tmp/mnist',
                        help='directory URL; train/ and test/ datasets are written under it')
    parser.add_argument('--test-fraction', type=float, default=0.2)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    counts = generate(args.output_url, args.test_fraction, args.seed)
    print(f'wrote {counts["train"]} training and {counts["test"]} test digits under {args.output_url}')


if __name__ == '__main__':
    main()
