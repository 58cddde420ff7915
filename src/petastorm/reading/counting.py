"""Whether a reader knows the rows of an epoch before reading them, and counting them when asked (``count_rows``).

Which rows an epoch holds is known before reading unless rows are chosen by looking at them: a predicate that
workers evaluate, or ``filters`` whose footer statistics do not decide every row group whole. Then the caller may
ask for them to be counted (``count_rows=True``): the filter and predicate columns of each undecided row group of
the shard are read once, in threads, and the rows each keeps recorded (:class:`~petastorm.plan.RowMatches`), so
that ``len()`` is exact. An NGram reader (its items are windows) and a ``make_batch_reader`` whose transform has a
function (it may drop rows) never know their rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from petastorm.plan import RowMatches, ShardLayout
from petastorm.reading.options import ReaderOptions
from petastorm.reading.worker import ReadContext, row_group_matches
from petastorm.store.model import FilterStatistics
from petastorm.store.pieces import RowGroupPiece

__all__ = ['epoch_rows', 'in_threads', 'rows_known_unfiltered']

T = TypeVar('T')

_MAX_COUNTING_THREADS = 16


def epoch_rows(options: ReaderOptions, context: ReadContext, layout: ShardLayout, pieces: Sequence[RowGroupPiece],
               statistics: FilterStatistics | None, *, worker_predicate: bool) -> tuple[bool, RowMatches | None]:
    """``(rows_known, row_matches)`` of a planned read (see :class:`petastorm.reading.ReaderSetup`).

    Args:
        options: the reader's options (``count_rows``, ``workers_count``, what it delivers).
        context: what every worker receives (counting reads with it, without the cache).
        layout: this shard's epochs.
        pieces: every row group of the store.
        statistics: what the footers' statistics say of the ``filters`` (None: no filters).
        worker_predicate: the workers evaluate a predicate (one on partition fields only was decided when planning).

    Raises:
        ValueError: ``count_rows=True`` for a reader whose rows cannot be counted.
    """
    read_here = sorted({item.piece_index for item in layout.items})  # this shard's row groups only
    undecided = [i for i in read_here if worker_predicate or (
        statistics is not None and (pieces[i].path, pieces[i].row_group) not in statistics.matching_all)]
    countable = _countable(options, context)
    if options.count_rows and not countable:
        raise ValueError('count_rows=True cannot count the rows of an NGram reader (its items are windows) or of '
                         'a make_batch_reader whose TransformSpec has a function (it may drop rows): leave '
                         'count_rows out')
    rows_known = countable and (not undecided or options.count_rows)
    row_matches = _count_matches(context, undecided, options.workers_count) if rows_known and undecided else None
    return rows_known, row_matches


def rows_known_unfiltered(options: ReaderOptions, context: ReadContext) -> bool:
    """``rows_known`` of a read that no filters, selector or row counting decide, told before its plan is made.

    What :func:`epoch_rows` gives such a read (a streamed plan's, :mod:`petastorm.reading.streamed_plan`): its rows
    are known unless its items are not rows or the workers evaluate a predicate.
    """
    return _countable(options, context) and context.predicate is None


def _countable(options: ReaderOptions, context: ReadContext) -> bool:
    """The rows delivered are the rows read: no NGram windows, no batch function that may drop rows."""
    return context.ngram is None and not _batch_function(options)


def _count_matches(context: ReadContext, piece_indexes: list[int], workers_count: int) -> RowMatches:
    """The rows each row group keeps (``count_rows``): filter and predicate columns only, read in threads."""
    counting = dataclasses.replace(context, cache=None)  # the cache holds whole row groups, as the workers read them
    masks = in_threads(lambda index: row_group_matches(counting, index), piece_indexes, workers_count)
    return {index: mask for index, mask in zip(piece_indexes, masks, strict=True) if not mask.all()}


def in_threads(function: Callable[[int], T], piece_indexes: Sequence[int], workers_count: int) -> list[T]:
    """``function`` of each row group (by piece index), run in up to ``workers_count`` threads, in order.

    What a reader reads of row groups when it is made (counting rows, finding categories) runs so.
    """
    with ThreadPoolExecutor(max_workers=max(1, min(workers_count, _MAX_COUNTING_THREADS, len(piece_indexes))),
                            thread_name_prefix='petastorm-setup') as pool:
        return list(pool.map(function, piece_indexes))


def _batch_function(options: ReaderOptions) -> bool:
    """A ``make_batch_reader`` transform function: it may drop rows."""
    spec = options.transform_spec
    return options.batched_output and spec is not None and spec.func is not None
