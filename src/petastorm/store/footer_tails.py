"""The footers of many files read at once through an fsspec client, as ranged reads of their ends from its event loop.

Planning a store without a ``_metadata`` summary reads every data file's footer, 64 threads at a time. Through an
fsspec client (gcsfs, s3fs, adlfs) each of those threads waits on the client's one event loop, a request at a time
each; pyarrow's own GCS client is worse, reading them one after the other whatever the threads (every read of a file
it opened first asks, holding the GIL, whether the file is closed, which starts the object's download:
docs/storage.md, "GCS"), so a GCS store of many small files is read through gcsfs
(:func:`petastorm.store.opening.open_store`). Where there are at least :data:`TOGETHER_FROM` footers to read through
one of those clients, the last 64 KiB of each file (of its listed size and version: the generation on GCS, the ETag
on S3 and Azure) are asked for together from the event loop, :data:`AT_ONCE` on their way, and each footer is cut from
its file's end. The ends are also kept for the file's next reads, as those of single reads are (a small file is then
read whole once).

Whatever this does not give (a file gone, rewritten or grown since it was listed, a footer longer than the end read,
a failed request) is read the usual way afterwards, which raises the error the file's state calls for, naming its URL.
Other fsspec clients read their footers one per thread, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs

__all__ = ['AT_ONCE', 'TOGETHER_FROM', 'footer_of_tail', 'read_footer_tails']

#: footers to read before reading them together pays.
TOGETHER_FROM = 32
#: reads on their way at once. More costs the client CPU (it waits on all of them at every answer: 10,000 files
#: took 2.3 CPU-seconds at 128, 3.4 at 512 and 4.7 at gcsfs's default of 1,280) and gains nothing past a few
#: hundred round trips a second.
AT_ONCE = 128
#: files whose ends are asked for in one call: the client holds the answers until all arrive, so a call's memory
#: is bounded by this many ends.
_FILES_PER_CALL = 1_000

_MAGIC = b'PAR1'
_FOOTER_TRAILER = 8  # the footer's length (4 bytes, little-endian) and the magic


def footer_of_tail(tail: bytes) -> bytes | None:
    """The footer that ends ``tail`` (the last bytes of a Parquet file), as a Parquet metadata file's bytes.

    None when ``tail`` does not end with a Parquet footer or does not hold all of it.
    """
    if len(tail) < _FOOTER_TRAILER + 4 or tail[-4:] != _MAGIC:
        return None
    length = int.from_bytes(tail[-_FOOTER_TRAILER:-4], 'little')
    if length <= 0 or length + _FOOTER_TRAILER > len(tail):
        return None
    return _MAGIC + tail[-(length + _FOOTER_TRAILER):]


def _handler_of(filesystem: pafs.FileSystem) -> Any:
    """Our fsspec layer's handler behind ``filesystem``, or None (pyarrow's own clients, a user's filesystem)."""
    from petastorm.fs._handler import StorageHandler  # the fsspec layer: not imported for pyarrow's own clients

    handler = getattr(filesystem, 'handler', None) if isinstance(filesystem, pafs.PyFileSystem) else None
    return handler if isinstance(handler, StorageHandler) else None


def read_footer_tails(filesystem: pafs.FileSystem, paths: Sequence[str], sizes: Mapping[str, int]) -> dict[str, bytes]:
    """The footers of ``paths`` read together from their ends (see the module docstring), by path.

    Args:
        filesystem: where the files are (nothing is read but through our fsspec layer, by a client that reads
            many ranges at once: gcsfs).
        paths: the files; those without a listed size in ``sizes`` are left out.
        sizes: each file's size when listed.

    Returns:
        The footers read (as :func:`footer_of_tail` gives them); a file missing here is to be read the usual way.
    """
    handler = _handler_of(filesystem)
    if handler is None:
        return {}
    sized = [path for path in paths if sizes.get(path)]
    footers: dict[str, bytes] = {}
    for first in range(0, len(sized), _FILES_PER_CALL):
        for path, tail in handler.read_tails(sized[first:first + _FILES_PER_CALL], AT_ONCE).items():
            footer = footer_of_tail(tail)
            if footer is not None:
                footers[path] = footer
    return footers
