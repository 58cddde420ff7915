"""``Batcher``: first in, first out, cuts a stream of tables into batches of a fixed number of rows."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from petastorm.shuffle._ops import ArrayOps
from petastorm.shuffle._tables import Table, num_rows, slice_rows


class Batcher:
    """First in, first out: cuts tables into batches of ``batch_size`` rows, whatever the chunk sizes.

    A batch is a slice (a view) of one queued table, or the concatenation (through ``ops``) of slices of a few.
    """

    def __init__(self, batch_size: int, ops: ArrayOps) -> None:
        self._batch_size = batch_size
        self._ops = ops
        self._chunks: deque[Table] = deque()
        self._offset = 0  # rows of the first chunk already handed out
        self._rows = 0  # rows waiting

    def put(self, table: Table) -> None:
        """Queue the rows of ``table``."""
        rows = num_rows(table)
        if rows:
            self._chunks.append(table)
            self._rows += rows

    def batches(self) -> Iterator[Table]:
        """Yield every full batch the queued rows make."""
        while self._rows >= self._batch_size:
            yield self._take(self._batch_size)

    def held(self, name: str) -> list[Any]:
        """The column ``name`` of the rows waiting, in order (one array per queued chunk)."""
        return [chunk[name][self._offset if k == 0 else 0:] for k, chunk in enumerate(self._chunks)]

    def flush(self) -> Iterator[Table]:
        """Yield the rows still waiting as one last, smaller batch (nothing when none wait)."""
        if self._rows:
            yield self._take(self._rows)

    def _take(self, count: int) -> Table:
        first = self._chunks[0]
        if not self._offset and num_rows(first) == count:  # a chunk of exactly one batch goes out whole
            self._chunks.popleft()
            self._rows -= count
            return first
        parts: list[Table] = []
        needed = count
        while needed:
            chunk = self._chunks[0]
            available = num_rows(chunk) - self._offset
            taken = min(available, needed)
            parts.append(slice_rows(chunk, self._offset, self._offset + taken))
            needed -= taken
            if taken == available:
                self._chunks.popleft()
                self._offset = 0
            else:
                self._offset += taken
        self._rows -= count
        if len(parts) == 1:
            return parts[0]
        return {name: self._ops.concat(name, [part[name] for part in parts]) for name in parts[0]}
