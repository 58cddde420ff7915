"""Which row groups a reader reads, and how they become one shard's layout of epochs.

:func:`select_row_groups` keeps the row groups that the partition predicate, the row-group selector and the
filters' statistics allow; :func:`make_layout` shards them and splits them into work items. Both are pure:
storage reads the footers and indexes first and hands in what they say.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from petastorm.plan.items import layout_items
from petastorm.plan.layout import ShardLayout
from petastorm.plan.shard import ShardSpec
from petastorm.predicates import PredicateBase
from petastorm.selectors import RowGroupSelectorBase
from petastorm.store.pieces import RowGroupPiece
from petastorm.unischema import Unischema

__all__ = ['make_layout', 'select_row_groups']


def select_row_groups(pieces: Sequence[RowGroupPiece], schema: Unischema, *,
                      partition_predicate: PredicateBase | None = None,
                      selector: RowGroupSelectorBase | None = None,
                      indexes: Mapping[str, Any] | None = None,
                      matching: Collection[tuple[str, int]] | None = None,
                      url: Any = None) -> Sequence[int]:
    """Indexes of the pieces to read, in piece order (a ``range`` when nothing is left out).

    Args:
        pieces: every row group of the dataset.
        schema: the stored schema (types the partition values the predicate sees).
        partition_predicate: a predicate on partition fields only: keeps the pieces whose partition values match.
        selector: a row-group selector; needs ``indexes``.
        indexes: the dataset's row-group indexes by name (loaded from its metadata).
        matching: ``(path, row group)`` of the row groups whose statistics may match the filters (None: all).
        url: the dataset, named in errors.

    Raises:
        ValueError: the selector needs an index the dataset does not have.
    """
    kept: Sequence[int] = range(len(pieces))  # not a list: a million indexes would take 38 MB
    if partition_predicate is not None:
        kept = [i for i in kept if partition_predicate.do_include(pieces[i].partition_values(schema))]
    if selector is not None:
        available = dict(indexes or {})
        missing = [name for name in selector.get_index_names() if name not in available]
        if missing:
            raise ValueError(f'Some of required indexes {missing} are not available in {url} '
                             f'(available: {sorted(available)})')
        selected = selector.select_row_groups(available)
        kept = [i for i in kept if i in selected]
    if matching is not None:
        allowed = set(matching)
        kept = [i for i in kept if (pieces[i].path, pieces[i].row_group) in allowed]
    return kept


def make_layout(pieces: Sequence[RowGroupPiece], selected: Sequence[int], shard: ShardSpec, *, seed: int,
                shuffle_row_groups: bool, shuffle_rows: bool, drop_partitions: int,
                table_version: tuple[str, int | None] | None = None) -> ShardLayout:
    """The layout of this shard's epochs over the selected pieces.

    With ``shard.mode == 'rows'`` every shard lays out all items and takes its share of each epoch's order;
    otherwise the row groups themselves are split between the shards. ``table_version`` names the table version
    the pieces are of (positions saved on another version are refused).

    Raises:
        NoDataAvailableError: fewer rows than shards.
    """
    piece_index = np.fromiter(selected, dtype=np.int64, count=len(selected))
    rows = np.fromiter((pieces[i].num_rows for i in selected), dtype=np.int64, count=len(selected))
    items = layout_items(piece_index, rows, *shard.row_group_shard, drop_partitions)
    return ShardLayout(items, seed, shuffle_row_groups, shuffle_rows, shard.mode, shard.count, shard.shard,
                       shard.remainder, table_version)
