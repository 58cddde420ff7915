"""The ``flock`` locks that let the processes of one node share a local disk cache directory.

Two kinds of lock: the state lock (one file per directory) serializes changes to the size ledger and eviction;
a key lock (one file per key) serializes the fills of one key, so that a node computes each entry once. Eviction
removes a key's lock file with its entry; a process that was waiting on the removed file notices and locks the
current one (:func:`acquire_key_lock`).

``flock`` locks belong to an open file description, so two threads of one process that open the lock file
separately exclude each other like two processes do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def exclusive_lock(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if needed) while the block runs; raises OSError."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def acquire_key_lock(path: str, stopped: Callable[[], bool], remake_directory: Callable[[], bool]) -> int | None:
    """Lock the key lock file ``path``; the locked descriptor, or None when the caller should not wait.

    Args:
        path: the key's lock file.
        stopped: True when the cache was closed meanwhile (then nothing is locked).
        remake_directory: re-creates the directory of lock files after another process removed it; False when
            that is not possible (then nothing is locked).
    """
    while True:
        if stopped():
            return None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # the locks directory was removed (another process's cleanup)
            if not remake_directory():
                return None
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Eviction may have unlinked the lock file while this process waited: a lock on an unlinked file
            # excludes nobody, so start again on the current one.
            held = os.fstat(fd)
            current = os.stat(path)
            if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def remove_if_unlocked(lock_path: str, entry: str) -> bool:
    """Remove ``entry`` and its key lock file unless another holder has the lock (never waits).

    Returns:
        True when the entry was removed (or was already gone).
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except FileNotFoundError:  # the locks directory was removed by another process's cleanup
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry)
        # Processes waiting on this lock file notice it was unlinked and retry on a new one (acquire_key_lock).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        return True
    finally:
        os.close(fd)
