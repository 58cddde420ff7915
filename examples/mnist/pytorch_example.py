"""Trains a small convolutional network on the MNIST-style digits with ``petastorm.pytorch.DataLoader``.

Write the dataset first (``generate_petastorm_mnist.py``), then:

    python examples/mnist/pytorch_example.py --dataset-url file:///tmp/mnist --epochs 10

Each row goes through a ``TransformSpec`` that turns the 28x28 uint8 image into a normalized (1, 28, 28) float
tensor and drops ``idx``; the function returns a tuple, so batches are ``[images, digits]``. The reader reads
all training epochs in one pass (``num_epochs``), shuffling row groups and rows with a fixed seed.
"""

from __future__ import annotations

import argparse
import types

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
from torch import nn

from petastorm import TransformSpec, make_reader
from petastorm.pytorch import DataLoader


class Compose:
    """Applies transforms one after the other."""

    def __init__(self, steps):
        self.steps = list(steps)

    def __call__(self, value):
        for step in self.steps:
            value = step(value)
        return value


class ToTensor:
    """An HxW or HxWxC uint8 image -> a CxHxW float32 tensor with values in [0, 1]."""

    def __call__(self, image):
        tensor = torch.as_tensor(image)
        tensor = tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)
        return tensor.to(torch.float32).div(255.0)


class Normalize:
    """Per-channel ``(x - mean) / std``."""

    def __init__(self, mean, std):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


# The few image transforms this example needs, under the names torchvision gives them.
transforms = types.SimpleNamespace(Compose=Compose, ToTensor=ToTensor, Normalize=Normalize)


class Net(nn.Module):
    """Two 3x3 convolution blocks and a two-layer classifier; outputs log-probabilities of the 10 digits."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def _transform_row(mnist_row):
    transform = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize((0.1307,), (0.3081,))
    ])
    return (transform(mnist_row['image']), mnist_row['digit'])


def train(model, device, train_loader, log_interval, optimizer, epoch):
    """One pass of the loader (all the reader's epochs); logs the loss every ``log_interval`` batches."""
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if log_interval and batch_idx % log_interval == 0:
            print(f'Train pass {epoch} batch {batch_idx}: {batch_idx * len(data)} rows, loss {loss.item():.4f}')


def test(model, device, test_loader):
    """Mean loss and accuracy over the test loader; returns the accuracy."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss_sum += F.nll_loss(output, target, reduction='sum').item()
            correct += (output.argmax(dim=1) == target).sum().item()
            count += len(target)
    accuracy = correct / count
    print(f'Test: mean loss {loss_sum / count:.4f}, accuracy {correct}/{count} ({100.0 * accuracy:.1f}%)')
    return accuracy


def run(dataset_url='file:///tmp/mnist', epochs=10, batch_size=64, test_batch_size=1000, lr=0.01, momentum=0.5,
        seed=1, log_interval=10, device_name=None):
    """Train for ``epochs`` epochs and return the test accuracy."""
    torch.manual_seed(seed)
    device = torch.device(device_name or ('cuda' if torch.cuda.is_available() else 'cpu'))
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    transform = TransformSpec(_transform_row, removed_fields=['idx'])
    url = dataset_url.rstrip('/')
    with DataLoader(make_reader(f'{url}/train', num_epochs=epochs, transform_spec=transform, seed=seed,
                                shuffle_rows=True), batch_size=batch_size) as train_loader:
        train(model, device, train_loader, log_interval, optimizer, 1)
    with DataLoader(make_reader(f'{url}/test', num_epochs=1, transform_spec=transform),
                    batch_size=test_batch_size) as test_loader:
        return test(model, device, test_loader)


def main(argv=None):
    parser = argparse.ArgumentParser(description='Petastorm MNIST-style example with PyTorch')
    parser.add_argument('--dataset-url', default='file:///tmp/mnist',
                        help='URL holding the train/ and test/ datasets of generate_petastorm_mnist.py')
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--test-batch-size', type=int, default=1000)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--momentum', type=float, default=0.5)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--log-interval', type=int, default=10, help='batches between loss printouts (0: none)')
    parser.add_argument('--device', default=None, help="'cpu', 'cuda', ... (default: cuda when available)")
    args = parser.parse_args(argv)
    return run(args.dataset_url, args.epochs, args.batch_size, args.test_batch_size, args.lr, args.momentum,
               args.seed, args.log_interval, args.device)


if __name__ == '__main__':
    main()
