"""What a reader yields, cut from its column batches at the very end: rows, batches or NGram windows.

``make_batch_reader`` yields one namedtuple of columns per batch; ``make_reader`` one namedtuple per row (plain
tuples when a row transform returned tuples); with an NGram, ``{offset: namedtuple}`` per window (or per batch of
windows). Rows are the only per-row Python objects a reader makes, and only when the user iterates rows.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

from petastorm.columns import batch_column, is_nested, row_values, take_column
from petastorm.ngram import NGram
from petastorm.reading.batch import ColumnBatch
from petastorm.unischema import Unischema

__all__ = ['deliver']


def deliver(schema: Unischema, ngram: NGram | None, batched: bool,
            batches: Iterable[ColumnBatch]) -> Generator[Any, None, None]:
    """The items a reader of ``schema`` yields from ``batches``."""
    if ngram is not None:
        return _windows(schema, ngram, batched, batches)
    if batched:
        return _batches(schema, batches)
    return _rows(schema, batches)


def _batches(schema: Unischema, batches: Iterable[ColumnBatch]) -> Generator[Any, None, None]:
    make = schema._get_namedtuple()
    for batch in batches:
        yield make(**{name: batch_column(batch.columns[name]) for name in schema.fields})


def _rows(schema: Unischema, batches: Iterable[ColumnBatch]) -> Generator[Any, None, None]:
    make = schema._get_namedtuple()._make  # type: ignore[attr-defined]  # a namedtuple class
    names = list(schema.fields)
    for batch in batches:
        if batch.rows_are_tuples:
            yield from zip(*(_rows_of(batch.columns[str(i)]) for i in range(len(batch.columns))), strict=True)
        elif names:
            yield from map(make, zip(*(_rows_of(batch.columns[name]) for name in names), strict=True))


def _rows_of(column: Any) -> Any:
    """The values of a column's rows: the array itself, or each row's value of a nested column."""
    return row_values(column) if is_nested(column) else column


def _windows(schema: Unischema, ngram: NGram, batched: bool,
             batches: Iterable[ColumnBatch]) -> Generator[Any, None, None]:
    """``{offset: row view}`` per window (rows) or per batch of windows (batches)."""
    base = min(ngram.fields)
    views = {offset: ngram.get_schema_at_timestep(schema, offset) for offset in range(base, base + ngram.length)}
    makers = {offset: (view._get_namedtuple()._make, list(view.fields))  # type: ignore[attr-defined]
              for offset, view in views.items()}
    for batch in batches:
        starts = batch.ngram_starts
        assert starts is not None, 'an NGram batch carries its window starts'
        columns = batch.columns
        if batched:
            yield {offset: view.make_namedtuple(**{
                name: batch_column(take_column(columns[name], starts + offset - base)) for name in view.fields})
                for offset, view in views.items()}
            continue
        rows = {name: list(_rows_of(column)) if is_nested(column) else column for name, column in columns.items()}
        for start in starts.tolist():
            yield {offset: make([rows[name][start + offset - base] for name in names])
                   for offset, (make, names) in makers.items()}
