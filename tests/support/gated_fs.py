"""A local filesystem that counts the files opened and holds back the opens of some until a gate opens.

A test asks what a reader read before its first batch: the files it opened, and whether it could go on while
the others were held (``GatedLocalHandler.gate`` not set).
"""

from __future__ import annotations

import threading
from collections import Counter

import pyarrow as pa

from petastorm.test_util.latency_fs import SlowLocalHandler

#: seconds a held open waits for the gate before it goes on anyway (a test that forgot to open it ends).
HOLD_LIMIT = 60.0


class GatedLocalHandler(SlowLocalHandler):
    """Local files; opening one not in ``free`` waits until ``gate`` is set. ``opened`` counts the opens done."""

    def __init__(self, free: set[str]) -> None:
        super().__init__(0.0)
        self.free = set(free)
        self.gate = threading.Event()
        self.opened: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return 'gated-local'

    def open_input_file(self, path: str) -> pa.NativeFile:
        if path not in self.free:
            self.gate.wait(HOLD_LIMIT)
        with self._lock:
            self.opened[path] += 1
        return super().open_input_file(path)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)
