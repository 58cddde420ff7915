"""Keeps Petastorm's ``petastorm.reader_impl.arrow_table_serializer``: Arrow tables as an Arrow IPC stream."""

from __future__ import annotations

import pyarrow as pa

__all__ = ['ArrowTableSerializer']


class ArrowTableSerializer:
    """Turns a ``pyarrow.Table`` into an Arrow IPC stream and back (no pickling of the columns)."""

    def serialize(self, rows: pa.Table) -> pa.Buffer:
        """The table as one IPC stream buffer."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        return sink.getvalue()

    def deserialize(self, serialized_rows: pa.Buffer | bytes) -> pa.Table:
        """The table :meth:`serialize` was given."""
        return pa.ipc.open_stream(serialized_rows).read_all()
