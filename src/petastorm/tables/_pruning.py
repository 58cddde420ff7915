"""``filters`` against a table's statistics and partition values, at planning time, without reading any data.

Every row group of a version gets a *guarantee*: an expression every one of its rows satisfies, made of its
file's partition values (``part == 'a'``), the log's statistics of the file (``x >= 3 and x <= 9``), the Parquet
footer's statistics of the row group, and ``is_null`` for the columns its file does not store. pyarrow decides
which guarantees the filter can hold under (``Dataset.get_fragments(filter=...)`` simplifies each against its
fragment's guarantee and opens nothing: :meth:`petastorm.tables.TableStore.filter_statistics`); the planner reads
only those row groups, and the workers still apply the filter to every row they read. This module builds the
guarantees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.store.filters import filters_error
from petastorm.tables.read import TableRowGroup


def bounds_guarantee(name: str, arrow_type: pa.DataType, minimum: Any, maximum: Any, null_count: int | None,
                     num_rows: int | None) -> Any:
    """What statistics say every value of column ``name`` satisfies, or None when they say nothing.

    Args:
        name: the logical column.
        arrow_type: its table type (the bounds are cast to it).
        minimum: smallest value (None: unknown).
        maximum: largest value (None: unknown).
        null_count: nulls among the rows (None: unknown).
        num_rows: rows described.
    """
    field = pc.field(name)
    if null_count is not None and num_rows is not None and num_rows > 0 and null_count >= num_rows:
        return field.is_null()
    if minimum is None or maximum is None:
        return None
    try:
        low, high = pa.scalar(minimum, type=arrow_type), pa.scalar(maximum, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None  # bounds of a type we cannot compare on: no pruning on this column
    inside = (field >= low) & (field <= high)
    return inside if null_count == 0 else inside | field.is_null()


def constant_guarantee(name: str, arrow_type: pa.DataType, value: Any) -> Any:
    """What a partition value says: every row's ``name`` is ``value`` (or null)."""
    if value is None:
        return pc.field(name).is_null()
    return pc.field(name) == pa.scalar(value, type=arrow_type)


def all_of(parts: Sequence[Any]) -> Any:
    """The conjunction of the expressions that are not None (None when there is none)."""
    found = [p for p in parts if p is not None]
    if not found:
        return None
    result = found[0]
    for part in found[1:]:
        result = result & part
    return result


def _row_group_stats(metadata: pq.FileMetaData, index: int, stored: dict[str, str],
                     types: dict[str, pa.DataType]) -> list[Any]:
    row_group = metadata.row_group(index)
    position = {row_group.column(j).path_in_schema: j for j in range(row_group.num_columns)}
    parts = []
    for logical, stored_name in stored.items():
        j = position.get(stored_name)
        if j is None or logical not in types:
            continue  # nested column (its leaves are listed), or not a column a filter can name
        statistics = row_group.column(j).statistics
        if statistics is None:
            continue
        has_bounds = statistics.has_min_max
        null_count = statistics.null_count if statistics.has_null_count else None
        parts.append(bounds_guarantee(logical, types[logical], statistics.min if has_bounds else None,
                                      statistics.max if has_bounds else None, null_count, row_group.num_rows))
    return parts


def row_group_guarantee(row_group: TableRowGroup, index: int, file_guarantee: Any, footer: pq.FileMetaData | None,
                        types: dict[str, pa.DataType]) -> Any:
    """Everything known of the rows of a row group: partition values, file and row-group statistics, missing columns.

    Args:
        row_group: the row group.
        index: its number in its file.
        file_guarantee: what the log's statistics say of every row of its file (None: nothing).
        footer: its file's Parquet footer (None: not read).
        types: the table type of each logical column.
    """
    file = row_group.file
    parts = [constant_guarantee(name, arrow_type, value) for name, arrow_type, value in file.constants]
    parts.extend(pc.field(name).is_null() for name, _ in file.missing)
    parts.append(file_guarantee)
    if footer is not None:
        parts.extend(_row_group_stats(footer, index, dict(file.stored), types))
    return all_of(parts)


def matching_guarantees(guarantees: Sequence[Any], schema: pa.Schema, expression: Any, url: Any) -> list[int]:
    """The indexes of the guarantees (None: nothing known) under which some row may match ``expression``.

    Raises:
        ValueError: the expression names a column ``schema`` does not have, or cannot be applied to its types.
    """
    import pyarrow.dataset as ds  # imports pandas: only when filters are given, as for plain Parquet

    file_format = ds.ParquetFileFormat()
    local = pafs.LocalFileSystem()
    # Fragments are never opened: each one's "path" is the index of its guarantee.
    fragments = [file_format.make_fragment(str(index), local, partition_expression=(
        pc.scalar(True) if guarantee is None else guarantee)) for index, guarantee in enumerate(guarantees)]
    dataset = ds.FileSystemDataset(fragments, schema, file_format, local)
    try:
        return [int(fragment.path) for fragment in dataset.get_fragments(filter=expression)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise filters_error(expression, schema, url, err) from err
