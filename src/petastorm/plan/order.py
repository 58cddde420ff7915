"""The order of an epoch: which work item comes when, and the order of the rows inside each.

Every order is a deterministic function of ``(seed, epoch)`` (fresh entropy only when the seed is None), so a
seed gives the same sequence of rows for every pool kind, worker count and install.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

import numpy as np

from petastorm.plan.items import ScheduledItem, WorkItem, WorkItems

__all__ = ['EpochOrder', 'RowMatches', 'epoch_order', 'epoch_rng', 'epoch_schedule', 'kept_rows', 'row_permutation',
           'unit_rows']

# Large prime mixed into per-epoch seeds so that (seed, epoch) streams never collide with user seeds.
_EPOCH_STREAM = 0x9E3779B1


def epoch_rng(seed: int | None, epoch: int) -> np.random.Generator:
    """The random generator of one epoch: reproducible from ``seed``, fresh entropy when ``seed`` is None."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, epoch, _EPOCH_STREAM])


def epoch_schedule(items: Sequence[WorkItem], epoch: int, seed: int | None,
                   shuffle_row_groups: bool) -> list[ScheduledItem]:
    """The items of one epoch in reading order, each with the seed of its row shuffle."""
    rng = epoch_rng(seed, epoch)
    order = rng.permutation(len(items)) if shuffle_row_groups else np.arange(len(items))
    shuffle_seeds = rng.integers(0, 2**63 - 1, size=len(items))
    return [ScheduledItem(items[i], epoch, int(shuffle_seeds[i])) for i in order]


def epoch_order(items: Sequence[WorkItem], epoch: int, seed: int | None,
                shuffle_row_groups: bool) -> EpochOrder:
    """The items of one epoch in reading order, each with ``item_base``, its first position in the global order.

    The *global order* of an epoch is every item in this order, each item's rows in their order; position ``p``
    of it is one row.
    """
    rng = epoch_rng(seed, epoch)
    order = rng.permutation(len(items)) if shuffle_row_groups else np.arange(len(items))
    # The seeds are drawn as epoch_schedule draws them. The arrays in item order are let go as soon as they are
    # reordered, and the bases are made in place: of a million items, 31 MB at the peak instead of 38.
    seeds = rng.integers(0, 2**63 - 1, size=len(items))[order]
    rows = (items.num_rows if isinstance(items, WorkItems) else
            np.fromiter((item.num_rows for item in items), dtype=np.int64, count=len(items)))[order]
    bases = np.cumsum(rows)
    bases -= rows
    return EpochOrder(items, epoch, order, seeds, bases)


class EpochOrder(Sequence[ScheduledItem]):
    """:func:`epoch_order`'s sequence of scheduled items, held as arrays (three numbers an item).

    A shard by rows reads a small part of an epoch of every item of the store (a million row groups, say): only
    the scheduled items it reads are made, when asked (:meth:`__getitem__`); :attr:`bases` finds them.

    Args:
        items: the work items.
        epoch: the epoch.
        order: the index in ``items`` of each position of the order.
        shuffle_seeds: the row shuffle's seed of each position.
        bases: the first position in the global order of each position's item (ascending).
    """

    def __init__(self, items: Sequence[WorkItem], epoch: int, order: np.ndarray, shuffle_seeds: np.ndarray,
                 bases: np.ndarray) -> None:
        self._items = items
        self.epoch = epoch
        self._order = order
        self._seeds = shuffle_seeds
        #: each scheduled item's ``item_base``, ascending: ``searchsorted`` finds the item of a position.
        self.bases = bases

    @property
    def item_indexes(self) -> np.ndarray:
        """The index in ``items`` of the item at each position of the order (read-only)."""
        view = self._order.view()
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> ScheduledItem: ...

    @overload
    def __getitem__(self, index: slice) -> list[ScheduledItem]: ...

    def __getitem__(self, index: int | slice) -> ScheduledItem | list[ScheduledItem]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f'position {index} of an epoch order of {len(self)} items')
        return ScheduledItem(self._items[int(self._order[index])], self.epoch, int(self._seeds[index]),
                             item_base=int(self.bases[index]))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def row_permutation(num_rows: int, shuffle_seed: int) -> np.ndarray:
    """The row order inside one work item when rows are shuffled."""
    return np.random.default_rng(shuffle_seed).permutation(num_rows)


def unit_rows(scheduled: ScheduledItem, shuffle_rows: bool) -> np.ndarray | None:
    """Rows of the item (offsets from its ``row_start``) that ``scheduled`` delivers, in delivery order.

    The item's order is its row permutation when rows are shuffled, else file order; a scheduled item that stands
    for part of it takes its range or picks of that order. None means every row in file order (nothing to
    gather). Filters apply afterwards, so the order, and the position of each row in it, does not depend on the
    data.
    """
    num_rows = scheduled.item.num_rows
    if shuffle_rows:
        order = row_permutation(num_rows, scheduled.shuffle_seed)
    elif scheduled.order_range is None and scheduled.order_picks is None:
        return None
    else:
        order = np.arange(num_rows)
    if scheduled.order_picks is not None:
        return order[np.asarray(scheduled.order_picks, dtype=np.int64)]
    if scheduled.order_range is not None:
        return order[scheduled.order_range[0]:scheduled.order_range[1]]
    return order


#: The rows each row group keeps through the filters and the predicate, as a bool mask over its rows, by piece
#: index; a row group without an entry keeps every row.
RowMatches = Mapping[int, np.ndarray]


def kept_rows(scheduled: ScheduledItem, shuffle_rows: bool, matches: RowMatches | None) -> int:
    """Rows of ``scheduled`` that survive the filters (all of them when ``matches`` has no mask for its row group)."""
    item = scheduled.item
    mask = None if matches is None else matches.get(item.piece_index)
    if mask is None:
        return scheduled.num_rows
    window = mask[item.row_start:item.row_stop]
    rows = unit_rows(scheduled, shuffle_rows)
    return int(np.count_nonzero(window if rows is None else window[rows]))
