"""Named POSIX shared memory segments: create, open and unlink by name.

The only module of the package that touches ``_posixshmem``, the private CPython extension behind
:mod:`multiprocessing.shared_memory` (it wraps ``shm_open(3)`` and ``shm_unlink(3)``). Everything else reaches
those two calls through the functions here, so a Python without that module (not a POSIX platform, or an
interpreter that does not ship it) fails in one place with a message that says what is missing and what to use
instead.

Why not :class:`multiprocessing.shared_memory.SharedMemory` itself: on Python 3.10-3.12 every instance, whether
it created the segment or only opened it, registers the name with :mod:`multiprocessing.resource_tracker`
(``track=False`` exists only from 3.13). The tracker then unlinks the segments it knows about when the
registering processes have exited, warning about "leaked" objects (CPython issue gh-82300), so a worker's slot
could be unlinked by a tracker while the parent still needs its name, or be reported as leaked; a pool whose
workers are not ``multiprocessing`` children would also start one tracker process per worker. And every
creation, opening and unlinking sends the tracker a message: in two runs of ``benchmarks/pool_bench.py``, creating,
sizing and mapping a 1 MiB segment, opening and mapping it again by name, unlinking and closing it took 2.6x-2.9x
as long with ``SharedMemory`` as with the functions here (35.4 us against 13.5 us in one). Opening segments by name
with the same system calls and no tracker is what the process pool needs; it removes names itself (see
:mod:`petastorm.pools._shm`).
"""

from __future__ import annotations

import os
from types import ModuleType

_MISSING_MESSAGE = ('process pool: this Python has no POSIX shared memory (the _posixshmem module that '
                    'multiprocessing.shared_memory uses is missing on this platform); use the thread pool '
                    "(reader_pool_type='thread')")


def _load() -> ModuleType | None:
    try:
        import _posixshmem
    except ImportError:
        return None
    return _posixshmem


def missing_reason() -> str | None:
    """None where named shared memory works here, else why the process pool cannot run."""
    return None if _load() is not None else _MISSING_MESSAGE


def _require() -> ModuleType:
    module = _load()
    if module is None:
        raise RuntimeError(_MISSING_MESSAGE)
    return module


def create_segment(name: str, mode: int = 0o600) -> int:
    """Create the segment ``name`` (which must not exist) and return a read-write file descriptor for it.

    Raises:
        FileExistsError: the name is taken.
        OSError: e.g. EMFILE, or the shared memory file system refused it.
        RuntimeError: this Python has no POSIX shared memory.
    """
    return int(_require().shm_open('/' + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode))


def open_segment(name: str) -> int:
    """Open the existing segment ``name`` read-write and return its file descriptor.

    Raises:
        FileNotFoundError: no segment has that name (any more).
        RuntimeError: this Python has no POSIX shared memory.
    """
    return int(_require().shm_open('/' + name, os.O_RDWR, 0))


def unlink_segment(name: str) -> None:
    """Remove the name ``name`` if it exists; the memory goes when its last mapping or descriptor does."""
    try:
        _require().shm_unlink('/' + name)
    except FileNotFoundError:
        pass
