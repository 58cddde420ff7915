"""``pyarrow.fs`` access to any fsspec filesystem, with clear errors, retries and exact ranged reads.

:class:`StorageHandler` is pyarrow's ``FSSpecHandler`` plus three things remote storage needs:

* errors name the URL and say what went wrong (not found, credentials refused, permission denied, storage
  unavailable) without showing a credential;
* idempotent calls (listing, metadata, reads) are retried on transient errors with backoff;
* files opened for reading fetch exactly the byte ranges pyarrow asks for (``cat_file(path, start, end)``, a
  ranged GET on object stores), so projecting columns or reading one row group never downloads a whole file.
  The tail of each file (where the Parquet footer lives) is kept in a small cache, so the footer is fetched
  once per file and process, not once per row group;
* a file that changed after it was listed is noticed, not read as a mix of two versions: through s3fs, gcsfs and
  adlfs every ranged read names the listed version (the ETag or GCS generation: :mod:`petastorm.fs._versions`),
  and on every store a read of a file's tail asks for one byte more than
  the listed size (a file that grew answers with it; one that shrank answers short), so
  :class:`~petastorm.errors.DataFileChangedError` names the file instead.
"""

from __future__ import annotations

import datetime
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from petastorm.errors import DataFileChangedError
from petastorm.fs._errors import (
    ShortReadError,
    classify,
    is_ambiguous_refusal,
    is_transient,
    safe_cause,
    secrets_of,
    translate,
)
from petastorm.fs._retry import DEFAULT_RETRY, RetriesExhausted, RetryPolicy
from petastorm.fs._throttle import limit_for
from petastorm.fs._versions import VersionGone, listed_version, read_version, read_versions_at_once, version_name

T = TypeVar('T')

#: bytes kept from the end of each file read: pyarrow reads a Parquet footer with one 64 KiB tail read.
TAIL_BYTES = 64 * 1024
#: bytes fetched per request by streams opened for sequential reading.
STREAM_CHUNK_BYTES = 4 * 1024 * 1024
_TAIL_CACHE_BYTES = 32 * 1024 * 1024
_SIZE_CACHE_ENTRIES = 100_000
#: most file sizes a pickled handler carries to a worker process (the most recently learned ones).
_SIZES_SHIPPED = 20_000
#: schemes whose directories are only key prefixes (they vanish with their last object).
OBJECT_STORE_SCHEMES = frozenset({'s3', 's3a', 'gs', 'gcs', 'abfs', 'abfss', 'az', 'oss', 'oci', 'cos', 'r2'})


class _LruBytes:
    """Thread-safe LRU of ``path -> (offset, bytes)`` bounded by total bytes."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._size = 0
        self._items: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> tuple[int, bytes] | None:
        with self._lock:
            item = self._items.get(path)
            if item is not None:
                self._items.move_to_end(path)
            return item

    def put(self, path: str, offset: int, data: bytes) -> None:
        with self._lock:
            old = self._items.pop(path, None)
            if old is not None:
                self._size -= len(old[1])
            self._items[path] = (offset, data)
            self._size += len(data)
            while self._size > self._capacity and self._items:
                _, (_, dropped) = self._items.popitem(last=False)
                self._size -= len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._size = 0


class StorageHandler(pafs.FSSpecHandler):
    """A ``pyarrow.fs.FileSystemHandler`` over an fsspec filesystem; wrap it with ``pyarrow.fs.PyFileSystem``.

    Args:
        fs: the fsspec filesystem.
        scheme: the URL scheme it serves (``'s3'``, ``'gs'``, ``'memory'``...), used to show URLs in messages.
        retry: how transient errors are retried.
    """

    def __init__(self, fs: Any, scheme: str, retry: RetryPolicy = DEFAULT_RETRY,
                 known_sizes: dict[str, int] | None = None, known_etags: dict[str, str] | None = None) -> None:
        super().__init__(fs)
        self.scheme = scheme
        self.retry = retry
        self._sizes: OrderedDict[str, int] = OrderedDict(known_sizes or {})
        # Version tags of listed files (ETags, GCS generations), sent with every read (petastorm.fs._versions): a
        # rewritten object then fails the read.
        self._etags: dict[str, str] = dict(known_etags or {})
        self._sizes_lock = threading.Lock()
        self._tails = _LruBytes(_TAIL_CACHE_BYTES)
        self._secrets: list[str] | None = None

    def __reduce__(self) -> tuple:
        # File sizes learned by listing travel along (a worker process would otherwise send one more request per
        # file before its first read); the tails stay behind, they are too big to copy to every worker.
        with self._sizes_lock:
            sizes = dict(list(self._sizes.items())[-_SIZES_SHIPPED:])
            etags = {path: self._etags[path] for path in sizes if path in self._etags}
        return StorageHandler, (self.fs, self.scheme, self.retry, sizes, etags)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StorageHandler):
            return self.fs == other.fs and self.scheme == other.scheme
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    # Defining __eq__ without __hash__ leaves the handler unhashable: it is compared by value and caches state.

    # -- helpers ------------------------------------------------------------------------------------------------

    def url_of(self, path: str) -> str:
        """The URL a path on this filesystem stands for (for messages)."""
        return f'{self.scheme}://{path}'

    def _run(self, operation: str, path: str, func: Callable[[], T], retry: bool = True) -> T:
        """``func()`` with transient errors retried (when ``retry``) and failures translated."""
        try:
            return self.retry.call(func, f'{operation} {self.url_of(path)}', self._secrets_shown_nowhere(),
                                   limit_for(self.scheme, path)) if retry else func()
        except RetriesExhausted as exhausted:
            error, attempts = exhausted.error, exhausted.attempts
        except Exception as err:
            error, attempts = err, 1
        secrets = self._secrets_shown_nowhere()
        if is_ambiguous_refusal(error):
            error = self._diagnose_refusal(path, error)
        translated = translate(error, operation, self.url_of(path), secrets, attempts)
        if translated is error:
            raise error
        raise translated from safe_cause(error, secrets)

    def _diagnose_refusal(self, path: str, error: BaseException) -> BaseException:
        """For a bare 403, list the bucket once: its error says whether the credentials themselves were refused."""
        bucket = path.strip('/').split('/')[0]
        if self.scheme not in OBJECT_STORE_SCHEMES or not bucket:
            return error
        try:
            self.fs.ls(bucket, refresh=True)
        except Exception as probe:
            if classify(probe) == 'credentials':
                return probe
        return error

    def _secrets_shown_nowhere(self) -> list[str]:
        if self._secrets is None:
            self._secrets = secrets_of(getattr(self.fs, 'storage_options', None) or {})
        return self._secrets

    def _remember(self, infos: list[pafs.FileInfo]) -> None:
        with self._sizes_lock:
            for info in infos:
                if info.type == pafs.FileType.File and info.size is not None:
                    self._sizes[info.path.rstrip('/')] = info.size
            while len(self._sizes) > _SIZE_CACHE_ENTRIES:
                self._etags.pop(self._sizes.popitem(last=False)[0], None)

    def _create_file_info(self, path: str, info: dict) -> pafs.FileInfo:
        # FSSpecHandler builds every FileInfo of a listing or a lookup here, from fsspec's details: keep the version
        # tag (ETag, generation), for which FileInfo has no place.
        version = listed_version(self.fs, info)
        if version is not None:
            with self._sizes_lock:
                self._etags[path.rstrip('/')] = version
        found = pafs.FSSpecHandler._create_file_info(path, info)
        if found.mtime is not None or found.type != pafs.FileType.File:
            return found
        # pyarrow's handler reads fsspec's 'mtime' only, which s3fs ('LastModified'), adlfs ('last_modified') and
        # gcsfs ('updated') do not fill: without it a cache keys a file by its size alone.
        mtime = _modification_time(info)
        return found if mtime is None else pafs.FileInfo(path, found.type, size=found.size, mtime=mtime)

    def _forget(self) -> None:
        with self._sizes_lock:
            self._sizes.clear()
            self._etags.clear()
        self._tails.clear()

    def _size_of(self, path: str) -> int:
        with self._sizes_lock:
            size = self._sizes.get(path.rstrip('/'))
        if size is not None:
            return size
        info = self._run('open', path, lambda: self.fs.info(path))
        if info.get('type') != 'file':
            raise IsADirectoryError(f'{self.url_of(path)} is a directory, not a file')
        size = int(info['size'])
        self._remember([pafs.FileInfo(path, pafs.FileType.File, size=size)])
        return size

    def read_range(self, path: str, start: int, end: int, size: int) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (of ``size`` bytes): one ranged request, or the cached tail."""
        if start >= end:
            return b''
        cached = self._tails.get(path)
        if cached is not None and cached[0] <= start and end <= cached[0] + len(cached[1]):
            return cached[1][start - cached[0]:end - cached[0]]
        if end == size and end - start <= TAIL_BYTES:
            tail_start = max(0, size - TAIL_BYTES)
            tail = self._fetch(path, tail_start, size, size)
            self._tails.put(path, tail_start, tail)
            return tail[start - tail_start:]
        return self._fetch(path, start, end, size)

    def read_tails(self, paths: Sequence[str], at_once: int) -> dict[str, bytes]:
        """The last :data:`TAIL_BYTES` of each file of a known size, asked for together (``at_once`` on their way)
        from the client's event loop, of the version listed, and kept as the tails of single reads are.

        A file whose read failed (gone, rewritten, grown: one byte more than its listed size is asked for, as
        single reads do), or of no known size, is left out: its usual read reports what is wrong. Empty for a
        client that cannot read many ranges at once (gcsfs, s3fs and adlfs can).
        """
        with self._sizes_lock:
            listed = [(path, self._sizes.get(path.rstrip('/')), self._etags.get(path.rstrip('/'))) for path in paths]
        ranges = [(path, max(0, size - TAIL_BYTES), size, version) for path, size, version in listed if size]
        if not ranges:
            return {}
        answers = read_versions_at_once(self.fs, [(path, start, end + 1, version)
                                                  for path, start, end, version in ranges], at_once)
        if answers is None:
            return {}
        tails = {}
        for (path, start, end, _), answer in zip(ranges, answers, strict=True):
            if isinstance(answer, bytes) and len(answer) == end - start:
                self._tails.put(path, start, answer)
                tails[path] = answer
        return tails

    def _fetch(self, path: str, start: int, end: int, size: int) -> bytes:
        # A read up to the listed end asks for one byte more: only a file that grew since it was listed has it.
        asked_end = end + 1 if end == size else end

        def fetch() -> bytes:
            try:
                data = self._get(path, start, asked_end)
            except (DataFileChangedError, FileNotFoundError):
                raise
            except Exception as err:
                if not is_transient(err):
                    self._check_size(path, size)  # a range past a file that shrank is refused (416), for one
                raise
            if len(data) > end - start:
                raise DataFileChangedError(
                    f'{self.url_of(path)} changed after it was listed: it had {size} bytes then and has more now. '
                    f'Its row groups were planned from the old file; make a new reader to read the new one')
            if len(data) < end - start:
                self._check_size(path, size)
                raise ShortReadError(f'asked for bytes {start}-{end} and got {len(data)} bytes')
            return data

        return self._run(f'reading bytes {start}-{end} of', path, fetch)

    def _get(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (fewer at its end), of its listed version where the store tags them."""
        with self._sizes_lock:
            version = self._etags.get(path.rstrip('/'))
        if version is None:
            return self.fs.cat_file(path, start=start, end=end)  # type: ignore[no-any-return]
        try:
            return read_version(self.fs, path, start, end, version)
        except VersionGone as err:
            raise DataFileChangedError(
                f'{self.url_of(path)} changed after it was listed: its {version_name(self.fs)} was {version} and is '
                f'another now. Its row groups were planned from the old object; make a new reader to read the new '
                f'one') from err

    def _check_size(self, path: str, size: int) -> None:
        """After a short read: raise DataFileChangedError if the file is no longer ``size`` bytes long."""
        try:
            self.fs.invalidate_cache(path)
            actual = int(self.fs.info(path)['size'])
        except FileNotFoundError:
            raise
        except Exception:  # the failed read itself is reported (and retried); this was only a diagnosis
            return
        if actual != size:
            raise DataFileChangedError(
                f'{self.url_of(path)} changed after it was listed: it had {size} bytes then and has {actual} now. '
                f'Its row groups were planned from the old file; make a new reader to read the new one')

    # -- FileSystemHandler --------------------------------------------------------------------------------------

    def _info_of(self, path: str) -> pafs.FileInfo:
        return self._run('get_file_info', path, lambda: pafs.FSSpecHandler.get_file_info(self, [path])[0])

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = [self._info_of(path) for path in paths]
        self._remember(infos)
        return infos

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        infos = self._run('listing', selector.base_dir, lambda: self._list(selector))
        self._remember(infos)
        return infos

    def _list(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """The entries under the selector's directory, from the listing alone where it has any.

        pyarrow's handler first asks whether the path is a directory and whether it exists (on S3 a HEAD and a
        listing each) before listing it; a listing that returns entries answers both. Only an empty answer (an
        empty directory, a file, or nothing) costs those questions.
        """
        base = selector.base_dir
        # fsspec keeps listings for the life of the filesystem object, which the process shares: a reader made after
        # another process added or removed files must see them, so every listing asks the store.
        self.fs.invalidate_cache(base)
        try:
            found = self.fs.find(base, maxdepth=None if selector.recursive else 1, withdirs=True, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            found = {}
        own = base.strip('/')
        infos = [self._create_file_info(path, info) for path, info in found.items() if path.strip('/') != own]
        if infos or self.fs.isdir(base):
            return infos
        if self.fs.exists(base):
            raise NotADirectoryError(base)
        if selector.allow_not_found:
            return []
        raise FileNotFoundError(base)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._run('create_dir', path, lambda: super(StorageHandler, self).create_dir(path, recursive), retry=False)

    def delete_dir(self, path: str) -> None:
        self._forget()
        try:
            self._run('delete_dir', path, lambda: super(StorageHandler, self).delete_dir(path), retry=False)
        except FileNotFoundError:
            # Object stores have no directories: a prefix whose objects were all moved away is gone already.
            if self.scheme not in OBJECT_STORE_SCHEMES:
                raise

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._forget()
        self._run('delete_dir_contents', path,
                  lambda: super(StorageHandler, self).delete_dir_contents(path, missing_dir_ok), retry=False)

    def delete_root_dir_contents(self) -> None:
        self._forget()
        self._run('delete_root_dir_contents', '', lambda: super(StorageHandler, self).delete_root_dir_contents(),
                  retry=False)

    def delete_file(self, path: str) -> None:
        self._forget()
        self._run('delete_file', path, lambda: super(StorageHandler, self).delete_file(path), retry=False)

    def move(self, src: str, dest: str) -> None:
        self._forget()
        self._run(f'move to {self.url_of(dest)} of', src, lambda: super(StorageHandler, self).move(src, dest),
                  retry=False)

    def copy_file(self, src: str, dest: str) -> None:
        self._forget()
        self._run(f'copy to {self.url_of(dest)} of', src, lambda: super(StorageHandler, self).copy_file(src, dest),
                  retry=False)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        # Sequential readers ask for small pieces: fetch STREAM_CHUNK_BYTES per request instead.
        raw = pa.PythonFile(_RangedFile(self, path, self._size_of(path)), mode='r')
        return pa.BufferedInputStream(raw, STREAM_CHUNK_BYTES)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(_RangedFile(self, path, self._size_of(path)), mode='r')

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        self._forget()
        return self._run('open for writing', path,
                         lambda: super(StorageHandler, self).open_output_stream(path, metadata), retry=False)

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        self._forget()
        return self._run('open for appending', path,
                         lambda: super(StorageHandler, self).open_append_stream(path, metadata), retry=False)


class _RangedFile(io.RawIOBase):
    """A read-only, seekable file whose every read is one ranged fetch through the handler."""

    def __init__(self, handler: StorageHandler, path: str, size: int) -> None:
        super().__init__()
        self._handler = handler
        self._path = path
        self._size = size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = self._size + offset
        else:
            raise ValueError(f'{whence=} should be 0, 1 or 2')
        if position < 0:
            raise ValueError(f'cannot seek to {position} in {self._handler.url_of(self._path)}')
        self._position = position
        return position

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ValueError('I/O operation on closed file')
        end = self._size if size is None or size < 0 else min(self._size, self._position + size)
        data = self._handler.read_range(self._path, self._position, end, self._size)
        self._position += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast('B')[:len(data)] = data
        return len(data)


def _modification_time(info: dict[str, Any]) -> datetime.datetime | None:
    """The modification time an fsspec ``info`` dict gives under another key than ``'mtime'`` (None: none)."""
    for key in ('LastModified', 'last_modified', 'updated'):
        value = info.get(key)
        if isinstance(value, str):
            try:
                value = datetime.datetime.fromisoformat(value.replace('Z', '+00:00'))
            except ValueError:
                continue
        if isinstance(value, datetime.datetime):
            return value if value.tzinfo is not None else value.replace(tzinfo=datetime.timezone.utc)
    return None
