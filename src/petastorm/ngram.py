"""NGram: read windows of consecutive rows (sorted by a timestamp field) instead of single rows.

``NGram({-1: [schema.image], 0: [schema.image, schema.steering]}, delta_threshold=10,
timestamp_field=schema.ts)`` makes a reader yield ``{-1: row_view, 0: row_view}`` dicts, one per window of two
consecutive rows whose timestamps differ by at most 10. Windows never cross row-group boundaries. Window starts
are found on whole columns with numpy; only the final dicts are built per window.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from petastorm.unischema import Unischema, UnischemaField, match_unischema_fields

__all__ = ['NGram']


def _check_field_list(value: Any, what: str) -> None:
    if not isinstance(value, list):
        raise ValueError(f'{what} must be a list of UnischemaFields or regular expressions, got {value!r}')
    for item in value:
        if not isinstance(item, (str, tuple)):
            raise ValueError(f'{what} must contain UnischemaFields or regular expressions, got {item!r}')


class NGram:
    """Windows of consecutive rows.

    Args:
        fields: ``{offset: [UnischemaField or regex, ...]}``; the window spans ``min(offsets)..max(offsets)``.
        delta_threshold: largest allowed timestamp difference between consecutive rows of a window.
        timestamp_field: the field (or a regex matching exactly one field) the rows are sorted by.
        timestamp_overlap: when False, windows do not share timestamps (a window starts after the previous
            accepted window's last timestamp).
    """

    def __init__(self, fields: Mapping[int, list[Any]], delta_threshold: Any, timestamp_field: Any,
                 timestamp_overlap: bool = True) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(f'NGram fields must be a non-empty dict of offset -> list of fields, got {fields!r}')
        for offset, value in fields.items():
            if not isinstance(offset, numbers.Integral):
                raise ValueError(f'NGram offsets must be ints, got {offset!r}')
            _check_field_list(value, f'NGram fields at offset {offset}')
        if not isinstance(delta_threshold, numbers.Number):
            raise ValueError(f'delta_threshold must be a number, got {delta_threshold!r}')
        if not isinstance(timestamp_field, (str, tuple)):
            raise ValueError(f'timestamp_field must be a UnischemaField or a regular expression, '
                             f'got {timestamp_field!r}')
        if not isinstance(timestamp_overlap, bool):
            raise ValueError(f'timestamp_overlap must be a bool, got {timestamp_overlap!r}')
        self._fields = {int(k): list(v) for k, v in fields.items()}
        self._delta_threshold = delta_threshold
        self._timestamp_field = timestamp_field
        self.timestamp_overlap = timestamp_overlap

    @property
    def length(self) -> int:
        """Rows in a window: ``max(offsets) - min(offsets) + 1``."""
        return max(self._fields) - min(self._fields) + 1

    @property
    def fields(self) -> dict[int, list[Any]]:
        """``{offset: fields}``."""
        return self._fields

    @property
    def delta_threshold(self) -> Any:
        """Largest allowed timestamp step inside a window."""
        return self._delta_threshold

    @property
    def timestamp_field(self) -> Any:
        """The timestamp field (a UnischemaField once :meth:`resolve_regex_field_names` ran)."""
        return self._timestamp_field

    def resolve_regex_field_names(self, schema: Unischema) -> None:
        """Replace regular expressions by the schema's fields (in place).

        Raises:
            ValueError: the timestamp expression matches no field or more than one.
        """
        self._fields = {offset: self.convert_fields(schema, value) for offset, value in self._fields.items()}
        if isinstance(self._timestamp_field, str):
            matched = match_unischema_fields(schema, [self._timestamp_field])
            if len(matched) > 1:
                raise ValueError('timestamp_field was matched to more than one unischema field')
            if not matched:
                raise ValueError(f'timestamp_field {self._timestamp_field!r} does not match any field of '
                                 f'{schema._name} ({", ".join(schema.fields)})')
            self._timestamp_field = matched[0]
        elif self._timestamp_field[0] not in schema.fields:
            raise ValueError(f'timestamp_field {self._timestamp_field[0]!r} is not a field of {schema._name} '
                             f'({", ".join(schema.fields)})')

    def convert_fields(self, unischema: Unischema, field_list: Sequence[Any]) -> list[UnischemaField]:
        """Fields of ``unischema`` named by ``field_list`` (fields and regular expressions)."""
        regexes = [f for f in field_list if isinstance(f, str)]
        named = [unischema.fields[f[0]] for f in field_list if isinstance(f, tuple) and f[0] in unischema.fields]
        unknown = [f[0] for f in field_list if isinstance(f, tuple) and f[0] not in unischema.fields]
        if unknown:
            raise ValueError(f'NGram fields {unknown} are not fields of {unischema._name}')
        return list(dict.fromkeys(named + match_unischema_fields(unischema, regexes)))

    def get_field_names_at_timestep(self, timestep: int) -> list[str]:
        """Names of the fields requested at ``timestep`` (empty for an absent offset)."""
        return [f if isinstance(f, str) else f[0] for f in self._fields.get(timestep, [])]

    def get_schema_at_timestep(self, schema: Unischema, timestep: int) -> Unischema:
        """A view of ``schema`` with the fields requested at ``timestep``."""
        return schema.create_schema_view([schema.fields[n] for n in self.get_field_names_at_timestep(timestep)
                                          if n in schema.fields])

    def get_field_names_at_all_timesteps(self) -> list[str]:
        """Every field requested at any offset, plus the timestamp field."""
        names = [n for offset in sorted(self._fields) for n in self.get_field_names_at_timestep(offset)]
        timestamp = self._timestamp_field if isinstance(self._timestamp_field, str) else self._timestamp_field[0]
        return list(dict.fromkeys([*names, timestamp]))

    def window_starts(self, timestamps: np.ndarray, first_start_limit: int | None = None) -> np.ndarray:
        """Start positions of the valid windows over one sorted run of rows.

        Args:
            timestamps: the timestamp column of the rows.
            first_start_limit: windows may only start before this position (the rows after it are the look-ahead
                of a drop partition); None allows every position.

        Raises:
            NotImplementedError: the rows are not sorted by the timestamp field.
        """
        ts = np.asarray(timestamps)
        if ts.dtype.kind == 'M':
            ts = ts.astype('datetime64[ns]').astype(np.int64)
        elif ts.dtype == object:
            ts = ts.astype(np.float64)
        n = len(ts)
        length = self.length
        if n < length:
            return np.empty(0, dtype=np.int64)
        diffs = np.diff(ts)
        if (diffs < 0).any():
            name = self._timestamp_field if isinstance(self._timestamp_field, str) else self._timestamp_field[0]
            raise NotImplementedError(f'NGram assumes that the data is sorted by {name} field which is not the case')
        bad = np.concatenate([[0], np.cumsum(diffs > self._delta_threshold)])
        candidates = np.arange(n - length + 1)
        starts = candidates[bad[candidates + length - 1] - bad[candidates] == 0]
        if first_start_limit is not None:
            starts = starts[starts < first_start_limit]
        if not self.timestamp_overlap and len(starts):
            kept = []
            last_end = None
            for start in starts.tolist():
                if last_end is None or ts[start] > last_end:
                    kept.append(start)
                    last_end = ts[start + length - 1]
            starts = np.asarray(kept, dtype=np.int64)
        return starts.astype(np.int64)

    def form_ngram(self, data: Sequence[Mapping[str, Any]], schema: Unischema) -> list[dict[int, dict[str, Any]]]:
        """Windows over a list of decoded rows (dicts) of one row group: ``[{offset: {field: value}}]``."""
        timestamp = self._timestamp_field if isinstance(self._timestamp_field, str) else self._timestamp_field[0]
        starts = self.window_starts(np.asarray([row[timestamp] for row in data]))
        base = min(self._fields)
        result = []
        for start in starts.tolist():
            window = {}
            for offset in range(base, base + self.length):
                row = data[start + offset - base]
                window[offset] = {name: row[name] for name in self.get_field_names_at_timestep(offset)}
            result.append(window)
        return result

    def make_namedtuple(self, schema: Unischema, ngram_as_dicts: Mapping[int, Mapping[str, Any]]) -> dict[int, Any]:
        """``{offset: namedtuple}`` from ``{offset: {field: value}}``."""
        return {offset: self.get_schema_at_timestep(schema, offset).make_namedtuple(**values)
                for offset, values in ngram_as_dicts.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NGram):
            return NotImplemented
        mine = {k: set(self.get_field_names_at_timestep(k)) for k in self._fields}
        theirs = {k: set(other.get_field_names_at_timestep(k)) for k in other._fields}
        return mine == theirs

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    # Defining __eq__ without __hash__ leaves NGram unhashable, as it should be: it is compared by value.
