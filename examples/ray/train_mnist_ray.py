"""Train a small digit classifier with Ray Train on 2 CPU workers, fed by ``read_petastorm``.

Ray Data reads and decodes the Petastorm dataset in its own tasks; each training worker takes its shard with
``ray.train.get_dataset_shard('train')`` and iterates torch batches of decoded 28x28 images. Write the dataset
first with the MNIST example, then train::

    python examples/mnist/generate_petastorm_mnist.py --output-url file:///tmp/mnist
    python examples/ray/train_mnist_ray.py --dataset-url file:///tmp/mnist/train --epochs 2
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import ray
import ray.train
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

from petastorm.ray import read_petastorm


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def train_loop(config: dict[str, Any]) -> None:
    """What each Ray Train worker runs: its shard of the dataset, ``config['epochs']`` times."""
    model = prepare_model(_model())  # DistributedDataParallel over the workers (gloo on CPUs)
    optimizer = torch.optim.SGD(model.parameters(), lr=config['lr'], momentum=0.9)
    shard = ray.train.get_dataset_shard('train')
    for epoch in range(config['epochs']):
        rows, total_loss = 0, 0.0
        for batch in shard.iter_torch_batches(batch_size=config['batch_size']):
            images, labels = batch['image'].to(torch.float32) / 255.0, batch['digit']
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows += len(labels)
            total_loss += loss.item() * len(labels)
        # Every worker reports; the rows of all workers are summed so the caller sees the whole epoch.
        counts = torch.tensor([rows, total_loss], dtype=torch.float64)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(counts)
        metrics = {'epoch': epoch, 'rows': int(counts[0]), 'loss': float(counts[1] / max(counts[0], 1))}
        with tempfile.TemporaryDirectory() as directory:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:  # one copy of the weights per epoch
                torch.save(_unwrapped(model).state_dict(), os.path.join(directory, 'model.pt'))
                checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=checkpoint)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, 'module', model)  # prepare_model wraps it in DistributedDataParallel


def train(dataset_url: str, epochs: int = 1, batch_size: int = 64, lr: float = 0.05,
          storage_path: str | None = None) -> ray.train.Result:
    """Train on the dataset at ``dataset_url`` with 2 CPU workers.

    Returns:
        Ray Train's result: ``metrics`` of the last epoch (``epoch``, ``rows`` seen by all workers, mean
        ``loss``) and the ``checkpoint`` holding ``model.pt``, the trained weights.
    """
    dataset = read_petastorm(dataset_url, schema_fields=['digit', 'image'])
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={'epochs': epochs, 'batch_size': batch_size, 'lr': lr},
        # Half a CPU each: on a 2-CPU machine the other CPU stays free for Ray Data's read tasks.
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={'CPU': 0.5}),
        datasets={'train': dataset},
        run_config=RunConfig(storage_path=storage_path or tempfile.mkdtemp(prefix='ray-train-')),
    )
    return trainer.fit()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dataset-url', default='file:///tmp/mnist/train')
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--batch-size', type=int, default=64)
    args = parser.parse_args(argv)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        result = train(args.dataset_url, args.epochs, args.batch_size)
        print(f'epoch {result.metrics["epoch"]}: {result.metrics["rows"]} rows, loss {result.metrics["loss"]:.3f}')
    finally:
        ray.shutdown()


if __name__ == '__main__':
    main()
