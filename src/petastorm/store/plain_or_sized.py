"""Which data files are opened the plain way, and which by their listed sizes after importing ``pyarrow.dataset``.

On pyarrow's S3 and Azure clients a file opened by its path costs a ``HEAD`` (its size) before any read; opened by
the size its listing gave (:mod:`petastorm.store.sized_files`) it costs nothing. Opening by size needs
``pyarrow.dataset``, and importing it imports pandas: 0.15 to 0.2 s of CPU, once per process. The rule here weighs
those ``HEAD`` requests against that import:

* an in-order reader's first :data:`PLAIN_OPENS` files are opened the plain way in a process that has not imported
  it (:meth:`~petastorm.store.data_files.DataFiles.open_plainly_first`), so that its first batch does not wait for
  the import; the read of the next file imports it, while the first files' rows are read;
* a small store is read the plain way by any reader, without the import (:func:`plain_opens`): one of no more
  files than that, or of up to :data:`SMALL_STORE_FILES` files whose listing came back within
  :data:`PLAIN_LISTING_SECONDS`. Its ``HEAD`` requests cost a round trip or two: a reader of the one-file
  hello-world stand-in on Azurite went from 0.37 s to 0.16 s, of the 10-file scalar store from 0.25 s to 0.14 s.

A store farther away, or larger, imports it at its first footer read (a file opened the plain way costs a round
trip more, where the import costs its CPU once).
"""

from __future__ import annotations

import pyarrow.fs as pafs

from petastorm.store.sized_files import opens_with_listed_size

__all__ = ['PLAIN_LISTING_SECONDS', 'PLAIN_OPENS', 'SMALL_STORE_FILES', 'keeps_files_open', 'plain_opens',
           'reads_by_size']

#: files opened the plain way (a ``HEAD`` each) before ``pyarrow.dataset`` is imported to read the rest by their
#: listed sizes: the footers an in-order reader needs for its first batch; every file of a store of no more files.
PLAIN_OPENS = 8
#: the most files of a store near enough (:data:`PLAIN_LISTING_SECONDS`) read the plain way: their ``HEAD``
#: requests go out with the footers' reads, 64 at once, so in two round trips at most.
SMALL_STORE_FILES = 128
#: a store of :data:`SMALL_STORE_FILES` files or fewer whose listing request came back sooner is read the plain
#: way: its ``HEAD`` requests then cost less than importing ``pyarrow.dataset`` (0.15 s of CPU measured here, most
#: of it pandas). A listing takes about two round trips (through a proxy adding 10 ms each way: 45 to 65 ms, the
#: first with the connection's). A 10-file store on Azurite there read in 0.28 s the plain way and 0.40 s with the
#: import; at 50 ms each way (listings of about 0.2 s, read with the import) in 0.93 s and 0.97 s.
PLAIN_LISTING_SECONDS = 0.15


def plain_opens(files: int, listing_seconds: float | None) -> int:
    """How many of a store's ``files`` to open the plain way before importing ``pyarrow.dataset``.

    All of them when they are :data:`PLAIN_OPENS` or fewer, or :data:`SMALL_STORE_FILES` or fewer and the store's
    listing request took less than :data:`PLAIN_LISTING_SECONDS` (``listing_seconds``; None: not timed); none
    otherwise.
    """
    if files <= PLAIN_OPENS:
        return files
    near = listing_seconds is not None and listing_seconds < PLAIN_LISTING_SECONDS
    return files if near and files <= SMALL_STORE_FILES else 0


def reads_by_size(filesystem: pafs.FileSystem) -> bool:
    """Whether the files of ``filesystem`` are read by their listed sizes: on pyarrow's S3 and Azure clients."""
    return keeps_files_open(filesystem) and opens_with_listed_size(filesystem)


def keeps_files_open(filesystem: pafs.FileSystem) -> bool:
    """Whether a store's data files keep the files of ``filesystem`` open: pyarrow's own remote filesystems."""
    # Not: local disk, our fsspec layer (or another Python handler), an object that only opens files.
    return isinstance(filesystem, pafs.FileSystem) and \
        not isinstance(filesystem, (pafs.LocalFileSystem, pafs.PyFileSystem))
