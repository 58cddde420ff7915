"""Keeps Petastorm's ``petastorm.workers_pool``: pools driven by ``ventilate`` / ``get_results``, and their errors.

Code written against Petastorm's pools keeps working: the pool classes of
:mod:`~petastorm.workers_pool.thread_pool`, :mod:`~petastorm.workers_pool.process_pool` and
:mod:`~petastorm.workers_pool.dummy_pool` run :class:`~petastorm.workers_pool.worker_base.WorkerBase`
subclasses on the items given to ``ventilate`` (or by a :mod:`~petastorm.workers_pool.ventilator`), and one of
them passed as ``reader_pool=`` to the legacy ``Reader(filesystem, path, ...)`` construction picks the readers'
pool kind and worker count. Readers run on :mod:`petastorm.pools` (``make_reader(reader_pool_type=...)``).

The protocol, as Petastorm's:

* ``pool.start(worker_class, worker_args=None, ventilator=None)``: make the workers (each an instance of
  ``worker_class(worker_id, publish_func, worker_args)``) and start the ventilator;
* ``pool.ventilate(*args, **kwargs)``: one item of work, run as ``worker.process(*args, **kwargs)``; the worker
  hands out any number of results with ``self.publish_func(result)``;
* ``pool.get_results()``: the next result; :class:`EmptyResultError` once every item ventilated so far is done and
  its results were taken (and the ventilator, if any, has completed); a worker's exception is raised here, after
  the pool is stopped;
* ``pool.stop()``, ``pool.join()``, ``pool.diagnostics``, ``pool.workers_count``.

Results come in the order of the items ventilated (all results of one item, then those of the next), for every
kind.
"""

from __future__ import annotations

from petastorm.errors import PetastormError

__all__ = ['EmptyResultError', 'TimeoutWaitingForResultError', 'VentilatedItemProcessedMessage']


class EmptyResultError(PetastormError, RuntimeError):
    """No result is left and none is expected unless ``ventilate`` is called again."""


class TimeoutWaitingForResultError(PetastormError, RuntimeError):
    """Waiting for a result took longer than the time allowed."""


class VentilatedItemProcessedMessage:
    """Marks that a worker finished one ventilated item (kept for code that refers to it)."""
