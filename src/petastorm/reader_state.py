"""The sharding, epoch-length and resume side of a :class:`~petastorm.reader.Reader`.

:class:`ResumableReader` is a base of ``Reader``: it lays out this shard's epochs (:class:`ShardLayout`), says
how many rows an epoch holds before reading, and saves and restores the reader's position
(``state_dict``/``load_state_dict``). The bookkeeping itself is pure and lives in :mod:`petastorm.distributed`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from petastorm.distributed import ShardLayout, Stage, StreamPosition, check_state, restored_stage
from petastorm.options import ReaderOptions
from petastorm.plan import WorkItem


class ResumableReader:
    """Sharding, epoch length and resume for readers; the attributes below are set by ``Reader.__init__``."""

    _options: ReaderOptions
    _items: list[WorkItem]
    _layout: ShardLayout
    _position: StreamPosition
    _lock: threading.Lock
    _next_epoch: int
    _pass: tuple[Stage, int]
    _started: bool
    _partition_predicate: bool
    _filters_exact: bool
    ngram: Any
    is_batched_reader: bool

    def _shard_layout(self) -> ShardLayout:
        options = self._options
        # Unseeded readers draw a seed here: every epoch's order is then known, so that positions can be saved.
        seed = options.seed if options.seed is not None else int(np.random.default_rng().integers(2**62))
        return ShardLayout(tuple(self._items), seed, options.shuffle_row_groups, options.shuffle_rows,
                           options.shard_mode, options.shard_count or 1, options.cur_shard or 0,
                           options.shard_remainder)  # type: ignore[arg-type]

    def _new_pass(self, stage: Stage | None = None, pass_start: int | None = None) -> None:
        """The next iteration reads ``num_epochs`` epochs from ``pass_start`` (default: after the last pass)."""
        pass_start = self._next_epoch if pass_start is None else pass_start
        stage = Stage(pass_start) if stage is None else stage
        self._next_epoch = pass_start + (self._options.num_epochs or 0)
        self._pass = (stage, pass_start)
        self._started = False
        self._position.restart(stage, pass_start)

    def _pass_stages(self, first: Stage, pass_start: int) -> Iterator[Stage]:
        """The stages a pass starting at ``first`` reads, in order; reading and ``len()`` both walk these.

        Sharing one walk keeps ``len()`` equal to what iteration delivers, resumed passes included.
        """
        num_epochs = self._options.num_epochs
        end = None if num_epochs is None else pass_start + num_epochs
        epoch = first.epoch
        if end is not None and epoch >= end and first.pending:
            # Saved after the last epoch of the pass while a loader still held rows of it: only those remain.
            yield Stage(epoch, (), 0, first.pending)
        while end is None or epoch < end:
            yield first if epoch == first.epoch else Stage(epoch)
            epoch += 1
            if not self._layout.items:
                return  # nothing to read: stop instead of walking endless empty epochs

    @property
    def num_rows_per_pass(self) -> int | None:
        """Rows one pass delivers (all ``num_epochs`` epochs), or None when only reading can tell.

        It is :attr:`num_rows_per_epoch` times ``num_epochs``; None with ``num_epochs=None`` or when the rows per
        epoch are unknown.
        """
        per_epoch = self.num_rows_per_epoch
        if self._options.num_epochs is None or per_epoch is None:
            return None
        return per_epoch * self._options.num_epochs

    @property
    def num_rows_this_pass(self) -> int | None:
        """Rows the pass about to be read (or being read) delivers from its start, or None when only reading can tell.

        :attr:`num_rows_per_pass` for a whole pass; after :meth:`load_state_dict`, only the rows the restored pass
        still has to deliver (rows a loader held when the state was saved included).
        """
        rows = self.num_rows_per_pass
        first, pass_start = self._pass
        if rows is None or first == Stage(pass_start):
            return rows
        return sum(unit.num_rows for stage in self._pass_stages(first, pass_start)
                   for unit in self._layout.units(stage)[0])

    @property
    def num_rows_per_epoch(self) -> int | None:
        """Rows this reader (this shard) delivers per epoch, from metadata alone; None when only reading can tell.

        Exact after sharding (with ``shard_mode='rows'`` the same for every shard), row-group selectors and
        predicates or ``filters`` on partition columns only (they keep or drop whole row groups). None with any
        other predicate or filter (which rows of a row group match is known only by reading it), an NGram, or a
        ``make_batch_reader`` transform function (which may drop rows).
        """
        options = self._options
        if (options.predicate is not None and not self._partition_predicate) or self.ngram is not None:
            return None
        if options.filters is not None and not self._filters_exact:
            return None
        if options.batched_output and options.transform_spec is not None and options.transform_spec.func is not None:
            return None
        return self._layout.rows_per_epoch

    def __len__(self) -> int:
        """Items one pass yields: rows (``make_reader``) or batches (``make_batch_reader``).

        Raises:
            TypeError: the count is unknown in advance (see :attr:`num_rows_per_epoch`) or ``num_epochs=None``.
        """
        rows = self.num_rows_this_pass
        if rows is None:
            raise TypeError('len() of this reader is unknown in advance (num_epochs=None, a predicate or filters '
                            'on non-partition columns, an NGram or a batch transform function); see '
                            'Reader.num_rows_per_epoch')
        if not self.is_batched_reader:
            return rows
        return sum(len(self._layout.units(stage)[0]) for stage in self._pass_stages(*self._pass))

    def __bool__(self) -> bool:
        return True  # a reader is truthy even when its len() is unknown or 0

    def state_dict(self) -> dict[str, Any]:
        """The position of this reader: which rows it delivered, as a small dict of ints, lists and strings.

        Counts only rows handed to the caller (rows read ahead by workers are not), so that
        :meth:`load_state_dict` on a new reader continues with exactly the rows not delivered yet.
        """
        if self.ngram is not None:
            raise NotImplementedError('state_dict() is not supported for NGram readers')
        with self._lock:
            return self._position.state({'num_epochs': self._options.num_epochs})

    def load_state_dict(self, state: Any) -> None:
        """Continue from a saved position; call before reading.

        Args:
            state: a :meth:`state_dict` of a reader over the same data with the same options, or the list of the
                states of every rank (in rank order) of a distributed run. With the same world size each rank
                continues its own stream exactly. With ``shard_mode='rows'`` the world size may change: the rows
                no rank delivered are split again into equal shares. A single state then stands for every rank
                (same number of rows consumed, none in loader buffers); pass the list otherwise.

        Raises:
            ValueError: the state does not match this reader (the message names the option or count).
            RuntimeError: reading has started.
        """
        if self.ngram is not None:
            raise NotImplementedError('load_state_dict() is not supported for NGram readers')
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        if not states:
            raise ValueError('load_state_dict got an empty list of states')
        for index, one in enumerate(states):
            check_state(one, self._layout, f'load_state_dict (state {index})')
        seed = states[0]['seed']
        if self._options.seed is not None and seed != self._options.seed:
            raise ValueError(f'the state was saved with seed={seed}, this reader has seed={self._options.seed}')
        with self._lock:
            if self._started:
                raise RuntimeError('load_state_dict() must be called before reading from the reader')
            self._layout.seed = int(seed)  # an unseeded reader adopts the saved order
            self._layout.reset_orders()
            self._new_pass(restored_stage(states, self._layout), int(states[0]['pass_start']))

    def _shard_diagnostics(self) -> dict[str, Any]:
        layout, options = self._layout, self._options
        return {'shard_mode': layout.shard_mode, 'shard': options.cur_shard, 'shard_count': options.shard_count,
                'shard_source': options.shard_source, 'rows_per_epoch_before_filters': layout.rows_per_epoch,
                'shard_remainder': layout.remainder if layout.shard_mode == 'rows' else None,
                'rows_remainder_per_epoch': layout.remainder_rows}
