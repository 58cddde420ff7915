"""The footers of a store's data files read in listing order behind the reader that needs them.

:func:`petastorm.store.footers.store_footers` reads every footer before it returns: right for what needs them
all (the number of row groups, a shuffle of all of them), a wait of one round trip per 64 files for what needs
only the first. A :class:`FooterStream` reads them in the listing's order instead, in a thread of its own with a
bounded pool of reads at once (the first files' first), and hands out each one as soon as it and every one before
it are read: a reader can read the first files' rows while the footers of the last are still on their way.

The footers are read through the store's :class:`~petastorm.store.data_files.DataFiles`, so the files a worker
then opens are not asked for their footers again. Once every footer is read they are the store's
(``store.reads.footers``), and whatever asks the store for all of them meanwhile waits for the stream instead of
reading them a second time.

On S3 and Azure, the first files are opened the plain way until ``pyarrow.dataset`` is imported
(:meth:`~petastorm.store.data_files.DataFiles.open_plainly_first`): the first batch does not wait for that import.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NoReturn

import pyarrow.parquet as pq

from petastorm.errors import PetastormError
from petastorm.store.footers import footer_threads, read_data_file_footer, store_data_files
from petastorm.store.model import ParquetStore

__all__ = ['FIRST_WINDOW', 'FooterStream', 'FooterStreamStopped']

#: footers asked for at first; each one read lets one more be asked, up to twice the threads (a slow start: the
#: first row groups' requests do not queue behind a hundred footers' at a store that answers them in turn).
FIRST_WINDOW = 8


class FooterStreamStopped(PetastormError, RuntimeError):
    """A footer was asked of a stream that was stopped before reading it (the reader was stopped)."""


class FooterStream:
    """Every data file's footer of ``store``, read in listing order by a bounded pool (see the module docstring).

    Start it with :meth:`start`; :meth:`stop` and :meth:`join` end it (idempotent). An error reading a footer
    ends the stream; it is raised, with its traceback, by every later call asking for that footer or a later one.

    Args:
        store: the store (its ``files`` in listing order).
        threads: footers read at once (default: 16 from local disk, 64 from remote storage).
    """

    def __init__(self, store: ParquetStore, threads: int | None = None) -> None:
        self._store = store
        self._paths = list(store.files)
        self._threads = threads or footer_threads(store.filesystem)
        self._footers: list[pq.FileMetaData] = []
        self._error: BaseException | None = None
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name='petastorm-footer-stream')

    def __len__(self) -> int:
        """The number of data files (footers) of the stream."""
        return len(self._paths)

    def start(self) -> FooterStream:
        """Start reading; returns the stream. The store then waits for it when asked for all its footers."""
        self._store.reads.footer_stream = self
        self._thread.start()
        return self

    def footer(self, index: int) -> pq.FileMetaData:
        """The footer of data file ``index`` (in listing order), waiting for it and every one before it.

        Raises:
            FooterStreamStopped: the stream was stopped first.
            Whatever reading one of these footers raised (a ``CorruptFooterError``, a ``StorageError``...).
        """
        with self._changed:
            self._changed.wait_for(lambda: len(self._footers) > index or self._error is not None or self._stopped)
            if len(self._footers) <= index:
                self._raise_why_not()
            return self._footers[index]

    def footers(self) -> dict[str, pq.FileMetaData] | None:
        """Every footer by path, once all are read (the store's ``reads.footers`` from then on); None if stopped.

        Raises:
            Whatever reading a footer raised.
        """
        try:
            if self._paths:
                self.footer(len(self._paths) - 1)
        except FooterStreamStopped:
            return None
        return dict(zip(self._paths, self._footers, strict=True))

    @property
    def done(self) -> bool:
        """True once every footer is read."""
        with self._changed:
            return len(self._footers) == len(self._paths)

    def stop(self) -> None:
        """Stop reading footers (non-blocking, idempotent); those asked for meanwhile raise ``FooterStreamStopped``."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def join(self) -> None:
        """Wait for the stream's thread (stopping it first if it is still reading), idempotent."""
        if not self.done:
            self.stop()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()

    def _raise_why_not(self) -> NoReturn:
        if self._error is not None:
            raise self._error
        raise FooterStreamStopped(f'the footers of {self._store.url} were no longer read: the reader was stopped')

    def _run(self) -> None:
        """Keep up to ``window`` footers asked for, take them in order, hand each out as it comes."""
        files = store_data_files(self._store)
        files.open_plainly_first()
        ahead: deque[Future] = deque()
        following = 0
        window = FIRST_WINDOW
        with ThreadPoolExecutor(min(self._threads, max(1, len(self._paths))),
                                thread_name_prefix='petastorm-footer') as pool:
            try:
                while True:
                    while not self._stopped and following < len(self._paths) and len(ahead) < window:
                        ahead.append(pool.submit(read_data_file_footer, files, self._paths[following]))
                        following += 1
                    if self._stopped or not ahead:
                        break
                    footer = ahead.popleft().result()
                    window = min(2 * self._threads, window + 2)
                    with self._changed:
                        self._footers.append(footer)
                        if len(self._footers) == len(self._paths):
                            self._store.reads.footers = dict(zip(self._paths, self._footers, strict=True))
                        self._changed.notify_all()
            except BaseException as err:  # handed to whoever asks for the footer (re-raised there)
                with self._changed:
                    self._error = err
                    self._changed.notify_all()
            finally:
                for future in ahead:
                    future.cancel()
