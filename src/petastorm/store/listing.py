"""A store's listing: what its directory holds, found with as few requests as possible.

This module owns one look at a dataset path (:class:`StoreListing`, :func:`look_at`), the data files under it and
what the listing says of them (sizes and modification times, no request per file), the names that are not data
(``_common_metadata``, ``_metadata``, ``_delta_log``, hidden files and ``.crc`` files) and glob patterns naming
some of the files. Whether the directory is a table, the registry of :mod:`petastorm.store.formats` tells from it.

Nothing here reads a byte of a file: the footers are :mod:`petastorm.store.footers`' and opening the store
:mod:`petastorm.store.opening`'s.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from petastorm._describe import counted
from petastorm._warnings import warn_user
from petastorm.errors import StorageNotFoundError

__all__ = [
    'COMMON_METADATA',
    'DELTA_LOG',
    'SPLIT_WORDS',
    'SUMMARY_METADATA',
    'Look',
    'StoreListing',
    'decode_listing',
    'encode_listing',
    'glob_files',
    'is_glob_pattern',
    'list_data_files',
    'listed_data_files',
    'look_at',
    'mtimes_of',
    'sizes_of',
    'split_name',
    'split_of',
]

logger = logging.getLogger(__name__)

COMMON_METADATA = '_common_metadata'
#: The log directory of a Delta table.
DELTA_LOG = '_delta_log'
SUMMARY_METADATA = '_metadata'

_GLOB_MAGIC = re.compile(r'[*?[]')
#: the schema metadata keys of an encoded listing: its root, and the seconds its request took (empty: not timed).
_ROOT_KEY = b'petastorm.listing.root'
_SECONDS_KEY = b'petastorm.listing.seconds'


def _is_hidden(relative: str) -> bool:
    return any(part.startswith(('_', '.')) or part.endswith(('.crc', '_$folder$'))
               for part in relative.split('/'))


@dataclass(frozen=True)
class StoreListing:
    """One look at a dataset URL: the entries directly under a directory, or what the path itself is.

    Everything planning needs to know before reading a byte is here (whether the directory is a table, which
    metadata files exist and how big they are, the data files when the directory has no subdirectories), so a
    flat store on an object store costs one listing request, not one request per question.
    """

    root: str
    #: the path itself: a directory (when it holds anything), a file, or not found.
    info: pafs.FileInfo
    #: the entries directly under a directory (files and subdirectories); empty otherwise.
    entries: tuple[pafs.FileInfo, ...] = ()
    #: seconds the listing's request took: a round trip or two to the store (None: not timed).
    seconds: float | None = field(default=None, compare=False)

    def child(self, name: str) -> pafs.FileInfo | None:
        """The entry ``name`` directly under the directory, or None."""
        path = posixpath.join(self.root, name)
        return next((entry for entry in self.entries if entry.path.rstrip('/') == path), None)

    @property
    def is_directory(self) -> bool:
        """Whether the path is a directory with something in it."""
        return self.info.type == pafs.FileType.Directory

    @property
    def has_subdirectories(self) -> bool:
        """Whether a non-hidden subdirectory (a partition directory, say) holds more of the data files."""
        return any(entry.type == pafs.FileType.Directory and not _is_hidden(posixpath.basename(entry.path))
                   for entry in self.entries)


#: what lists a directory once, as :func:`look_at` does (a rank of a job may be handed rank 0's listing instead).
Look = Callable[[pafs.FileSystem, str], StoreListing]


def look_at(filesystem: pafs.FileSystem, root: str) -> StoreListing:
    """List ``root`` once (not recursively); only an empty answer costs a second request, to tell what it is."""
    started = time.perf_counter()
    try:
        entries = filesystem.get_file_info(pafs.FileSelector(root, recursive=False, allow_not_found=True))
    except (NotADirectoryError, FileNotFoundError):
        entries = []
    except OSError as err:
        if err.errno not in (errno.ENOTDIR, errno.ENOENT):
            raise
        entries = []
    # An object store may answer the listing of a file's key with the file itself.
    entries = [entry for entry in entries if entry.path.rstrip('/') != root.rstrip('/')]
    if entries:
        return StoreListing(root, pafs.FileInfo(root, pafs.FileType.Directory), tuple(entries),
                            time.perf_counter() - started)
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.Directory and _leaves_out_implied_directories(filesystem):
        # pyarrow's GCS client leaves out of a listing that is not recursive the directories that only the names
        # of the objects under them imply (apache/arrow#35993): a partitioned store or a table's directory looks
        # empty. A recursive listing has their objects.
        entries = _direct_children(root, filesystem.get_file_info(pafs.FileSelector(root, recursive=True)))
        return StoreListing(root, info, tuple(entries))
    return StoreListing(root, info)


def encode_listing(listing: StoreListing) -> bytes:
    """The listing as bytes (an Arrow IPC stream of its entries; the root's own entry first), for another process."""
    infos = (listing.info, *listing.entries)
    table = pa.table({
        'path': pa.array([info.path for info in infos], pa.string()),
        'type': pa.array([int(info.type) for info in infos], pa.int8()),
        'size': pa.array([info.size for info in infos], pa.int64()),
        'mtime_ns': pa.array([info.mtime_ns for info in infos], pa.int64()),
    })
    seconds = b'' if listing.seconds is None else repr(listing.seconds).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema.with_metadata({_ROOT_KEY: listing.root.encode(),
                                                             _SECONDS_KEY: seconds})) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_listing(data: bytes) -> StoreListing:
    """The listing :func:`encode_listing` made."""
    with pa.ipc.open_stream(pa.py_buffer(data)) as stream:
        table = stream.read_all()
    metadata = table.schema.metadata
    columns = table.to_pydict()
    infos = [pafs.FileInfo(path, pafs.FileType(kind), size=size, mtime_ns=mtime_ns)
             for path, kind, size, mtime_ns in zip(columns['path'], columns['type'], columns['size'],
                                                   columns['mtime_ns'], strict=True)]
    seconds = metadata[_SECONDS_KEY]
    return StoreListing(metadata[_ROOT_KEY].decode(), infos[0], tuple(infos[1:]),
                        float(seconds) if seconds else None)


def _leaves_out_implied_directories(filesystem: pafs.FileSystem) -> bool:
    """Whether the listings of ``filesystem`` that are not recursive leave out implied directories (GCS's)."""
    gcs = getattr(pafs, 'GcsFileSystem', None)
    return gcs is not None and isinstance(filesystem, gcs)


def _direct_children(root: str, infos: list[pafs.FileInfo]) -> list[pafs.FileInfo]:
    """The entries directly under ``root``, from a recursive listing of it.

    Its files there, and a directory for each first name of a deeper path.
    """
    children: dict[str, pafs.FileInfo] = {}
    prefix = root.rstrip('/') + '/'
    for info in infos:
        name, slash, _ = info.path[len(prefix):].partition('/')
        if not info.path.startswith(prefix) or not name:
            continue
        if slash:
            children.setdefault(name, pafs.FileInfo(prefix + name, pafs.FileType.Directory))
        else:
            children[name] = info
    return [children[name] for name in sorted(children)]


def list_data_files(filesystem: pafs.FileSystem, root: str, url: Any = None) -> list[str]:
    """Data files under ``root``, sorted, skipping names that start with ``_`` or ``.`` and ``.crc`` files.

    Raises:
        StorageNotFoundError: ``root`` does not exist (the message names the URL); a ``FileNotFoundError``.
    """
    return [info.path for info in listed_data_files(filesystem, look_at(filesystem, root), url)]


def listed_data_files(filesystem: pafs.FileSystem, listing: StoreListing, url: Any = None,
                      split: str | None = None) -> list[pafs.FileInfo]:
    """What :func:`list_data_files` lists, with each file's size (no request per file).

    A directory without subdirectories is listed already; one with subdirectories is listed once more, recursively
    (one request per thousand objects on an object store). ``split``: only the files of that split (see
    :func:`split_of`); without it, every file, with a warning when the files are of several splits.

    Raises:
        StorageNotFoundError: the listed path does not exist (the message names ``url``, else the path), or no file
            is of ``split``.
    """
    root = listing.root
    if listing.info.type == pafs.FileType.NotFound:
        raise StorageNotFoundError(f'dataset {url or root} does not exist')
    if listing.info.type == pafs.FileType.File:
        return [listing.info]
    entries = listing.entries
    if listing.has_subdirectories:
        entries = tuple(filesystem.get_file_info(pafs.FileSelector(root, recursive=True)))
    files = [i for i in entries
             if i.type == pafs.FileType.File and not _is_hidden(_relative(i.path, root))]
    files = _parquet_files_only(files, url or root)
    if split is not None:
        files = _one_split(files, root, split, url or root)
    else:
        _note_splits(files, root, url or root)
    return sorted(files, key=lambda i: i.path)


def _relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` (cut off when it is under it, as listed paths are: 100,000 are listed)."""
    prefix = root.rstrip('/') + '/'
    if path.startswith(prefix) and '/.' not in path and '//' not in path[len(prefix):]:
        return path[len(prefix):]
    return posixpath.relpath(path, root)


def _parquet_files_only(files: list[pafs.FileInfo], shown: Any) -> list[pafs.FileInfo]:
    """Where some files are named ``*.parquet``, only those: a README or a card beside the data is not data.

    A downloaded Hugging Face dataset repository holds ``README.md`` beside ``data/``; stores whose data files have
    no ``.parquet`` suffix (some writers name them ``part-00000``) are listed as they are.
    """
    parquet = [info for info in files if info.path.endswith('.parquet')]
    if not parquet or len(parquet) == len(files):
        return files
    others = sorted(posixpath.basename(info.path) for info in files if not info.path.endswith('.parquet'))
    logger.info('%s: reading its %d .parquet files; the other files beside them are not data and are ignored: %s',
                shown, len(parquet), ', '.join(others[:5]) + (', ...' if len(others) > 5 else ''))
    return parquet


#: The splits Hugging Face ``datasets`` knows, and the words of file and directory names that name each.
SPLIT_WORDS: dict[str, tuple[str, ...]] = {
    'train': ('train', 'training'),
    'validation': ('validation', 'valid', 'val', 'dev'),
    'test': ('test', 'testing', 'evaluation', 'eval'),
}
_WORD_SPLIT = {word: split for split, words in SPLIT_WORDS.items() for word in words}
# A split named as datasets finds one: a word of SPLIT_WORDS starting a file or directory name (train-00000-of-00002
# .parquet, data/validation/...), else any name before the shard numbers of the Hub's files (data/extra-00000-of-
# 00001.parquet).
_SPLIT_WORD = re.compile(r'(?:^|/)(' + '|'.join(sorted(_WORD_SPLIT, key=len, reverse=True)) + r')(?=[-_./])')
_SHARD_SPLIT = re.compile(r'(?:^|/)(\w+?)-\d{5}-of-\d{5}(?=[-_.])[^/]*$')


def split_of(relative: str) -> tuple[str, str] | None:
    """``(split, glob of its files)`` that a data file's path under the store names, or None (no split named).

    The split is ``datasets``' name for it (``'validation'`` for ``val/``, ``'test'`` for ``eval-...``).
    """
    found = _SPLIT_WORD.search(relative)
    if found is not None:
        in_directory = relative[found.end()] == '/'  # train/part-0.parquet, else train-00000-of-00002.parquet
        return _WORD_SPLIT[found.group(1)], relative[:found.end()] + ('' if in_directory else '*.parquet')
    shard = _SHARD_SPLIT.search(relative)
    if shard is not None:
        return shard.group(1), relative[:shard.end(1)] + '-*.parquet'
    return None


def split_name(split: str) -> str:
    """``datasets``' name of a split a user named (``'val'`` -> ``'validation'``; other names as they are)."""
    return _WORD_SPLIT.get(split.lower(), split)


def _note_splits(files: list[pafs.FileInfo], root: str, shown: Any) -> None:
    """Warn when the files are of several splits (train, validation, test), which a store read as one mixes."""
    splits: dict[str, str] = {}
    for info in files:
        found = split_of(_relative(info.path, root))
        if found is None:
            return  # not a layout of splits
        splits.setdefault(*found)
    if len(splits) > 1:
        urls = ', '.join(f'{name}: {str(shown).rstrip("/")}/{glob}' for name, glob in sorted(splits.items()))
        first = 'train' if 'train' in splits else sorted(splits)[0]
        warn_user(f'{shown} holds the splits {", ".join(sorted(splits))} (named in its file names, as Hugging Face '
                  f'datasets reads them), and reading it reads them all together. To read one split, pass '
                  f'split={first!r} to the reader, or name its files: {urls}')


def _one_split(files: list[pafs.FileInfo], root: str, split: str, shown: Any) -> list[pafs.FileInfo]:
    """The files of ``split`` (named as :func:`split_of` reads file names).

    Raises:
        StorageNotFoundError: no file is of that split (the message names the splits there are).
    """
    wanted = split_name(split)
    counts: dict[str, int] = {}
    kept = []
    for info in files:
        found = split_of(_relative(info.path, root))
        name = found[0] if found is not None else '(none named)'
        counts[name] = counts.get(name, 0) + 1
        if name == wanted:
            kept.append(info)
    if not kept:
        there = ', '.join(f'{name} ({counted(count, "file")})' for name, count in sorted(counts.items()))
        raise StorageNotFoundError(f'{shown} has no file of the split {wanted!r}: splits are read from file and '
                                   f'directory names as Hugging Face datasets reads them (train-00000-of-00002'
                                   f'.parquet, validation/...); its files are of: {there or "no file"}')
    return kept


def sizes_of(infos: Iterable[pafs.FileInfo]) -> dict[str, int]:
    """The size of each listed file, by path, where the listing gave one."""
    return {info.path: info.size for info in infos if info.size is not None}


def mtimes_of(infos: Iterable[pafs.FileInfo]) -> dict[str, int]:
    """The modification time (ns) of each listed file, by path, where the filesystem reports one."""
    return {info.path: info.mtime_ns for info in infos if info.mtime_ns is not None}


def is_glob_pattern(path: str) -> bool:
    """Whether ``path`` has glob pattern characters (``*``, ``?``, ``[``)."""
    return _GLOB_MAGIC.search(path) is not None


def glob_files(fs: pafs.FileSystem, pattern: str, url: Any = None) -> list[str]:
    """The data files a glob pattern matches (``*``, ``?`` and ``[...]`` within a name, ``**`` for directories).

    A path that exists as it is, or has no pattern characters, is returned alone.

    Raises:
        StorageNotFoundError: nothing matches (the message names the pattern and where it looked).
    """
    return _file_or_matches(fs, pattern, url or pattern)


def _file_or_matches(fs: pafs.FileSystem, path: str, url: Any) -> list[str]:
    """``[path]``, or the data files a glob pattern matches when no file or directory has that very name."""
    if not is_glob_pattern(path) or fs.get_file_info(path).type != pafs.FileType.NotFound:
        return [path]
    parts = path.split('/')
    first = next(i for i, part in enumerate(parts) if is_glob_pattern(part))
    base = '/'.join(parts[:first]) or '/'
    deep = len(parts) - first > 1
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=deep, allow_not_found=True))
    matches = sorted(i.path for i in infos if i.type == pafs.FileType.File
                     and not _is_hidden(posixpath.relpath(i.path, base)) and _glob_match(i.path.split('/'), parts))
    if not matches:
        raise StorageNotFoundError(f'no data file matches {url} (glob pattern {path!r}, looked under {base!r})')
    return matches


def _glob_match(names: list[str], patterns: list[str]) -> bool:
    """Path components against pattern components: ``*``, ``?``, ``[...]`` within one, ``**`` for any number."""
    if not patterns:
        return not names
    if patterns[0] == '**':
        return any(_glob_match(names[i:], patterns[1:]) for i in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], patterns[0]) and _glob_match(names[1:], patterns[1:])
