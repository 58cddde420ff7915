"""A Ray Data datasource of Petastorm datasets: our plan decides the read tasks, our worker code decodes.

The driver plans exactly as ``make_reader`` does (:func:`petastorm.reading.setup.set_up_reader`, without a reader
or workers): fields, predicate, ``filters`` and ``rowgroup_selector`` select the row groups, partition values and
Parquet statistics prune them. Each read task gets a handful of the planned work items and reads, filters and
decodes them with :func:`petastorm.reading.worker.read_item` in the Ray worker process, yielding one Arrow block per row
group. n-d arrays and images become Ray tensor columns (:class:`ray.data.extensions.ArrowTensorArray`, in the
tensor format the ``DataContext`` is configured for), so every numpy or torch batch API of Ray sees them with
their dtype and shape.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.data import DataContext, Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata

from petastorm.codecs import ScalarCodec
from petastorm.columns import densified, is_nested, to_arrow
from petastorm.ngram import NGram
from petastorm.plan import ScheduledItem, WorkItem, split_drop_partitions
from petastorm.reader import normalize_dataset_url_or_urls
from petastorm.reading.options import validate_options
from petastorm.reading.setup import set_up_reader
from petastorm.reading.worker import ReadContext, read_item
from petastorm.store.filters import columns_of_expression
from petastorm.unischema import UnischemaField, arrow_type_of_field

__all__ = ['PetastormDatasource']

try:  # A block of rows without columns (ds.count()) keeps its row count in a null column Ray knows to ignore.
    from ray.data._internal.arrow_block import _BATCH_SIZE_PRESERVING_STUB_COL_NAME as _ROW_COUNT_COLUMN
except ImportError:  # pragma: no cover - the name Ray has used for it
    _ROW_COUNT_COLUMN = '__bsp_stub'

logger = logging.getLogger(__name__)

# Reading plain Parquet (no Petastorm metadata) is what Ray users do on purpose: make_reader's warning about it
# does not apply here.
# Guess of the decoded bytes per value of a field whose size the schema does not fix (strings, images of any
# size), used only for Ray's estimate of the in-memory size.
_UNKNOWN_FIELD_BYTES = 64
# Decoded bytes one read task aims at when Ray sets no target block size.
_DEFAULT_TASK_BYTES = 128 * 1024 * 1024


class PetastormDatasource(Datasource):
    """Reads a Petastorm dataset (ours, Petastorm 0.13.1's, or plain Parquet) into Ray Data blocks.

    Use :func:`petastorm.ray.read_petastorm`; the arguments are documented there. The driver lists the row
    groups once, here; read tasks get their work items and the decoding context, never the whole dataset.
    """

    def __init__(self, dataset_url: str | list[str], *, schema_fields: Any = None, predicate: Any = None,
                 filters: Any = None, rowgroup_selector: Any = None, storage_options: dict | None = None,
                 filesystem: Any = None, split_row_groups: bool = False, table_version: Any = None,
                 table_format: Any = 'auto') -> None:
        super().__init__()
        if isinstance(schema_fields, NGram):
            raise ValueError('read_petastorm reads rows, not NGram windows: schema_fields must be None or a list '
                             'of fields or regular expressions, got an NGram')
        self._url = dataset_url
        options = validate_options(
            dataset_url_or_urls=normalize_dataset_url_or_urls(dataset_url), batched_output=False,
            schema_fields=schema_fields, reader_pool_type='dummy', workers_count=1, shuffle_row_groups=False,
            predicate=predicate, rowgroup_selector=rowgroup_selector, filters=filters,
            storage_options=storage_options, filesystem=filesystem, table_version=table_version,
            table_format=table_format)
        setup = set_up_reader(options)
        self._context: ReadContext = setup.context
        self._items: Sequence[WorkItem] = setup.layout.items
        self._store = setup.dataset
        self._schema = setup.schema
        self._split_row_groups = split_row_groups
        self._projection_map: dict[str, str] | None = None

    @property
    def schema(self) -> Any:
        """The Unischema of the fields read (before any projection Ray pushes down)."""
        return self._schema

    def get_name(self) -> str:
        """The name Ray shows for the read operator."""
        return 'ReadPetastorm'

    # -- pushdown -----------------------------------------------------------------------------------------------

    def supports_projection_pushdown(self) -> bool:
        """True: only the columns Ray asks for are read and decoded."""
        return True

    def supports_predicate_pushdown(self) -> bool:
        """True: filters on stored scalar columns are applied while reading (see :meth:`apply_predicate`)."""
        return True

    def apply_predicate(self, predicate_expr: Any) -> PetastormDatasource:
        """Take a Ray filter on stored scalar columns as a row filter and a row-group pruning by statistics.

        A filter that names a codec column (arrays, images: bytes in the files) is left to Ray (``self`` is
        returned, so Ray keeps its ``Filter`` above the read).
        """
        expression = predicate_expr.to_pyarrow()
        fields = {field.name: field for field in self._context.fields}
        partitions = self._context.partition_names
        columns = columns_of_expression(expression, list(dict.fromkeys(list(fields) + list(partitions))))
        if not columns or any(name not in partitions and not _stored_as_is(fields[name]) for name in columns):
            return self
        clone = copy.copy(self)
        previous = self._context.filter_expression
        clone._context = dataclasses.replace(
            self._context, filter_expression=expression if previous is None else previous & expression,
            filter_columns=tuple(dict.fromkeys(self._context.filter_columns + columns)))
        matching = self._store.filter_statistics(expression, whole=False).matching
        pieces = self._context.pieces
        clone._items = tuple(item for item in self._items
                             if (pieces[item.piece_index].path, pieces[item.piece_index].row_group) in matching)
        return clone

    # -- reading ------------------------------------------------------------------------------------------------

    def _output_fields(self) -> tuple[UnischemaField, ...]:
        fields = self._context.fields
        if self._projection_map is None:
            return fields
        return tuple(field for field in fields if field.name in self._projection_map)

    def estimate_inmemory_data_size(self) -> int | None:
        """Decoded bytes of the rows to read, estimated from the schema (Ray sizes its blocks by it)."""
        return sum(item.num_rows for item in self._items) * _row_bytes(self._output_fields())

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        """About ``parallelism`` read tasks, each reading consecutive work items of about equal rows."""
        items = list(self._items)
        if self._split_row_groups and items and parallelism > len(items):
            items = split_drop_partitions(items, math.ceil(parallelism / len(items)))
        if not items:
            return []
        output = self._output_fields()
        # With no column asked for (ds.count()), rows are still counted on one column read, the cheapest one.
        read_fields = output or (min(self._context.fields, key=lambda f: not _stored_as_is(f)),)
        context = dataclasses.replace(self._context, fields=read_fields)
        row_bytes = _row_bytes(output)
        tasks = []
        for group in _contiguous_groups(items, max(1, min(parallelism, len(items)))):
            task_context, task_items = _narrow_context(context, group)
            rows = sum(item.num_rows for item in group)
            exact = context.predicate is None and context.filter_expression is None
            metadata = BlockMetadata(num_rows=rows if exact else None, size_bytes=rows * row_bytes,
                                     exec_stats=None,
                                     input_files=tuple(dict.fromkeys(p.path for p in task_context.pieces)))
            read_fn = _ReadFn(task_context, task_items, [field.name for field in output])
            tasks.append(ReadTask(read_fn, metadata, per_task_row_limit=per_task_row_limit))
        logger.debug('%s: %d read tasks for %d work items', self._url, len(tasks), len(items))
        return tasks

    def default_num_tasks(self) -> int:
        """The read tasks to ask Ray for when the user did not (``override_num_blocks``): few, big ones.

        Ray's default asks for 200 blocks or more, and splits the output of each read task to get them; each task
        costs tens of milliseconds to schedule, more than decoding a small row group. Tasks yield one block per
        work item as they go, so a few tasks stream as well as many: one per CPU of the cluster, more only when
        each would decode more than Ray's target block size.
        """
        decoded = sum(item.num_rows for item in self._items) * _row_bytes(self._output_fields())
        target = DataContext.get_current().target_max_block_size or _DEFAULT_TASK_BYTES
        return max(1, min(len(self._items), max(_cluster_cpus(), math.ceil(decoded / target))))


def _cluster_cpus() -> int:
    return max(1, int(ray.cluster_resources().get('CPU', 1))) if ray.is_initialized() else 1


def _stored_as_is(field: UnischemaField) -> bool:
    """True when the Parquet column holds the field's values themselves (not encoded bytes)."""
    return field.codec is None or isinstance(field.codec, ScalarCodec)


def _row_bytes(fields: Sequence[UnischemaField]) -> int:
    total = 0
    for field in fields:
        shape = field.shape or ()
        try:
            itemsize = np.dtype(field.numpy_dtype).itemsize
        except TypeError:
            itemsize = 0
        dims = [dim for dim in shape if isinstance(dim, int)]
        if len(dims) == len(shape) and itemsize:
            total += itemsize * math.prod(dims)
        else:
            total += _UNKNOWN_FIELD_BYTES
    return max(total, 1)


def _contiguous_groups(items: Sequence[WorkItem], count: int) -> list[list[WorkItem]]:
    """``items`` cut into ``count`` consecutive groups of about the same number of rows."""
    total = sum(item.num_rows for item in items)
    groups: list[list[WorkItem]] = [[] for _ in range(count)]
    done = 0
    for item in items:
        # The group of an item is where the middle of its rows falls in the whole.
        index = min(count - 1, (2 * done + item.num_rows) * count // (2 * total))
        groups[index].append(item)
        done += item.num_rows
    return [group for group in groups if group]


def _narrow_context(context: ReadContext, items: Sequence[WorkItem]) -> tuple[ReadContext, list[WorkItem]]:
    """A context holding only the row groups of ``items`` (a task is not sent every piece of the dataset)."""
    used = list(dict.fromkeys(item.piece_index for item in items))
    position = {piece_index: k for k, piece_index in enumerate(used)}
    narrowed = dataclasses.replace(context, pieces=tuple(context.pieces[i] for i in used))
    return narrowed, [WorkItem(position[i.piece_index], i.row_start, i.row_stop) for i in items]


class _ReadFn:
    """What a read task runs in its Ray worker: read and decode its work items, one block per item."""

    def __init__(self, context: ReadContext, items: list[WorkItem], names: list[str]) -> None:
        self._context = context
        self._items = items
        self._names = names

    def __call__(self) -> Iterator[pa.Table]:
        names = self._names
        for item in self._items:
            batch = read_item(self._context, ScheduledItem(item, 0, 0))
            if not batch.num_rows:
                continue
            if not names:  # Ray asked for no column (ds.count()): a block of rows without columns
                yield pa.table({_ROW_COUNT_COLUMN: pa.nulls(batch.num_rows)})
                continue
            yield _block(self._context.fields, names, batch.columns)


def _block(fields: Sequence[UnischemaField], names: list[str], columns: Any) -> pa.Table:
    """A Ray block of decoded columns.

    Numpy arrays become what Ray makes of them, and so do lists whose rows all have one length (as before lists
    had a column kind of their own); other list, map, struct and masked columns become Arrow arrays of their
    stored type (their buffers become Arrow's again, nulls included).
    """
    columns = {name: _dense_or_nested(columns[name]) for name in names}
    nested = {name for name in names if is_nested(columns[name])}
    if not nested:
        return BlockAccessor.batch_to_block({name: columns[name] for name in names})
    by_name = {field.name: field for field in fields}
    plain = [name for name in names if name not in nested]
    block = BlockAccessor.batch_to_block({name: columns[name] for name in plain}) if plain else None
    arrays = {}
    for name in names:
        if name in nested:
            arrays[name] = to_arrow(columns[name], _stored_type(by_name.get(name)))
        else:
            assert block is not None
            arrays[name] = block.column(name)
    return pa.table(arrays)


def _dense_or_nested(column: Any) -> Any:
    dense = densified(column)
    return dense if isinstance(dense, np.ndarray) else column


def _stored_type(field: UnischemaField | None) -> pa.DataType | None:
    if field is None or (field.codec is not None and not isinstance(field.codec, ScalarCodec)):
        return None
    try:
        return arrow_type_of_field(field)
    except (ValueError, TypeError):
        return None
