"""Keeps Petastorm's ``petastorm.reader_impl``: shuffling buffers and result serializers of its public path.

* :mod:`~petastorm.reader_impl.shuffling_buffer`: item-by-item buffers (``NoopShufflingBuffer``,
  ``RandomShufflingBuffer``);
* :mod:`~petastorm.reader_impl.pytorch_shuffling_buffer`: batch buffers of torch tensors
  (``BatchedNoopShufflingBuffer``, ``BatchedRandomShufflingBuffer``; imports torch);
* :mod:`~petastorm.reader_impl.pickle_serializer`, :mod:`~petastorm.reader_impl.arrow_table_serializer`: what
  ``petastorm.workers_pool.process_pool.ProcessPool(serializer=...)`` takes.

The loaders of :mod:`petastorm.pytorch` use the columnar buffers of :mod:`petastorm.shuffle` instead.
"""

__all__: list[str] = []
