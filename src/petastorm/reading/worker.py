"""The worker function: read one work item (a row range of a row group), filter, decode, transform.

Everything happens on whole columns: the row group's needed columns are read with pyarrow, filtered, shuffled
with one ``take``, and decoded column by column with the codecs. The result is a
:class:`~petastorm.reading.batch.ColumnBatch` of numpy columns, which every pool kind moves to the consumer without
per-row objects. Only a ``TransformSpec`` function written for rows (``make_reader``) is called once per row,
because that is its contract (see :mod:`petastorm.reading.column_transform`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from petastorm.cache import RowGroupCache, cached_decoded_values
from petastorm.codecs import VideoCodec, decode_stored_column
from petastorm.columns import Column, is_nested, row_values
from petastorm.columns import num_rows as column_rows
from petastorm.errors import (
    DecodeFieldError,
    MissingDependencyError,
)
from petastorm.fs._files import file_url
from petastorm.ngram import NGram
from petastorm.plan import ScheduledItem, row_permutation, unit_rows
from petastorm.plan.row_keys import row_draw_keys
from petastorm.predicates import PredicateBase, PredicateError
from petastorm.reading.batch import ColumnBatch
from petastorm.reading.column_transform import TransformTarget, apply_transform, pandas_column
from petastorm.reading.media_paths import resolve_media_paths
from petastorm.shuffle import take_rows
from petastorm.stage_timing import StageClock, lap
from petastorm.store.data_files import DataFiles
from petastorm.store.pieces import RowGroupPiece
from petastorm.store.row_groups import read_row_group
from petastorm.store.unify import conform_table
from petastorm.typemaps.scalars import scalar_column_to_numpy
from petastorm.unischema import UnischemaField

__all__ = [
    'ReadContext', 'append_partition_columns', 'decode_columns', 'gather_rows', 'prefetch_item', 'read_item',
    'read_whole_row_group', 'row_group_matches',
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadContext:
    """Everything a worker needs, sent to each worker once.

    Attributes:
        filesystem: where the files are.
        pieces: every row group of the dataset, by piece index (a list that grows while a thread pool's reader
            plans as the footers come: an item is read only once its row group is in it).
        fields: the fields to deliver (before the transform), in output order.
        predicate_fields: fields the predicate needs (read and decoded first).
        predicate: row filter or None.
        batched_output: ``make_batch_reader`` semantics (a predicate without ``evaluate`` sees a DataFrame).
        shuffle_rows: shuffle rows inside each work item.
        filter_expression: pyarrow filter applied to the rows (from ``filters``) or None.
        filter_columns: columns the filter expression reads.
        partition_names: partition columns (not stored in the files: hive directories or a table's log give them).
        transform: the transform and what it must produce, or None.
        ngram: the NGram whose windows to form, or None.
        cache: caches the row groups read from the files (raw, or decoded: ``DecodedRowGroupCache``), or None.
        time_stages: measure the seconds of each stage (see :mod:`petastorm.stage_timing`) and return them with
            the batch; off by default, then nothing is measured.
        data_files: the store's data files: what the listing said of them (a file found otherwise when read
            changed since: :class:`~petastorm.errors.DataFileChangedError`) and, per process, their footers.
        column_paths: ``(field name, Parquet paths)`` of the fields read by paths rather than by name: the leaves
            of struct fields (reading them reads only the struct fields the schema holds).
        file_columns: ``(file path, its columns)`` of the files whose schemas differ from the store's unified
            schema (:mod:`petastorm.store.unify`); their tables are made to fit ``unified_types``.
        unified_types: ``(column, Arrow type)`` of the columns read, in the unified schema.
    """

    filesystem: pafs.FileSystem
    pieces: Sequence[RowGroupPiece]
    fields: tuple[UnischemaField, ...]
    predicate_fields: tuple[UnischemaField, ...] = ()
    predicate: PredicateBase | None = None
    batched_output: bool = False
    shuffle_rows: bool = False
    filter_expression: Any = None
    filter_columns: tuple[str, ...] = ()
    partition_names: tuple[str, ...] = ()
    transform: TransformTarget | None = None
    ngram: NGram | None = None
    cache: RowGroupCache | None = None
    time_stages: bool = False
    data_files: DataFiles | None = None
    column_paths: tuple[tuple[str, tuple[str, ...]], ...] = ()
    file_columns: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unified_types: tuple[tuple[str, pa.DataType], ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # Predicates and transforms are often lambdas or closures: ship the context with cloudpickle.
        import cloudpickle

        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return _context_from_bytes, (cloudpickle.dumps(state),)


def _context_from_bytes(blob: bytes) -> ReadContext:
    import cloudpickle

    return ReadContext(**cloudpickle.loads(blob))


def _stored_columns(ctx: ReadContext, piece: RowGroupPiece, names: list[str]) -> list[str]:
    """The Parquet column paths of the row group's file that hold the (non-partition) columns ``names``."""
    paths = dict(ctx.column_paths)
    present = dict(ctx.file_columns).get(piece.path)  # the file differs from the unified schema: read what it has
    file_columns = [path for n in names if n not in ctx.partition_names and (present is None or n in present)
                    for path in paths.get(n, (n,))]
    # A table's file stores the logical columns under its own names (or not at all): the piece knows.
    return piece.stored_paths(file_columns)


def _first_read(ctx: ReadContext) -> list[str]:
    """The columns an item reads first: with a predicate, its columns (the others only when a row matched)."""
    first = [f.name for f in ctx.predicate_fields] if ctx.predicate is not None else [f.name for f in ctx.fields]
    return list(dict.fromkeys(first + list(ctx.filter_columns)))


def prefetch_item(ctx: ReadContext, scheduled: ScheduledItem) -> None:
    """Start fetching what :func:`read_item` will read first of ``scheduled``, where the data files can fetch ahead.

    A reader calls it as it hands an item to its thread pool, so that the item's round trips overlap the work of
    the items before it (see :meth:`petastorm.store.data_files.DataFiles.prefetch`).
    """
    if ctx.data_files is None or ctx.cache is not None:
        return  # with a cache, the row group may be there already
    piece = ctx.pieces[scheduled.item.piece_index]
    ctx.data_files.prefetch(piece.path, piece.row_group, _stored_columns(ctx, piece, _first_read(ctx)))


def _read_columns(ctx: ReadContext, piece: RowGroupPiece, names: list[str], row_start: int,
                  row_stop: int, readers: int = 1) -> pa.Table:
    """Columns ``names`` of rows ``[row_start, row_stop)`` of the row group, partition columns included.

    ``readers``: scheduled items that read these columns of the row group (see
    :meth:`~petastorm.store.data_files.DataFiles.read_row_group`).
    """
    wanted = [n for n in names if n not in ctx.partition_names]
    present = dict(ctx.file_columns).get(piece.path)
    stored = _stored_columns(ctx, piece, names)
    files = ctx.data_files if ctx.data_files is not None else DataFiles(ctx.filesystem)

    def read() -> pa.Table:
        return read_row_group(files, piece.path, piece.row_group, stored, readers)

    # The cache holds whole row groups as read, so drop partitions and predicates share its entries.
    table = read() if ctx.cache is None else ctx.cache.read(piece.path, piece.row_group, stored, read)
    if present is not None:
        types = dict(ctx.unified_types)
        table = conform_table(table, pa.schema([pa.field(n, types[n]) for n in wanted if n in types]), piece.path)
    table = piece.logical_table(table, wanted)  # a table's: its version's rows (deletes applied as one mask)
    if row_start != 0 or row_stop != table.num_rows:
        table = table.slice(row_start, row_stop - row_start)
    partition_fields = [next((f for f in ctx.fields + ctx.predicate_fields if f.name == name),
                             UnischemaField(name, np.str_, (), None, False))
                        for name in names if name in ctx.partition_names]
    return resolve_media_paths(ctx.fields, ctx.filesystem, piece,
                               append_partition_columns(table, piece, partition_fields))


def append_partition_columns(table: pa.Table, piece: RowGroupPiece,
                             partition_fields: list[UnischemaField]) -> pa.Table:
    """``table`` (rows of ``piece``) with a column for each of the partition fields appended, valued by the piece."""
    for field in partition_fields:
        table = table.append_column(field.name, piece.partition_column(field, table.num_rows))
    return table


def decode_columns(fields: tuple[UnischemaField, ...] | list[UnischemaField], table: pa.Table,
                   where: str, row_keys: np.ndarray | None = None, text_as_objects: bool = False) -> dict[str, Column]:
    """Decode every field's column of ``table`` (codecs decode whole columns at once; see :mod:`petastorm.columns`).

    ``row_keys``: the keys of the rows' random draws (:func:`petastorm.plan.row_keys.row_draw_keys`), for codecs
    that draw (a video clip's start). ``text_as_objects``: strings as objects, for a pandas DataFrame (see
    :func:`~petastorm.typemaps.scalars.scalar_column_to_numpy`).
    """
    columns: dict[str, Column] = {}
    for field in fields:
        column = table.column(field.name)
        try:
            cached = cached_decoded_values(field, column)  # from a decoded-column cache entry: already decoded
            if cached is not None:
                columns[field.name] = cached
            elif field.codec is not None:
                # The ndarray codecs also refuse arrays whose dtype or shape is not the field's.
                columns[field.name] = decode_stored_column(field, column, row_keys)
            else:
                columns[field.name] = scalar_column_to_numpy(field, column, text_as_objects)
        except MissingDependencyError:
            raise  # names the library and the extra to install: nothing about this row group to add
        except Exception as err:
            raise DecodeFieldError(f'Decoding field "{field.name}" failed in {where}: {err}') from err
    return columns


def _expression_mask(table: pa.Table, expression: Any) -> np.ndarray:
    import pyarrow.dataset as ds

    mask = ds.dataset(table).to_table(columns={'mask': expression}).column('mask')
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)


def read_whole_row_group(ctx: ReadContext, piece_index: int, names: list[str]) -> pa.Table:
    """Columns ``names`` of every delivered row of a row group, as stored (not decoded), partition columns included.

    What a reader reads once of every row group when it is made (``categorical_codes`` whose categories it takes
    from the data).
    """
    piece = ctx.pieces[piece_index]
    return _read_columns(ctx, piece, names, 0, piece.num_rows)


def row_group_matches(ctx: ReadContext, piece_index: int) -> np.ndarray:
    """Which rows of a whole row group the filters and the predicate keep (a bool mask), reading only their columns.

    The same tests as :func:`read_item`, on the row group's rows in file order; a reader counts the rows it will
    deliver with it (``count_rows=True``).
    """
    piece = ctx.pieces[piece_index]
    where = f'{piece.path} (row group {piece.row_group})'
    predicate_names = [f.name for f in ctx.predicate_fields] if ctx.predicate is not None else []
    table = _read_columns(ctx, piece, list(dict.fromkeys(predicate_names + list(ctx.filter_columns))), 0,
                          piece.num_rows)
    keep = np.ones(piece.num_rows, dtype=bool)
    if ctx.filter_expression is not None:
        keep &= _expression_mask(table, ctx.filter_expression)
    if ctx.predicate is not None:
        candidates = np.flatnonzero(keep)
        values = decode_columns(ctx.predicate_fields, gather_rows(table.select(predicate_names), candidates), where)
        keep[candidates[~_evaluate_predicate(ctx, values, len(candidates))]] = False
    return keep


def read_item(ctx: ReadContext, scheduled: ScheduledItem) -> ColumnBatch:
    """Read, filter, shuffle, decode and transform one work item.

    The predicate's columns are read and decoded first; the other columns are read only when a row matched.

    Returns:
        The batch of the item's rows that passed the filters, in the item's order; with ``ctx.time_stages``,
        its ``stage_seconds`` say where the time went.
    """
    clock = StageClock() if ctx.time_stages else None
    try:
        batch = _read_item(ctx, scheduled, clock)
    except DecodeFieldError:
        raise  # its message already names the file and row group
    except Exception as err:
        # The original type and traceback stay (callers catch what they raised); the note says where it happened.
        _add_note(err, f'while reading {_where(ctx, scheduled)}')
        raise
    if clock is not None:
        batch = dataclasses.replace(batch, stage_seconds=clock.seconds)
    return batch


def _where(ctx: ReadContext, scheduled: ScheduledItem) -> str:
    item = scheduled.item
    piece = ctx.pieces[item.piece_index]
    url = file_url(ctx.filesystem, piece.path)
    return f'{url} (row group {piece.row_group}, rows {item.row_start}-{item.row_stop})'


def _add_note(err: BaseException, note: str) -> None:
    add_note = getattr(err, 'add_note', None)  # Python >= 3.11
    if add_note is not None:
        add_note(note)


def _read_item(ctx: ReadContext, scheduled: ScheduledItem, clock: StageClock | None) -> ColumnBatch:
    """The stages of :func:`read_item`, each timed under its name when ``clock`` is given."""
    item = scheduled.item
    piece = ctx.pieces[item.piece_index]
    where = _where(ctx, scheduled)
    names = [f.name for f in ctx.fields]
    # An NGram window may start in this item and end in the next rows of the row group: read them too.
    row_stop = item.row_stop if ctx.ngram is None else min(item.row_stop + ctx.ngram.length - 1, piece.num_rows)
    table = _read_columns(ctx, piece, _first_read(ctx), item.row_start, row_stop, scheduled.row_group_readers)
    lap(clock, 'io')
    kept = _apply_filters(ctx, table, _unit_order(ctx, scheduled))
    lap(clock, 'filter')
    if ctx.predicate is not None:
        kept = _apply_predicate(ctx, table, kept, where, clock)
        lap(clock, 'filter')
        if kept.selection is not None and not len(kept.selection):
            return ColumnBatch.empty(item)
        rest = [n for n in names if n not in table.column_names]
        if rest:
            others = _read_columns(ctx, piece, rest, item.row_start, row_stop)
            for name in rest:
                table = table.append_column(name, others.column(name))
            lap(clock, 'io')
    table, num_rows = _take_rows(table, names, kept.selection)
    lap(clock, 'filter')
    # A make_batch_reader transform function gets a DataFrame: its text goes there as the objects pandas holds,
    # without a fixed-width array as wide as the longest text of the row group on the way.
    frame = ctx.transform is not None and ctx.transform.batched and ctx.transform.spec.func is not None
    columns = decode_columns(ctx.fields, table, where, _draw_keys(ctx, scheduled, kept.selection, num_rows),
                             text_as_objects=frame)
    lap(clock, 'decode')
    batch = _make_batch(ctx, columns, kept, scheduled, num_rows, where)
    lap(clock, 'transform')
    return _with_row_positions(batch, num_rows, kept.positions)


@dataclass(frozen=True)
class _Kept:
    """The rows of a work item's table that go on, as the filtering stages narrow them.

    Attributes:
        selection: the table's rows to keep, in delivery order (None: every row, in file order).
        positions: once filters dropped rows, where each kept row is in the unit's order (None: none dropped).
    """

    selection: np.ndarray | None
    positions: np.ndarray | None = None


def _unit_order(ctx: ReadContext, scheduled: ScheduledItem) -> _Kept:
    """Every row of the item, in the unit's order (NGram windows need file order: the windows are shuffled)."""
    return _Kept(None if ctx.ngram is not None else unit_rows(scheduled, ctx.shuffle_rows))


def _apply_filters(ctx: ReadContext, table: pa.Table, kept: _Kept) -> _Kept:
    """The rows the ``filters`` expression keeps."""
    if ctx.filter_expression is None:
        return kept
    keep = _expression_mask(table, ctx.filter_expression)
    positions = np.flatnonzero(keep if kept.selection is None else keep[kept.selection])
    return _Kept(positions if kept.selection is None else kept.selection[positions], positions)


def _apply_predicate(ctx: ReadContext, table: pa.Table, kept: _Kept, where: str, clock: StageClock | None) -> _Kept:
    """The rows the predicate keeps, judged on its fields' decoded columns."""
    candidates = table.select([f.name for f in ctx.predicate_fields])
    if kept.selection is not None:
        candidates = gather_rows(candidates, kept.selection)
    predicate_columns = decode_columns(ctx.predicate_fields, candidates, where)
    lap(clock, 'decode')
    mask = _evaluate_predicate(ctx, predicate_columns, candidates.num_rows)
    return _Kept(np.flatnonzero(mask) if kept.selection is None else kept.selection[mask],
                 np.flatnonzero(mask) if kept.positions is None else kept.positions[mask])


def _draw_keys(ctx: ReadContext, scheduled: ScheduledItem, selection: np.ndarray | None,
               num_rows: int) -> np.ndarray | None:
    """The keys of the decoded rows' random draws, when a field's codec draws (a video clip's start)."""
    if not any(isinstance(field.codec, VideoCodec) for field in ctx.fields):
        return None
    return row_draw_keys(scheduled, selection, num_rows)


def _take_rows(table: pa.Table, names: list[str], selection: np.ndarray | None) -> tuple[pa.Table, int]:
    """The delivered fields' columns of the kept rows, in delivery order, and their number of rows."""
    # Counted before the columns are chosen: a table without columns keeps no rows through take().
    num_rows = table.num_rows if selection is None else len(selection)
    table = table.select(names)
    if selection is not None:
        table = gather_rows(table, selection)
    return table, num_rows


def gather_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """Rows ``rows`` of ``table``, in that order: a slice (no copy) when they are consecutive, else gathered.

    An unshuffled part of a row group is consecutive rows; slicing it also spares a process the first ``take``,
    which initialises pyarrow's compute functions (about 0.2 s, on the way to the first batch). Shuffled rows are
    gathered by :func:`petastorm.shuffle.take_rows` (ragged number lists a row's range at a time).
    """
    count = len(rows)
    # The span check is a cheap reject of shuffled rows before looking at every step.
    if count and int(rows[-1]) - int(rows[0]) == count - 1 and bool(np.all(np.diff(rows) == 1)):
        return table.slice(int(rows[0]), count)
    return take_rows(table, rows)


def _make_batch(ctx: ReadContext, columns: dict[str, Column], kept: _Kept, scheduled: ScheduledItem,
                num_rows: int, where: str) -> ColumnBatch:
    """The batch of the decoded columns: NGram windows, or the rows through the transform."""
    if ctx.ngram is not None:
        return _form_windows(ctx.ngram, ctx.shuffle_rows, columns, kept.selection, scheduled, num_rows)
    out = apply_transform(ctx.transform, columns, num_rows, where)
    return ColumnBatch(out.columns, out.num_rows, out.rows_are_tuples, scheduled.item)


def _with_row_positions(batch: ColumnBatch, num_rows: int, positions: np.ndarray | None) -> ColumnBatch:
    """``batch`` telling which rows of the unit's order it holds, for resumable readers."""
    # ``positions`` when filters dropped rows; when a transform changed the row count, which input row each output
    # row is cannot be told.
    if batch.num_rows != (num_rows if positions is None else len(positions)):
        return dataclasses.replace(batch, untracked=True)
    return batch if positions is None else dataclasses.replace(batch, positions=positions)


def _objects_of_rows(column: Column) -> np.ndarray:
    out = np.empty(column_rows(column), dtype=object)
    for i, value in enumerate(row_values(column)):
        out[i] = value
    return out


def _form_windows(ngram: NGram, shuffle: bool, columns: dict[str, Column], selection: np.ndarray | None,
                  scheduled: ScheduledItem, num_rows: int) -> ColumnBatch:
    """Find the NGram windows that start in this item's own rows; the reader cuts them out of the columns."""
    positions = np.arange(num_rows) if selection is None else selection
    start_limit = int(np.searchsorted(positions, scheduled.item.num_rows))
    starts = ngram.window_starts(columns[ngram.timestamp_field[0]], start_limit)  # type: ignore[arg-type]
    if shuffle and len(starts) > 1:
        starts = starts[row_permutation(len(starts), scheduled.shuffle_seed)]
    return ColumnBatch(columns, len(starts), item=scheduled.item, ngram_starts=starts)


def _evaluate_predicate(ctx: ReadContext, decoded: dict[str, Column], num_rows: int) -> np.ndarray:
    predicate = ctx.predicate
    assert predicate is not None
    fields = {field.name: field for field in ctx.predicate_fields}
    if ctx.batched_output and not predicate.vectorized:
        import pandas as pd

        frame = pd.DataFrame({name: pandas_column(values, fields.get(name)) for name, values in decoded.items()})
        try:
            result = predicate.do_include(frame)
        except ValueError as err:
            if 'truth value of a Series is ambiguous' not in str(err):
                raise
            raise PredicateError(f'predicate {predicate!r} asked a pandas Series for one truth value ({err}): '
                                 f'make_batch_reader evaluates a predicate once per row group, with a Series per '
                                 f"field, not once per row. Write it element-wise (in_lambda(['x'], lambda x: "
                                 f'(x > 5) & (x < 10)), x.isin(values)) or read with make_reader, which calls '
                                 f'it with one row at a time') from err
        mask = np.asarray(result, dtype=bool)
    else:
        # Predicates see each row's value as a row reader gives it: None for a null, a dict for a struct.
        columns = {name: _objects_of_rows(values) if is_nested(values) else values for name, values in decoded.items()}
        mask = np.asarray(predicate.evaluate(columns, num_rows), dtype=bool)  # type: ignore[arg-type]
    if mask.shape != (num_rows,):
        raise ValueError(f'predicate {predicate!r} returned a mask of shape {mask.shape}; expected ({num_rows},)')
    return mask
