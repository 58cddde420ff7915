"""Helpers for testing code that uses petastorm, and for testing and measuring petastorm against slow storage.

For testing a training program (Petastorm's two modules, at their paths):

* :mod:`~petastorm.test_util.reader_mock`: :class:`~petastorm.test_util.reader_mock.ReaderMock`, a stand-in for a
  reader that yields generated rows of a schema, without a dataset;
* :mod:`~petastorm.test_util.shuffling_analysis`: how well a reader's options shuffle (the correlation between
  delivery order and storage order).

For storage that is far away, on one machine (our tests and ``benchmarks/``):

* :mod:`~petastorm.test_util.s3_server`: :class:`~petastorm.test_util.s3_server.S3DirectoryServer`, an
  S3-compatible server on loopback over a local directory, in a thread or a process of its own, counting requests
  and bytes; its S3 requests are answered in ``_s3_requests``;
* :mod:`~petastorm.test_util.delay_proxy`: :class:`~petastorm.test_util.delay_proxy.DelayProxy`, a TCP proxy that
  adds latency and caps bandwidth (a wide-area network in front of the server);
* :mod:`~petastorm.test_util.latency_fs`: :class:`~petastorm.test_util.latency_fs.SlowLocalHandler`, a local
  filesystem whose every file open waits (what a cache saves).
"""

__all__: list[str] = []
