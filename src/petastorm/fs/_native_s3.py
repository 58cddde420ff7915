"""pyarrow's own ``S3FileSystem``, made from the arguments :mod:`petastorm.fs.settings.s3_pyarrow` translates.

Which options it can take, and why it is preferred to s3fs when it can, is said there; this module makes the client
and gives pyarrow's I/O pool the threads its connections need. To read through s3fs anyway (its ETag checks, its
credential sources), pass ``filesystem=s3fs.S3FileSystem(...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

__all__ = ['IO_THREADS', 'grow_io_pool', 'native_s3_filesystem']

#: pyarrow's I/O threads (and so its S3 client's connections) once a reader uses its S3 client: as many as the
#: footers read at a time (store.footers.REMOTE_FOOTER_THREADS).
IO_THREADS = 64


def native_s3_filesystem(arguments: Mapping[str, Any]) -> pafs.S3FileSystem:
    """pyarrow's ``S3FileSystem`` with ``arguments``, pyarrow's I/O pool grown to :data:`IO_THREADS` threads."""
    grow_io_pool()
    return pafs.S3FileSystem(**arguments)


def grow_io_pool() -> None:
    """Grow pyarrow's I/O pool to :data:`IO_THREADS` threads, for pyarrow's S3, GCS and Azure clients.

    Each client keeps as many connections as pyarrow's I/O pool has threads (8 by default): footers and row
    groups are read as many at a time as the reader asks only with more. The pool is pyarrow's, for the process.
    """
    import pyarrow as pa

    if pa.io_thread_count() < IO_THREADS:
        pa.set_io_thread_count(IO_THREADS)
