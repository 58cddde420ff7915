"""Keeps Petastorm's ``petastorm.workers_pool.ventilator``: feeding a legacy pool its items from a thread."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ['ConcurrentVentilator', 'Ventilator']

_VENTILATION_INTERVAL = 0.01


class Ventilator(ABC):
    """Hands items to a pool (its ``ventilate_fn``); the pool tells it when an item is done.

    Args:
        ventilate_fn: called with each item's keyword arguments (usually a pool's ``ventilate``).
    """

    def __init__(self, ventilate_fn: Callable[..., Any]) -> None:
        self._ventilate_fn = ventilate_fn

    @abstractmethod
    def start(self) -> None:
        """Begin ventilating; the pool must be ready to take items."""

    @abstractmethod
    def processed_item(self) -> None:
        """The pool finished one item (called by the pool)."""

    @abstractmethod
    def completed(self) -> bool:
        """True once every item it will ever ventilate has been ventilated (or it was stopped)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop ventilating."""


class ConcurrentVentilator(Ventilator):
    """Ventilates a list of items, ``iterations`` times, from its own thread, keeping a bounded number in flight.

    Args:
        ventilate_fn: called as ``ventilate_fn(**item)`` for each item.
        items_to_ventilate: a list of dicts, the keyword arguments of each item.
        iterations: passes over the items (None: until stopped).
        randomize_item_order: a new random order of the items at every pass.
        random_seed: seeds that order (None or 0: an unseeded order).
        max_ventilation_queue_size: items ventilated and not yet processed at most (default: all of them).
        ventilation_interval: seconds between checks for room when that many are in flight.

    Raises:
        ValueError: ``iterations`` is not a positive int or None, or the items are not a list of dicts.
    """

    def __init__(self, ventilate_fn: Callable[..., Any], items_to_ventilate: list[dict[str, Any]],
                 iterations: int | None = 1, randomize_item_order: bool = False, random_seed: int | None = None,
                 max_ventilation_queue_size: int | None = None,
                 ventilation_interval: float = _VENTILATION_INTERVAL) -> None:
        super().__init__(ventilate_fn)
        if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int)
                                       or iterations < 1):
            raise ValueError(f'iterations must be positive integer or None, got {iterations!r}')
        if not isinstance(items_to_ventilate, list) or not all(isinstance(i, dict) for i in items_to_ventilate):
            raise ValueError('items_to_ventilate must be a list of dicts')
        self._items = list(items_to_ventilate)
        self._iterations = iterations
        self._remaining = iterations
        self._randomize = bool(randomize_item_order)
        self._rng = np.random.default_rng(random_seed or None)
        self._max_in_flight = max_ventilation_queue_size or max(1, len(self._items))
        self._interval = ventilation_interval
        self._cond = threading.Condition()
        self._in_flight = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the ventilating thread."""
        self._thread = threading.Thread(target=self._run, name='petastorm-ventilator', daemon=True)
        self._thread.start()

    def processed_item(self) -> None:
        """One ventilated item is done: room for another."""
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def completed(self) -> bool:
        """True when stopped, when every pass is ventilated, or when there is nothing to ventilate."""
        with self._cond:
            return self._stopped or self._remaining == 0 or not self._items

    def reset(self) -> None:
        """Ventilate the passes again from the start; only once :meth:`completed`.

        Raises:
            NotImplementedError: it is still ventilating.
        """
        if not self.completed():
            raise NotImplementedError('Reseting ventilator while ventilating is not supported.')
        self._join()
        with self._cond:
            self._remaining = self._iterations
            self._stopped = False
        self.start()

    def stop(self) -> None:
        """Stop ventilating and wait for the thread to end."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._join()

    def _join(self) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self.completed():
            order = self._rng.permutation(len(self._items)) if self._randomize else range(len(self._items))
            for index in order:
                with self._cond:
                    while self._in_flight >= self._max_in_flight and not self._stopped:
                        self._cond.wait(self._interval)
                    if self._stopped:
                        return
                    self._in_flight += 1
                self._ventilate_fn(**self._items[index])
            with self._cond:
                if self._remaining is not None:
                    self._remaining -= 1
