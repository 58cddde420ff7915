"""Types of the compiled kernel (``_kernel.c``); see the comment at the top of that file for what each does."""

from collections.abc import Sequence
from typing import Any

# (column buffer, byte offset in the record, bytes per value)
Field = tuple[Any, int, int]

def pack(store: Any, row_bytes: int, start: int, rows: int, fields: Sequence[Field]) -> None: ...
def draw(size: int, count: int, key: int, first: int,
         stores: Sequence[tuple[Any, int, Sequence[Field]]]) -> None: ...
def gather(out: Any, values: Any, itemsize: int, offsets: Any, rows: Any) -> None: ...
