"""Keeps Petastorm's ``petastorm.workers_pool.worker_base``: the base class of the workers a legacy pool runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ['WorkerBase']


class WorkerBase:
    """One worker of a :mod:`petastorm.workers_pool` pool: its ``process`` runs each ventilated item.

    Args:
        worker_id: an integer naming this worker among the pool's.
        publish_func: call it with each result of an item; ``get_results`` hands them out in that order.
        args: the ``worker_args`` given to the pool's ``start``.
    """

    def __init__(self, worker_id: int, publish_func: Callable[[Any], None], args: Any) -> None:
        self.worker_id = worker_id
        self.publish_func = publish_func
        self.args = args

    def process(self, *args: Any, **kwargs: Any) -> None:
        """Do one item of work (what was given to ``ventilate``), publishing its results with ``publish_func``."""
        raise NotImplementedError(f'{type(self).__name__} must define process(*args, **kwargs)')

    def shutdown(self) -> None:
        """Called once when the pool is joined; release what the worker holds."""
