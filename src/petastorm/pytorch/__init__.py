"""PyTorch loaders over petastorm readers; importing this module imports torch.

* :class:`DataLoader`: batches of rows with a replaceable ``collate_fn`` (strings and Decimals become lists,
  variable-shape arrays a list or a padded tensor with a mask), optional row shuffling buffer.
* :class:`BatchedDataLoader`: large batches of numeric columns, buffered and shuffled as tensors (optionally
  on an accelerator).
* :class:`InMemBatchedDataLoader`: reads the dataset once into memory and serves many shuffled epochs.
* :class:`ReaderIterableDataset`: a reader as an ``IterableDataset`` with an exact ``state_dict()``, for torch's
  ``DataLoader`` and torchdata's ``StatefulDataLoader``.

Every loader is a ``torch.utils.data.DataLoader`` (so trainers that check the type accept it), a context
manager whose exit stops and joins the reader, and builds batches from the reader's decoded columns by slicing
and gathering whole columns (:meth:`petastorm.reader.Reader.column_batches`), never row by row. Each takes
``drop_last`` and ``bool_dtype`` (bool fields become ``torch.uint8`` as in Petastorm, or ``torch.bool``); torch's
arguments that belong to the reader here (``num_workers``, ``shuffle``, ``sampler``...) raise
:class:`LoaderArgumentError` naming what to use instead. ``docs/pytorch.md`` says which reader and which loader
suit which data.

Example:
    >>> from petastorm import make_reader
    >>> from petastorm.pytorch import DataLoader
    >>> with DataLoader(make_reader('file:///tmp/mnist/train', num_epochs=1), batch_size=64) as loader:
    ...     for batch in loader:
    ...         ...  # batch['image'] is a (64, 28, 28) uint8 tensor, batch['digit'] a (64,) int64 tensor
"""

from __future__ import annotations

from petastorm.pytorch._arguments import LoaderArgumentError
from petastorm.pytorch._base import LoaderBase
from petastorm.pytorch._collate import _sanitize_pytorch_types, decimal_friendly_collate
from petastorm.pytorch._dataset import ReaderIterableDataset
from petastorm.pytorch._inmem import InMemBatchedDataLoader, _load_rows_into_mem
from petastorm.pytorch._loaders import BatchedDataLoader, DataLoader
from petastorm.pytorch._ragged import JaggedTensor
from petastorm.pytorch._tensors import TorchTypeError

__all__ = [
           'BatchedDataLoader',
           'DataLoader',
           'InMemBatchedDataLoader',
           'JaggedTensor',
           'LoaderArgumentError',
           'LoaderBase',
           'ReaderIterableDataset',
           'TorchTypeError',
           '_load_rows_into_mem',
           '_sanitize_pytorch_types',
           'decimal_friendly_collate',
]
