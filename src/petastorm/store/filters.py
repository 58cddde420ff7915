"""Reading with ``filters``: the pyarrow expression they make, and which row groups' statistics may match it.

:func:`filter_statistics` reads the Parquet footers (statistics), or the ``_metadata`` summary that holds them
all, and the hive partition values of a plain store (a table's are its log's: :class:`petastorm.tables.TableStore`);
the planner keeps only the row groups that may match (see :func:`petastorm.plan.select_row_groups`). It also tells
which of them match in every row, so that a reader knows how many rows it delivers without reading them.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from petastorm.store.footers import summary_footer
from petastorm.store.listing import SUMMARY_METADATA
from petastorm.store.model import FilterStatistics, ParquetStore

__all__ = ['columns_of_expression', 'filter_expression', 'filter_statistics', 'filters_error']


def filter_expression(filters: Any) -> Any:
    """The ``pyarrow.compute.Expression`` of DNF ``filters`` (an expression passes through; None stays None).

    Raises:
        ValueError: ``filters`` is not a valid DNF filter list.
    """
    if filters is None:
        return None
    import pyarrow.compute as pc

    if isinstance(filters, pc.Expression):
        return filters
    try:
        return pq.filters_to_expression(filters)
    except (TypeError, ValueError) as err:
        raise ValueError(f'filters {filters!r} are not valid pyarrow DNF filters: {err}') from err


def columns_of_expression(expression: Any, candidates: list[str]) -> tuple[str, ...]:
    """The names among ``candidates`` that ``expression`` reads, in ``candidates`` order."""
    # pyarrow does not expose the fields an expression references; its text names them as field refs.
    text = str(expression)
    return tuple(name for name in candidates if name in text)


def filter_statistics(store: ParquetStore, expression: Any, whole: bool = True) -> FilterStatistics:
    """Which row groups of a plain store may match ``expression`` and, with ``whole``, which match in every row.

    A row group matches in every row when the statistics prove the negated expression false everywhere; pyarrow
    counts a column with nulls as possibly null, so a row that the filter would drop as null is never assumed.

    Raises:
        ValueError: the expression names a column the store does not have, or cannot be applied to its types.
    """
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(flavor='hive') if store.partition_names else None
    if summary_footer(store) is not None and store.root is not None:
        # The summary holds every row group's statistics: no data file's footer is read.
        dataset = ds.parquet_dataset(posixpath.join(store.root, SUMMARY_METADATA), filesystem=store.filesystem,
                                     partitioning=partitioning, partition_base_dir=store.root)
    else:
        dataset = ds.dataset(list(store.files), filesystem=store.filesystem, format='parquet',
                             partitioning=partitioning, partition_base_dir=store.root)
    matching: set[tuple[str, int]] = set()
    failing: set[tuple[str, int]] = set()
    try:
        for fragment in dataset.get_fragments():
            # Bind against the dataset schema: partition columns exist there, not in the file.
            for row_group_fragment in fragment.split_by_row_group(expression, schema=dataset.schema):
                matching.update((fragment.path, row_group.id) for row_group in row_group_fragment.row_groups)
            if whole:
                for row_group_fragment in fragment.split_by_row_group(~expression, schema=dataset.schema):
                    failing.update((fragment.path, row_group.id) for row_group in row_group_fragment.row_groups)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise filters_error(expression, dataset.schema, store.url, err) from err
    return FilterStatistics(frozenset(matching), frozenset(matching - failing) if whole else frozenset())


def filters_error(expression: Any, schema: pa.Schema, url: Any, err: BaseException) -> ValueError:
    """The error for ``filters`` that pyarrow cannot apply to the dataset: an unknown column or a wrong type."""
    columns = ', '.join(f'{field.name} ({field.type})' for field in schema)
    unknown = re.findall(r'FieldRef\.Name\(([^)]*)\)', str(err))
    if unknown:
        return ValueError(f'filters={expression} name columns the dataset {url} does not have: '
                          f'{", ".join(unknown)}. Its columns: {columns}')
    detail = str(err).splitlines()[0] if str(err) else ''
    return ValueError(f'filters={expression} cannot be applied to the columns of the dataset {url} '
                      f'({type(err).__name__}: {detail}). Its columns: {columns}')
