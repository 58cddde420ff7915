"""The footers of many files of a GCS store read at once, as ranged reads of their ends through gcsfs.

Planning a store without a ``_metadata`` summary reads every data file's footer. pyarrow's GCS client reads them
one after the other whatever the threads: every read of a file it opened first asks, holding the GIL, whether the
file is closed, which starts the object's download (docs/storage.md, "GCS"), so the other threads wait for that
round trip. A store of 10,000 files then takes minutes to plan through it. gcsfs sends many ranged reads at once
from one event loop without the GIL: behind 10 ms of latency it read the ends of 2,000 files in about a second,
where pyarrow's client took 50 s from Python and 5 s as ``pyarrow.dataset`` fragments.

So where the store was opened with pyarrow's GCS client from a URL and ``storage_options`` (the same options make
gcsfs: :attr:`~petastorm.fs.ResolvedLocation.fsspec_twin`), and there are at least :data:`TOGETHER_FROM` footers to
read, the last :data:`TAIL_BYTES` of each file (of its listed size) are read together and the footer cut from
them. Whatever this does not give (a file gone or changed since it was listed, a footer longer than the tail, an
error of the client) is read the usual way afterwards, which raises the error the file's state calls for: the
errors stay those of pyarrow's client, with the URL named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ['TAIL_BYTES', 'TOGETHER_FROM', 'footer_of_tail', 'read_footer_tails']

logger = logging.getLogger(__name__)

#: bytes read at the end of each file: pyarrow's Parquet reader reads as much for a footer at first.
TAIL_BYTES = 64 << 10
#: footers to read before reading them together pays for importing gcsfs (about 0.3 s of CPU, once per process).
TOGETHER_FROM = 32
#: files whose ends are asked for in one call: the client holds the answers until all arrive, so a call's memory
#: is bounded by this many tails.
_FILES_PER_CALL = 1_000
#: reads on their way at once. More costs the client CPU (it waits on all of them at every answer: 10,000 files
#: took 2.3 CPU-seconds at 128, 3.4 at 512 and 4.7 at its default of 1,280) and gains nothing past a few hundred
#: round trips a second.
_AT_ONCE = 128

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


def read_footer_tails(make_client: Callable[[], Any], paths: Sequence[str],
                      sizes: Mapping[str, int]) -> dict[str, bytes]:
    """The footers of ``paths`` read together from their ends (see the module docstring), by path.

    Args:
        make_client: makes the fsspec filesystem of the store (gcsfs).
        paths: the files; those without a listed size in ``sizes`` are left out.
        sizes: each file's size when listed.

    Returns:
        The footers read (as :func:`footer_of_tail` gives them); a file missing here is to be read the usual way.
    """
    sized = [path for path in paths if sizes.get(path)]
    if not sized:
        return {}
    try:
        client = make_client()
    except Exception as err:  # noqa: BLE001 - gcsfs missing or refusing the options: the usual reads follow
        logger.debug('footers read one by one: the fsspec client could not be made (%s)', err)
        return {}
    footers: dict[str, bytes] = {}
    for first in range(0, len(sized), _FILES_PER_CALL):
        part = sized[first:first + _FILES_PER_CALL]
        ends = [sizes[path] for path in part]
        try:
            tails = client.cat_ranges(part, [max(end - TAIL_BYTES, 0) for end in ends], ends,
                                      batch_size=_AT_ONCE, on_error='return')
        except Exception as err:  # noqa: BLE001 - the usual reads follow, and raise what the store's state calls for
            logger.debug('footers read one by one: reading file ends together failed (%s)', err)
            return footers
        for path, tail in zip(part, tails, strict=True):
            footer = footer_of_tail(tail) if isinstance(tail, bytes) else None
            if footer is not None:
                footers[path] = footer
    return footers
