"""Marks a cache directory as being read, so that the process that created it does not delete it at exit.

A converter is picklable: a training process started elsewhere may read the cache directory while the process
that made it is exiting. Each reader of a cache directory holds a small marker file in it,
``_petastorm_in_use-<pid>-<token>@<host>``, for as long as its loader or dataset is open. The exit cleanup
(:mod:`petastorm.spark.converter_cache`) leaves a directory in place while a marker of another live process is
there. A marker of a process of this host that no longer runs is stale and ignored; a marker written on another
host cannot be checked and counts as live. Names starting with ``_`` are skipped by Spark and by pyarrow, so
markers never appear as data.

A directory left in place that way is handed over: the exiting creator writes ``_petastorm_delete_when_unused``
into it, and the last reader to finish deletes it. The creator checks for readers again after writing that flag,
and a reader checks for the flag after removing its marker, so one of them always sees the other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from petastorm.fs import display_url, resolve_url
from petastorm.spark import cache_dir

__all__ = [
    'DELETE_WHEN_UNUSED', 'MARKER_PREFIX', 'Marker', 'hand_over', 'live_markers', 'markers', 'other_live_readers',
    'reading',
]

logger = logging.getLogger(__name__)

MARKER_PREFIX = '_petastorm_in_use-'
DELETE_WHEN_UNUSED = '_petastorm_delete_when_unused'
_MARKER_NAME = re.compile(re.escape(MARKER_PREFIX) + r'(?P<pid>\d+)-(?P<token>[0-9a-f]+)@(?P<host>.+)$')


@dataclass(frozen=True)
class Marker:
    """One reader of a cache directory, as its marker file name tells."""

    pid: int
    host: str
    path: str


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


@contextlib.contextmanager
def reading(dir_url: str) -> Iterator[None]:
    """Hold an in-use marker in ``dir_url`` for the duration of the block.

    A storage that refuses the marker (read-only, say) only loses the protection; reading goes on.
    """
    name = f'{MARKER_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}@{socket.gethostname()}'
    path = None
    try:
        filesystem, dir_path = resolve_url(dir_url)
        path = dir_path.rstrip('/') + '/' + name
        with filesystem.open_output_stream(path):
            pass
    except (OSError, ValueError, ImportError) as err:
        logger.info('could not mark %s as in use (%s); it may be deleted at exit by the process that created it',
                    display_url(dir_url), err)
        path = None
    try:
        yield
    finally:
        if path is not None:
            try:
                filesystem.delete_file(path)
                _delete_if_handed_over(filesystem, dir_path, dir_url)
            except OSError as err:
                logger.debug('could not remove in-use marker %s: %s', path, err)


def _delete_if_handed_over(filesystem: pafs.FileSystem, dir_path: str, dir_url: str) -> None:
    """Delete a directory whose creator has exited, once its last reader (this one) is done."""
    flag = filesystem.get_file_info(dir_path.rstrip('/') + '/' + DELETE_WHEN_UNUSED)
    if flag.type == pafs.FileType.NotFound or live_markers(filesystem, dir_path):
        return
    logger.info('deleting converter cache %s: its creator has exited and its last reader is done',
                display_url(dir_url))
    # cache_dir.delete_dir also treats a directory already gone (another reader finishing at the same time got
    # there first) as done. Other failures get their own warning: the caller only logs at debug level, and a
    # directory left behind here is one nobody else will delete.
    try:
        cache_dir.delete_dir(dir_url)
    except OSError as err:
        logger.warning('could not delete converter cache %s: %s', display_url(dir_url), err)


def markers(filesystem: pafs.FileSystem, dir_path: str) -> list[Marker]:
    """The in-use markers in a directory (none when it is gone)."""
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(dir_path, allow_not_found=True))
    except OSError:
        return []
    found = []
    for info in infos:
        match = _MARKER_NAME.match(info.base_name)
        if match:
            found.append(Marker(int(match['pid']), match['host'], info.path))
    return found


def live_markers(filesystem: pafs.FileSystem, dir_path: str, exclude_pid: int | None = None) -> list[Marker]:
    """Markers of processes that may still be reading the directory (``exclude_pid``'s left out)."""
    host = socket.gethostname()
    # Another host's process cannot be checked: its marker counts as live.
    return [marker for marker in markers(filesystem, dir_path)
            if marker.host != host or (marker.pid != exclude_pid and _process_alive(marker.pid))]


def other_live_readers(dir_url: str) -> list[Marker]:
    """Markers of processes other than this one that may still be reading ``dir_url``."""
    filesystem, dir_path = resolve_url(dir_url)
    return live_markers(filesystem, dir_path, exclude_pid=os.getpid())


def hand_over(dir_url: str) -> bool:
    """Ask the last reader of ``dir_url`` to delete it; True when no reader is left and the caller should."""
    filesystem, dir_path = resolve_url(dir_url)
    with filesystem.open_output_stream(dir_path.rstrip('/') + '/' + DELETE_WHEN_UNUSED):
        pass
    return not live_markers(filesystem, dir_path, exclude_pid=os.getpid())
