"""The worker function: read one work item (a row range of a row group), filter, decode, transform.

Everything happens on whole columns: the row group's needed columns are read with pyarrow, filtered, shuffled
with one ``take``, and decoded column by column with the codecs. The result is a dict of numpy columns (plus a
small ``'.meta'`` entry), which every pool kind moves to the consumer without per-row objects. Only a
``TransformSpec`` function written for rows (``make_reader``) is called once per row, because that is its
contract.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.cache import RowGroupCache, cached_decoded_values
from petastorm.codecs import stack_or_objects
from petastorm.errors import CorruptDataError, DecodeFieldError, PetastormError, StorageNotFoundError
from petastorm.metadata.store import RowGroupPiece
from petastorm.plan import ScheduledItem, row_permutation
from petastorm.predicates import PredicateBase
from petastorm.scalars import scalar_column_to_numpy
from petastorm.stage_timing import STAGE_SECONDS, StageClock, lap
from petastorm.transform import (
    TransformResultError,
    TransformSpec,
    check_row_result,
    check_transformed_values,
    describe_function,
)
from petastorm.unischema import Unischema, UnischemaField

logger = logging.getLogger(__name__)

META = '.meta'
#: with an NGram: positions (in the returned columns) where each window starts.
NGRAM_STARTS = '.ngram_starts'


@dataclass(frozen=True)
class ReadContext:
    """Everything a worker needs, sent to each worker once.

    Attributes:
        filesystem: where the files are.
        pieces: every row group of the dataset, by piece index.
        fields: the fields to deliver (before the transform), in output order.
        predicate_fields: fields the predicate needs (read and decoded first).
        predicate: row filter or None.
        transform: transform spec or None.
        result_fields: names of the fields after the transform.
        batched_output: ``make_batch_reader`` semantics (transform sees a DataFrame) when True.
        shuffle_rows: shuffle rows inside each work item.
        filter_expression: pyarrow filter applied to the rows (from ``filters``) or None.
        filter_columns: columns the filter expression reads.
        partition_names: hive partition columns (not stored in the files).
        ngram: the NGram whose windows to form, or None.
        cache: caches the row groups read from the files (raw, or decoded: ``DecodedRowGroupCache``), or None.
        time_stages: measure the seconds of each stage (see :mod:`petastorm.stage_timing`) and return them in
            ``'.meta'``; off by default, then nothing is measured.
        result_schema: the schema after the transform, against which the first result of the transform function
            is checked in each work item (None: only the field names are checked).
    """

    filesystem: pafs.FileSystem
    pieces: tuple[RowGroupPiece, ...]
    fields: tuple[UnischemaField, ...]
    predicate_fields: tuple[UnischemaField, ...]
    predicate: PredicateBase | None
    transform: TransformSpec | None
    result_fields: tuple[str, ...]
    batched_output: bool
    shuffle_rows: bool
    filter_expression: Any
    filter_columns: tuple[str, ...]
    partition_names: tuple[str, ...]
    ngram: Any = None
    cache: RowGroupCache | None = None
    time_stages: bool = False
    result_schema: Unischema | None = None

    def __reduce__(self) -> tuple:
        # Predicates and transforms are often lambdas or closures: ship the context with cloudpickle.
        import cloudpickle

        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return _context_from_bytes, (cloudpickle.dumps(state),)


def _context_from_bytes(blob: bytes) -> ReadContext:
    import cloudpickle

    return ReadContext(**cloudpickle.loads(blob))


def partition_column(piece: RowGroupPiece, field: UnischemaField, num_rows: int) -> pa.Array:
    """The column of hive partition field ``field`` for ``num_rows`` rows of ``piece`` (its directory's value)."""
    value = dict(piece.partition_keys).get(field.name)
    if value is None:
        return pa.nulls(num_rows)
    numpy_type = field.numpy_dtype
    if isinstance(numpy_type, type) and issubclass(numpy_type, np.integer):
        return pa.array(np.full(num_rows, int(value), dtype=np.int64))
    return pa.array([value] * num_rows, type=pa.string())


def _read_columns(ctx: ReadContext, piece: RowGroupPiece, names: list[str], row_start: int,
                  row_stop: int) -> pa.Table:
    """Columns ``names`` of rows ``[row_start, row_stop)`` of the row group, partition columns included."""
    file_columns = [n for n in names if n not in ctx.partition_names]

    def read() -> pa.Table:
        try:
            with ctx.filesystem.open_input_file(piece.path) as handle:
                # pre_buffer: the selected column chunks are fetched in few coalesced ranged requests, not one each.
                return pq.ParquetFile(handle, pre_buffer=True).read_row_group(piece.row_group, columns=file_columns)
        except PetastormError:
            raise  # storage errors already translated by the filesystem layer
        except FileNotFoundError as err:
            raise StorageNotFoundError(f'data file {piece.path} no longer exists (it was listed when the reader '
                                       f'was made): {err}') from err
        except (OSError, pa.ArrowException) as err:
            if isinstance(err, OSError) and _is_access_error(err):
                raise  # the storage refused or failed (permissions, network): the file itself may be fine
            raise CorruptDataError(f'cannot read row group {piece.row_group} of the Parquet file {piece.path}: '
                                   f'expected a readable Parquet file with the row groups listed in the dataset '
                                   f'metadata ({type(err).__name__}: {err})') from err

    # The cache holds whole row groups as read, so drop partitions and predicates share its entries.
    table = read() if ctx.cache is None else ctx.cache.read(piece.path, piece.row_group, file_columns, read)
    if row_start != 0 or row_stop != table.num_rows:
        table = table.slice(row_start, row_stop - row_start)
    partition_fields = [next((f for f in ctx.fields + ctx.predicate_fields if f.name == name),
                             UnischemaField(name, np.str_, (), None, False))
                        for name in names if name in ctx.partition_names]
    return append_partition_columns(table, piece, partition_fields)


def append_partition_columns(table: pa.Table, piece: RowGroupPiece,
                             partition_fields: list[UnischemaField]) -> pa.Table:
    """``table`` (rows of ``piece``) with a column for each of the hive partition fields appended."""
    for field in partition_fields:
        table = table.append_column(field.name, partition_column(piece, field, table.num_rows))
    return table


def _is_access_error(err: OSError) -> bool:
    """True when ``err`` comes from reaching the storage rather than from the bytes read.

    Errors of the operating system or of a user filesystem carry an errno or have a specific type; pyarrow's
    own errors about an undecodable file are plain OSErrors without one.
    """
    return err.errno is not None or isinstance(err, (PermissionError, ConnectionError, TimeoutError))


def decode_columns(fields: tuple[UnischemaField, ...] | list[UnischemaField], table: pa.Table,
                   where: str) -> dict[str, np.ndarray]:
    """Decode every field's column of ``table`` into numpy (codecs decode whole columns at once)."""
    columns = {}
    for field in fields:
        column = table.column(field.name)
        try:
            cached = cached_decoded_values(field, column)  # from a decoded-column cache entry: already decoded
            if cached is not None:
                columns[field.name] = cached
            elif field.codec is not None:
                # The ndarray codecs also refuse arrays whose dtype or shape is not the field's.
                columns[field.name] = field.codec.decode_column(field, column)
            else:
                columns[field.name] = scalar_column_to_numpy(field, column)
        except Exception as err:
            raise DecodeFieldError(f'Decoding field "{field.name}" failed in {where}: {err}') from err
    return columns


def _expression_mask(table: pa.Table, expression: Any) -> np.ndarray:
    import pyarrow.dataset as ds

    mask = ds.dataset(table).to_table(columns={'mask': expression}).column('mask')
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)


def read_item(ctx: ReadContext, scheduled: ScheduledItem) -> dict[str, Any]:
    """Read, filter, shuffle, decode and transform one work item.

    The predicate's columns are read and decoded first; the other columns are read only when a row matched.

    Returns:
        ``{field name: numpy column, ..., '.meta': {'num_rows': n, 'tuple': bool}}``. With a row transform that
        returns tuples, the columns are named ``'0'``, ``'1'``, ... and ``'tuple'`` is True. With
        ``ctx.time_stages``, ``'.meta'`` also holds ``'stage_seconds'``.
    """
    clock = StageClock() if ctx.time_stages else None
    try:
        result = _read_item(ctx, scheduled, clock)
    except DecodeFieldError:
        raise  # its message already names the file and row group
    except Exception as err:
        # The original type and traceback stay (callers catch what they raised); the note says where it happened.
        _add_note(err, f'while reading {_where(ctx, scheduled)}')
        raise
    if clock is not None:
        result[META][STAGE_SECONDS] = clock.seconds
    return result


def _where(ctx: ReadContext, scheduled: ScheduledItem) -> str:
    item = scheduled.item
    piece = ctx.pieces[item.piece_index]
    return f'{piece.path} (row group {piece.row_group}, rows {item.row_start}-{item.row_stop})'


def _add_note(err: BaseException, note: str) -> None:
    add_note = getattr(err, 'add_note', None)  # Python >= 3.11
    if add_note is not None:
        add_note(note)


def _read_item(ctx: ReadContext, scheduled: ScheduledItem, clock: StageClock | None) -> dict[str, Any]:
    item = scheduled.item
    piece = ctx.pieces[item.piece_index]
    where = _where(ctx, scheduled)
    names = [f.name for f in ctx.fields]
    predicate_names = [f.name for f in ctx.predicate_fields]
    first = predicate_names if ctx.predicate is not None else names
    # An NGram window may start in this item and end in the next rows of the row group: read them too.
    row_stop = item.row_stop if ctx.ngram is None else min(item.row_stop + ctx.ngram.length - 1, piece.num_rows)
    table = _read_columns(ctx, piece, list(dict.fromkeys(first + list(ctx.filter_columns))), item.row_start,
                          row_stop)
    lap(clock, 'io')
    selection = _unit_order(ctx, scheduled)  # rows to keep, in delivery order; None means all, in file order
    positions: np.ndarray | None = None  # once filters dropped rows: where each kept row is in the unit's order
    if ctx.filter_expression is not None:
        keep = _expression_mask(table, ctx.filter_expression)
        positions = np.flatnonzero(keep if selection is None else keep[selection])
        selection = positions if selection is None else selection[positions]
    lap(clock, 'filter')
    if ctx.predicate is not None:
        candidates = table.select(predicate_names)
        if selection is not None:
            candidates = candidates.take(pa.array(selection))
        predicate_columns = decode_columns(ctx.predicate_fields, candidates, where)
        lap(clock, 'decode')
        mask = _evaluate_predicate(ctx, predicate_columns, candidates.num_rows)
        selection = np.flatnonzero(mask) if selection is None else selection[mask]
        positions = np.flatnonzero(mask) if positions is None else positions[mask]
        lap(clock, 'filter')
        if not len(selection):
            return {META: {'num_rows': 0, 'tuple': False}}
        rest = [n for n in names if n not in table.column_names]
        if rest:
            others = _read_columns(ctx, piece, rest, item.row_start, row_stop)
            for name in rest:
                table = table.append_column(name, others.column(name))
            lap(clock, 'io')
    table = table.select(names)
    if selection is not None:
        table = table.take(pa.array(selection))
    lap(clock, 'filter')
    columns = decode_columns(ctx.fields, table, where)
    lap(clock, 'decode')
    if ctx.ngram is not None:
        result = _form_windows(ctx, columns, selection, item.num_rows, scheduled.shuffle_seed, table.num_rows)
    else:
        result = _apply_transform(ctx, columns, table.num_rows, where)
    lap(clock, 'transform')
    return _with_positions(result, positions, table.num_rows)


def _unit_order(ctx: ReadContext, scheduled: ScheduledItem) -> np.ndarray | None:
    """Rows of the item that ``scheduled`` delivers, in delivery order (None: all of them, in file order).

    The item's order is its row permutation when rows are shuffled, else file order; a scheduled item that
    stands for part of it takes its range or picks of that order. Filters apply afterwards, so the order (and
    the position of each row in it) does not depend on the data.
    """
    if ctx.ngram is not None:  # NGram windows need rows in order; windows are shuffled instead
        return None
    num_rows = scheduled.item.num_rows
    if ctx.shuffle_rows:
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


def _with_positions(result: dict[str, Any], positions: np.ndarray | None, rows_before_transform: int) -> dict:
    """Tell the reader which rows of the unit's order the result holds, for resumable readers.

    ``'positions'`` is given when filters dropped rows; ``'untracked'`` when a transform changed the row count
    (then which input row each output row came from is unknown).
    """
    meta = result[META]
    if meta['num_rows'] != (rows_before_transform if positions is None else len(positions)):
        meta['untracked'] = True
    elif positions is not None:
        meta['positions'] = positions
    return result


def _form_windows(ctx: ReadContext, columns: dict[str, np.ndarray], selection: np.ndarray | None,
                  own_rows: int, shuffle_seed: int, num_rows: int) -> dict[str, Any]:
    """Find the NGram windows that start in this item's own rows; the reader cuts them out of the columns."""
    ngram = ctx.ngram
    assert ngram is not None
    positions = np.arange(num_rows) if selection is None else selection
    start_limit = int(np.searchsorted(positions, own_rows))
    starts = ngram.window_starts(columns[ngram.timestamp_field[0]], start_limit)
    if ctx.shuffle_rows and len(starts) > 1:
        starts = starts[row_permutation(len(starts), shuffle_seed)]
    return {**columns, NGRAM_STARTS: starts, META: {'num_rows': len(starts), 'tuple': False}}


def _evaluate_predicate(ctx: ReadContext, columns: dict[str, np.ndarray], num_rows: int) -> np.ndarray:
    predicate = ctx.predicate
    assert predicate is not None
    if ctx.batched_output and not predicate.vectorized:
        import pandas as pd

        frame = pd.DataFrame({name: _pandas_column(values) for name, values in columns.items()})
        result = predicate.do_include(frame)
        mask = np.asarray(result, dtype=bool)
    else:
        mask = np.asarray(predicate.evaluate(columns, num_rows), dtype=bool)
    if mask.shape != (num_rows,):
        raise ValueError(f'predicate {predicate!r} returned a mask of shape {mask.shape}; expected ({num_rows},)')
    return mask


def _pandas_column(values: np.ndarray) -> Any:
    if values.ndim > 1:
        out = np.empty(len(values), dtype=object)
        for i in range(len(values)):
            out[i] = values[i]
        return out
    return values


# Python scalars a row transform may return, and the dtype torch's default collate gives a list of them.
_PYTHON_SCALAR_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64}


def column_from_values(values: list[Any]) -> np.ndarray:
    """One column from per-row values: stacked arrays, a typed array of numpy or Python scalars of one type, else
    an object array (strings, Decimals, mixed types)."""
    if values and all(isinstance(v, np.generic) for v in values) and len({v.dtype for v in values}) == 1:
        return np.array(values, dtype=values[0].dtype)
    kinds = {type(v) for v in values}
    if len(kinds) == 1 and (kind := next(iter(kinds))) in _PYTHON_SCALAR_DTYPES:
        try:
            return np.array(values, dtype=_PYTHON_SCALAR_DTYPES[kind])
        except OverflowError:  # ints beyond 64 bits stay Python objects
            pass
    return stack_or_objects(values)


def _apply_transform(ctx: ReadContext, columns: dict[str, np.ndarray], num_rows: int,
                     where: str) -> dict[str, Any]:
    spec = ctx.transform
    if spec is None or spec.func is None:
        if spec is not None:
            columns = {name: columns[name] for name in ctx.result_fields}
        return {**columns, META: {'num_rows': num_rows, 'tuple': False}}
    if ctx.batched_output:
        return _transform_frame(ctx, columns, num_rows, where)
    names = list(columns)
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)] if names else [
        {} for _ in range(num_rows)]
    results = [spec.func(row) for row in rows]
    if results:
        check_row_result(spec, ctx.result_fields, results[0], where, ctx.result_schema)
    if results and isinstance(results[0], tuple) and not hasattr(results[0], '_fields'):
        width = len(results[0])
        try:
            out = {str(i): column_from_values([r[i] for r in results]) for i in range(width)}
        except (TypeError, IndexError, KeyError):
            _raise_for_odd_row(spec, ctx, results, where)
        return {**out, META: {'num_rows': len(results), 'tuple': True}}
    try:
        out_columns = {name: column_from_values([r[name] for r in results]) for name in ctx.result_fields}
    except (TypeError, IndexError, KeyError):
        _raise_for_odd_row(spec, ctx, results, where)
    return {**out_columns, META: {'num_rows': len(results), 'tuple': False}}


def _raise_for_odd_row(spec: TransformSpec, ctx: ReadContext, results: list[Any], where: str) -> NoReturn:
    """The first result passed the checks but a later one is not like it: name that row."""
    first = results[0]
    function = describe_function(spec.func)
    for index, result in enumerate(results[1:], start=1):
        if isinstance(first, tuple):
            if not isinstance(result, tuple) or len(result) != len(first):
                raise TransformResultError(f'the TransformSpec function {function} returned {type(result).__name__} '
                                           f'{result!r:.60} for row {index} of {where}, and a tuple of '
                                           f'{len(first)} values for its first row')
        elif isinstance(result, tuple):
            raise TransformResultError(f'the TransformSpec function {function} returned a tuple for row {index} of '
                                       f'{where}, and a dict for its first row')
        else:
            check_row_result(spec, ctx.result_fields, result, f'row {index} of {where}')
    raise TransformResultError(f'the TransformSpec function {function} returned rows that cannot be made into '
                               f'columns ({where})')


def _transform_frame(ctx: ReadContext, columns: dict[str, np.ndarray], num_rows: int,
                     where: str) -> dict[str, Any]:
    import pandas as pd

    spec = ctx.transform
    assert spec is not None
    assert spec.func is not None
    frame = pd.DataFrame({name: _pandas_column(values) for name, values in columns.items()}, index=range(num_rows))
    result = spec.func(frame)
    function = describe_function(spec.func)
    if not isinstance(result, pd.DataFrame):
        raise TransformResultError(f'a make_batch_reader TransformSpec function must return a pandas DataFrame, got '
                                   f'{type(result).__name__}: {function} returned it for {where}')
    result = result.drop(columns=[c for c in spec.removed_fields if c in result.columns])
    if set(result.columns) != set(ctx.result_fields):
        missing = [name for name in ctx.result_fields if name not in result.columns]
        unexpected = [str(name) for name in result.columns if name not in ctx.result_fields]
        wrong = ' and '.join(part for part in (f'left out {missing}' if missing else '',
                                               f'returned {unexpected}, not declared' if unexpected else '') if part)
        # The first sentence is the original's.
        raise TransformResultError(
            f'Transformed result columns ({", ".join(map(str, result.columns))}) do not match required schema '
            f'columns({", ".join(ctx.result_fields)}): the TransformSpec function {function} {wrong} ({where}); '
            f'declare new columns in edit_fields and dropped ones in removed_fields')
    out = {}
    for name in ctx.result_fields:
        series = result[name]
        if series.dtype == object:
            out[name] = column_from_values(list(series))
        else:
            out[name] = series.to_numpy()
    if len(result) and ctx.result_schema is not None:
        check_transformed_values(spec, ctx.result_schema, {name: column[0] for name, column in out.items()},
                                 f'first row of {where}')
    return {**out, META: {'num_rows': len(result), 'tuple': False}}
