"""The unit every reader hands on: a :class:`ColumnBatch` of decoded columns from one work item.

The worker (:func:`petastorm.reading.read_item`) makes one per work item; every pool kind carries it to the reader
(the process pool moves its columns through shared memory, see :class:`petastorm.pools.base.ArrayCarrier`); the
reader stamps the numbers of its rows on it and hands it to the loaders (torch, TensorFlow, Ray, Spark), which cut
rows or batches from its columns. Nothing else travels between the layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from petastorm.columns import Column, flatten_columns, unflatten_columns
from petastorm.plan import WorkItem

__all__ = ['ColumnBatch']


@dataclass(frozen=True)
class ColumnBatch:
    """Decoded columns of the rows one work item delivered (all columns have ``num_rows`` rows).

    Attributes:
        columns: ``{field name: column}``, rows first: numpy arrays, or the masked, list and struct columns of
            :mod:`petastorm.columns`; when a ``make_reader`` transform returns tuples (``rows_are_tuples``), the
            columns are named ``'0'``, ``'1'``, ... by position. Arrays may be read-only views of Arrow or shared
            memory: copy before writing to them.
        num_rows: rows of the batch (with an NGram: windows).
        rows_are_tuples: rows are plain tuples (a row transform returned tuples), not namedtuples of the schema.
        item: the row range the batch was read from.
        positions: when filters or a predicate dropped rows, the position of each delivered row in the work
            item's order (None: every row of it, in order).
        untracked: a transform changed the number of rows, so which stored row each row is cannot be told.
        ngram_starts: with an NGram, where each window starts in ``columns``.
        stage_seconds: seconds per worker stage, when the reader was asked to time them.
        row_ids: numbers naming each row across epochs (see :func:`petastorm.plan.encode_rows`), stamped by the
            reader when the batch is delivered; None when untracked or not delivered by a reader.
        flat: ``columns`` holds the flat arrays of nested columns (see :func:`petastorm.columns.flatten_columns`),
            as a process pool carries them; set only between the worker and the reader.
    """

    columns: Mapping[str, Column]
    num_rows: int
    rows_are_tuples: bool = False
    item: WorkItem | None = None
    positions: np.ndarray | None = None
    untracked: bool = False
    ngram_starts: np.ndarray | None = None
    stage_seconds: Mapping[str, float] | None = None
    row_ids: np.ndarray | None = None
    flat: bool = False

    @classmethod
    def empty(cls, item: WorkItem | None = None) -> ColumnBatch:
        """A batch without rows (a predicate or filter kept none)."""
        return cls({}, 0, item=item)

    # The pools' ArrayCarrier protocol: the columns' arrays are what a process pool moves through shared memory.
    def carried_arrays(self) -> Mapping[str, np.ndarray]:
        """Every array of the columns, under flat keys (what a process pool moves without pickling)."""
        return self.columns if self.flat else flatten_columns(self.columns)  # type: ignore[return-value]

    def with_carried_arrays(self, arrays: Mapping[str, np.ndarray]) -> ColumnBatch:
        """A copy whose columns' arrays are ``arrays``.

        The worker side of a process pool keeps part of the arrays (the rest travel in shared memory): that copy
        holds them flat. The reader's side then hands in every array, and the columns are rebuilt from them.
        """
        if self.flat:
            return dataclasses.replace(self, columns=unflatten_columns(arrays), flat=False)
        return dataclasses.replace(self, columns=dict(arrays), flat=True)
