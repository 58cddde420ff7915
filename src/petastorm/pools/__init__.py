"""Worker pools that map a pure function over work items and return the results in submission order.

Three kinds, chosen by name with :func:`make_pool`:

* ``'dummy'``: runs the function inline in the consumer's thread (the reference; easiest to debug);
* ``'thread'``: a pool of threads (cheap, zero-copy; best when the work releases the GIL);
* ``'process'``: worker processes (fresh interpreters; scripts need no ``__main__`` guard) whose results'
  arrays arrive through shared memory without copies in the consumer (best for Python-heavy decoding).

Example::

    with make_pool('process', 4) as pool:
        pool.start(decode_row_group, context)
        for columns in pool.imap(work_items):
            ...

How the modules fit:

* :mod:`~petastorm.pools.base`: the :class:`WorkerPool` protocol, the exceptions, the :class:`ArrayCarrier`
  protocol of result types, the in-flight byte budget and ``PoolBase``, which holds the ordered window loop
  behind every kind's ``imap`` (written once; a kind supplies small hooks: submit, wait, cancel, stop, join);
* :mod:`~petastorm.pools.dummy_pool`, :mod:`~petastorm.pools.thread_pool`, :mod:`~petastorm.pools.process_pool`:
  those hooks, inline, on futures of a thread executor, or on the process runtime;
* the process runtime (private modules): ``_process_core`` (the worker processes, their pipes, the collector
  thread and the per-item bookkeeping), ``_launch`` (starts a worker as a fresh interpreter), ``_worker`` (the
  worker's main loop), ``_transport`` (what crosses the pipes: results, with their big arrays moved through
  shared memory slots, and exceptions with their tracebacks), ``_shm`` and ``_shm_parent`` (a worker's slots, and
  the parent's mappings of them with the releases that hand them back), ``_posix_shm`` (named POSIX shared
  memory segments: the only module that uses CPython's private shared memory extension).
"""

from __future__ import annotations

from petastorm._checks import check_positive_int
from petastorm.pools.base import (
    ArrayCarrier,
    RemoteTraceback,
    WorkerDiedError,
    WorkerFunctionError,
    WorkerPool,
    default_max_bytes_in_flight,
)
from petastorm.pools.dummy_pool import DummyPool
from petastorm.pools.process_pool import ProcessPool
from petastorm.pools.thread_pool import ThreadPool

__all__ = [
    'POOL_KINDS',
    'ArrayCarrier',
    'DummyPool',
    'ProcessPool',
    'RemoteTraceback',
    'ThreadPool',
    'WorkerDiedError',
    'WorkerFunctionError',
    'WorkerPool',
    'default_max_bytes_in_flight',
    'make_pool',
]

POOL_KINDS: tuple[str, ...] = ('dummy', 'thread', 'process')

_POOL_CLASSES = {'dummy': DummyPool, 'thread': ThreadPool, 'process': ProcessPool}


def make_pool(kind: str, workers_count: int, *, max_in_flight: int | None = None,
              max_bytes_in_flight: int = 1 << 30, initial_in_flight: int | None = None) -> WorkerPool:
    """Create a (not yet started) pool of the given kind.

    Args:
        kind: one of :data:`POOL_KINDS`.
        workers_count: number of threads or processes (a positive int; the dummy pool always uses one).
        max_in_flight: items submitted ahead of the consumer; default ``2 * workers_count``.
        max_bytes_in_flight: the in-flight bound also shrinks so that the results held in flight stay under
            this many bytes (estimated from the results seen so far).
        initial_in_flight: items in flight before the first result tells their size (default 2: the first item
            gets the machine to itself; on remote storage, where the first items wait on round trips rather than
            on the CPU, as many as there are workers).

    Raises:
        ValueError: for an unknown kind or a bad option value.
    """
    pool_class = _POOL_CLASSES.get(kind) if isinstance(kind, str) else None
    if pool_class is None:
        raise ValueError(f'Unknown reader_pool_type: {kind!r}; expected one of {", ".join(POOL_KINDS)}')
    check_positive_int('workers_count', workers_count)
    return pool_class(workers_count, max_in_flight=max_in_flight, max_bytes_in_flight=max_bytes_in_flight,
                      initial_in_flight=initial_in_flight)
