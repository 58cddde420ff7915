"""Keeps Petastorm's ``petastorm.reader_impl.pickle_serializer``: results of a legacy process pool as pickles."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ['PickleSerializer']


class PickleSerializer:
    """Turns a result into bytes with pickle and back (results of our own worker processes, never dataset bytes)."""

    def serialize(self, rows: Any) -> bytes:
        """``rows`` as bytes."""
        return pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, serialized_rows: bytes) -> Any:
        """What :meth:`serialize` was given."""
        return pickle.loads(serialized_rows)  # noqa: S301 - bytes our worker process made
