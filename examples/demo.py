"""The main job in one script: write a small image dataset without Spark, then train a torch model from it.

Run with ``make demo``, or ``python examples/demo.py [--rows N] [--epochs N] [--output-url URL]``.

1. ``petastorm.write_dataset`` writes ``--rows`` noisy 32x32 colour images, PNG-encoded, with their label: the
   quadrant that holds a bright square (0-3). The dataset goes to ``file:///tmp/petastorm_demo`` (replacing
   what was there), split into several row groups.
2. ``petastorm.pytorch.DataLoader`` over ``make_reader`` reads it back for ``--epochs`` epochs: a thread pool
   reads and decodes row groups, shuffled every epoch from a seed, rows shuffled inside them, and the loader
   collates batches of tensors.
3. A small convolutional network learns the quadrant. Every few steps the script prints the loss, the accuracy
   and the samples per second of the whole loop (reading, decoding, training), then a summary.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from petastorm import make_reader, write_dataset
from petastorm.codecs import CompressedImageCodec, ScalarCodec
from petastorm.pytorch import DataLoader
from petastorm.unischema import Unischema, UnischemaField

IMAGE_SIZE = 32

DemoSchema = Unischema('DemoSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (IMAGE_SIZE, IMAGE_SIZE, 3), CompressedImageCodec('png'), False),
    UnischemaField('label', np.int64, (), ScalarCodec(pa.int64()), False),
])


def make_rows(count: int, seed: int = 0):
    """Rows of noise with a brighter 4x4 square of a random colour in one quadrant; the label is that quadrant."""
    rng = np.random.default_rng(seed)
    half, side = IMAGE_SIZE // 2, 4
    for i in range(count):
        label = int(rng.integers(4))
        image = rng.integers(0, 192, size=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        top = half * (label // 2) + rng.integers(0, half - side)
        left = half * (label % 2) + rng.integers(0, half - side)
        image[top:top + side, left:left + side] = rng.integers(96, 256, size=3, dtype=np.uint8)
        yield {'id': i, 'image': image, 'label': label}


def make_model() -> nn.Module:
    """Two convolution blocks and a linear layer: 32x32x3 images in, four class scores out."""
    return nn.Sequential(
        nn.Conv2d(3, 8, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * (IMAGE_SIZE // 4) ** 2, 4))


def write(output_url: str, rows: int) -> None:
    start = time.perf_counter()
    result = write_dataset(output_url, DemoSchema, make_rows(rows), row_group_size_mb=0.5, mode='overwrite')
    row_groups = sum(len(sizes) for sizes in result.row_groups.values())
    print(f'wrote {result.num_rows:,} images ({IMAGE_SIZE}x{IMAGE_SIZE}x3 PNG) to {output_url} in '
          f'{time.perf_counter() - start:.1f} s: {len(result.files)} file(s), {row_groups} row groups')


def train(dataset_url: str, epochs: int, batch_size: int, workers_count: int, log_every: int) -> dict:
    """Train from the dataset; returns the samples, steps, seconds, samples/s and the last loss and accuracy."""
    torch.manual_seed(0)
    # The reader's threads decode PNGs on some cores; torch gets the others (more threads than free cores only
    # make torch's threads wait for each other).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) - workers_count))
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    reader = make_reader(dataset_url, num_epochs=epochs, seed=0, shuffle_rows=True,
                         reader_pool_type='thread', workers_count=workers_count)
    samples = steps = 0
    window_loss = window_correct = window_samples = 0.0
    last = {'loss': math.nan, 'accuracy': math.nan}
    start = time.perf_counter()
    with DataLoader(reader, batch_size=batch_size) as loader:
        for steps, batch in enumerate(loader, start=1):  # noqa: B007 - steps is read after the loop
            # batch['image'] is a (batch, 32, 32, 3) uint8 tensor; the network wants (batch, 3, 32, 32) floats.
            images = batch['image'].permute(0, 3, 1, 2).float().div_(255.0)
            labels = batch['label']
            scores = model(images)
            loss = loss_fn(scores, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            samples += len(labels)
            window_loss += loss.item() * len(labels)
            window_correct += (scores.argmax(dim=1) == labels).sum().item()
            window_samples += len(labels)
            if steps % log_every == 0:
                last = {'loss': window_loss / window_samples, 'accuracy': window_correct / window_samples}
                rate = samples / (time.perf_counter() - start)
                print(f'step {steps:4d}  samples {samples:6,}  loss {last["loss"]:.3f}  '
                      f'accuracy {100 * last["accuracy"]:5.1f}%  {rate:7,.0f} samples/s')
                window_loss = window_correct = window_samples = 0.0
    seconds = time.perf_counter() - start
    if window_samples:
        last = {'loss': window_loss / window_samples, 'accuracy': window_correct / window_samples}
    return {'samples': samples, 'steps': steps, 'seconds': seconds, 'samples_per_s': samples / seconds, **last}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description='Write a small image dataset, then train a torch model from it.')
    parser.add_argument('--output-url', default='file:///tmp/petastorm_demo',
                        help='where the dataset goes; what is there is replaced (default: %(default)s)')
    parser.add_argument('--rows', type=int, default=3000, help='images to write (default: %(default)s)')
    parser.add_argument('--epochs', type=int, default=3, help='passes over the dataset (default: %(default)s)')
    parser.add_argument('--batch-size', type=int, default=64, help='(default: %(default)s)')
    parser.add_argument('--workers', type=int, default=2, help='reader threads (default: %(default)s)')
    parser.add_argument('--log-every', type=int, default=20, help='steps between lines (default: %(default)s)')
    args = parser.parse_args(argv)
    write(args.output_url, args.rows)
    result = train(args.output_url, args.epochs, args.batch_size, args.workers, args.log_every)
    print(f'trained {result["steps"]} steps on {result["samples"]:,} samples in {result["seconds"]:.1f} s: '
          f'{result["samples_per_s"]:,.0f} samples/s; last loss {result["loss"]:.3f}, '
          f'accuracy {100 * result["accuracy"]:.1f}%')
    return result


if __name__ == '__main__':
    main()
