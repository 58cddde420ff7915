"""Which row groups a reader reads: pruning by partition predicate, row-group selector and filter statistics.

Each function takes the piece indexes still selected and returns those to keep, in the same order. They run once,
when a reader is built; pruning by statistics reads the Parquet footers, the selector reads the stored indexes.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petastorm.metadata.store import ParquetStore, RowGroupPiece
from petastorm.unischema import Unischema


def filter_expression(filters: Any) -> Any:
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
    # pyarrow does not expose the fields an expression references; its text names them as field refs.
    text = str(expression)
    return tuple(name for name in candidates if name in text)


def prune_by_partition_predicate(pieces: list[RowGroupPiece], indexes: list[int], schema: Unischema,
                                  predicate: Any) -> list[int]:
    kept = []
    for index in indexes:
        values = {}
        for name, raw in pieces[index].partition_keys:
            field = schema.fields.get(name)
            dtype = field.numpy_dtype if field is not None else np.str_
            values[name] = dtype(int(raw)) if issubclass(dtype, np.integer) else dtype(raw)
        if predicate.do_include(values):
            kept.append(index)
    return kept


def apply_selector(store: ParquetStore, indexes: list[int], selector: Any) -> list[int]:
    from petastorm.etl.rowgroup_indexing import get_row_group_indexes

    available = get_row_group_indexes(store)
    missing = [name for name in selector.get_index_names() if name not in available]
    if missing:
        raise ValueError(f'Some of required indexes {missing} are not available in {store.url} '
                         f'(available: {sorted(available)})')
    selected = selector.select_row_groups(available)
    return [i for i in indexes if i in selected]


def prune_by_statistics(store: ParquetStore, pieces: list[RowGroupPiece], indexes: list[int],
                         expression: Any) -> list[int]:
    """Drop row groups whose Parquet statistics (or partition values) prove no row can match the filters."""
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(flavor='hive') if store.partition_names else None
    dataset = ds.dataset(list(store.files), filesystem=store.filesystem, format='parquet',
                         partitioning=partitioning, partition_base_dir=store.root)
    matching: set[tuple[str, int]] = set()
    try:
        for fragment in dataset.get_fragments():
            # Bind against the dataset schema: partition columns exist there, not in the file.
            for row_group_fragment in fragment.split_by_row_group(expression, schema=dataset.schema):
                for row_group in row_group_fragment.row_groups:
                    matching.add((fragment.path, row_group.id))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise filters_error(expression, dataset.schema, store.url, err) from err
    return [i for i in indexes if (pieces[i].path, pieces[i].row_group) in matching]


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
