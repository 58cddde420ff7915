"""Small Arrow tables of every type a Parquet file holds, and how to compare what readers give with pyarrow's rows.

Used by the tests of nested, ragged and null columns across the readers and loaders. Values are what
``pyarrow.Table.to_pylist()`` gives, with times as the integers of their unit (readers give numpy times, which
carry the same integers).
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm._compat import PYARROW_READS_NULL_FIXED_SIZE_LISTS


def every_type_table(rows: int = 40, seed: int = 0, nulls: bool = True) -> pa.Table:
    """A table of ``rows`` rows with a column of each kind: scalars with nulls, ragged and nested lists, structs,
    maps, dictionary-encoded text, times with zones and units, decimals, float16 (no null anywhere without
    ``nulls``)."""
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)

    def maybe(i: int, value: Any, every: int = 5) -> Any:
        return None if nulls and i % every == 3 else value

    lengths = rng.integers(0, 5, rows)
    return pa.table({
        'id': pa.array(ids),
        'nint': pa.array([maybe(i, int(i * 3)) for i in range(rows)], pa.int32()),
        'nfloat': pa.array([maybe(i, float(i) / 2, 7) for i in range(rows)], pa.float64()),
        'nbool': pa.array([maybe(i, i % 2 == 0, 4) for i in range(rows)], pa.bool_()),
        'text': pa.array([maybe(i, f'row {i}', 6) for i in range(rows)], pa.string()),
        'label': pa.array([['cat', 'dog', 'bird'][i % 3] for i in range(rows)]).dictionary_encode(),
        'ids': pa.array([maybe(i, [int(i * 10 + k) for k in range(n)], 9) for i, n in enumerate(lengths)],
                        pa.list_(pa.int64())),
        'weights': pa.array([[float(k) for k in range(n)] for n in lengths], pa.large_list(pa.float32())),
        'nested': pa.array([maybe(i, [[i, k] * k for k in range(n)]) for i, n in enumerate(lengths)],
                           pa.list_(pa.list_(pa.int16()))),
        'boxes': pa.array([[[float(i), float(k), 1.0, 2.0] for k in range(n)] for i, n in enumerate(lengths)],
                          pa.list_(pa.list_(pa.float32(), 4))),
        'holes': pa.array([[maybe(k, i * k, 4) for k in range(n)] for i, n in enumerate(lengths)],
                          pa.list_(pa.int64())),
        'words': pa.array([[f'w{i}_{k}' for k in range(n)] for i, n in enumerate(lengths)], pa.list_(pa.string())),
        'point': pa.array([maybe(i, {'x': float(i), 'y': maybe(i + 1, i * 2), 'tags': ['a'] * (i % 3),
                                     'inner': {'z': i % 4}}) for i in range(rows)],
                          pa.struct([('x', pa.float64()), ('y', pa.int32()), ('tags', pa.list_(pa.string())),
                                     ('inner', pa.struct([('z', pa.int8())]))])),
        'objects': pa.array([[{'cls': int(k), 'score': float(i) / (k + 1)} for k in range(n)]
                             for i, n in enumerate(lengths)],
                            pa.list_(pa.struct([('cls', pa.int64()), ('score', pa.float64())]))),
        'attrs': pa.array([maybe(i, [(f'k{k}', int(i + k)) for k in range(n)], 8) for i, n in enumerate(lengths)],
                          pa.map_(pa.string(), pa.int64())),
        # pyarrow before 26 cannot read null fixed-size lists back from Parquet: that column has none there.
        'fixed': pa.array([maybe(i, [i, i + 1, i + 2]) if PYARROW_READS_NULL_FIXED_SIZE_LISTS else [i, i + 1, i + 2]
                           for i in range(rows)], pa.list_(pa.int32(), 3)),
        'when': pa.array([maybe(i, 1_600_000_000_000_000_000 + i * 1_000_000_007) for i in range(rows)],
                         pa.timestamp('ns', tz='Europe/Paris')),
        'day': pa.array([maybe(i, 18000 + i) for i in range(rows)], pa.date32()),
        'clock': pa.array([maybe(i, 1000 * i) for i in range(rows)], pa.time64('us')),
        'wait': pa.array([maybe(i, 7 * i) for i in range(rows)], pa.duration('ms')),
        'price': pa.array([maybe(i, decimal.Decimal(f'{i}.25')) for i in range(rows)], pa.decimal128(9, 2)),
        'half': pa.array(np.arange(rows, dtype=np.float16)),
        'blob': pa.array([maybe(i, f'b{i}'.encode()) for i in range(rows)], pa.large_binary()),
    })


def _temporal_as_integers(arrow_type: pa.DataType) -> pa.DataType | None:
    if pa.types.is_timestamp(arrow_type) or pa.types.is_duration(arrow_type) or pa.types.is_date64(arrow_type):
        return pa.int64()
    if pa.types.is_date32(arrow_type):
        return pa.int32()
    if pa.types.is_time(arrow_type):
        return pa.int64() if pa.types.is_time64(arrow_type) else pa.int32()
    return None


def expected_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()`` with times as the integers of their unit."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        target = _temporal_as_integers(field.type)
        if target is not None:
            if pa.types.is_time(field.type):
                column = column.cast(pa.int64() if pa.types.is_time64(field.type) else pa.int32())
            else:
                column = column.cast(target)
        columns.append(column)
    return pa.table(columns, names=table.column_names).to_pylist()


def plain(value: Any) -> Any:
    """A value a reader gave as plain Python (numbers, str, bytes, lists, dicts, tuples, None), times as ints."""
    if isinstance(value, np.ma.MaskedArray):
        return [None if masked else plain(v) for v, masked in zip(value.data, np.ma.getmaskarray(value),
                                                                   strict=True)]
    if isinstance(value, np.ndarray):
        if value.dtype.kind in 'Mm':
            return value.astype(np.int64).tolist()
        return [plain(v) for v in value]
    if isinstance(value, (np.datetime64, np.timedelta64)):
        return int(value.astype(np.int64))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value
    return value


def assert_rows_equal(rows: list[dict[str, Any]], expected: list[dict[str, Any]], key: str = 'id') -> None:
    """Every row (by ``key``) equals the expected row of that key, field by field, and no row is missing or extra."""
    by_key = {row[key]: row for row in expected}
    seen = set()
    for row in rows:
        got = {name: plain(value) for name, value in row.items()}
        want = by_key[got[key]]
        for name, value in got.items():
            assert value == want[name], f'row {got[key]} field {name}: {value!r} != {want[name]!r}'
        seen.add(got[key])
    assert seen == set(by_key), f'missing rows {sorted(set(by_key) - seen)[:10]}'
    assert len(rows) == len(expected)


def column_rows(column: Any) -> list[Any]:
    """The rows of a column as ``make_batch_reader`` delivers it (arrays, masked arrays, list and struct columns)."""
    from petastorm.columns import ListColumn, MapColumn, StructColumn

    if isinstance(column, np.ma.MaskedArray):
        return [None if np.all(masked) else value for value, masked in zip(column.data, np.ma.getmaskarray(column),
                                                                            strict=True)]
    if isinstance(column, StructColumn):
        fields = {name: column_rows(child) for name, child in column.items()}
        valid = [True] * column.num_rows if column.valid is None else column.valid.tolist()
        return [{name: values[i] for name, values in fields.items()} if valid[i] else None
                for i in range(column.num_rows)]
    if isinstance(column, ListColumn):
        elements = column_rows(column.values)
        bounds = column.offsets.tolist()
        valid = [True] * len(column) if column.valid is None else column.valid.tolist()
        if isinstance(column, MapColumn):
            pairs = list(zip(elements['key'] if isinstance(elements, dict) else column_rows(column.keys),
                             column_rows(column.items), strict=True))
            return [pairs[bounds[i]:bounds[i + 1]] if valid[i] else None for i in range(len(column))]
        return [elements[bounds[i]:bounds[i + 1]] if valid[i] else None for i in range(len(column))]
    return list(column)


def batch_rows(batch: Any) -> list[dict[str, Any]]:
    """The rows of one ``make_batch_reader`` namedtuple of columns."""
    columns = {name: column_rows(value) for name, value in batch._asdict().items()}
    count = len(next(iter(columns.values())))
    return [{name: values[i] for name, values in columns.items()} for i in range(count)]
