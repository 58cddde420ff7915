"""A local filesystem that answers every file open after a delay: remote storage latency, simulated.

Used to show what the local disk cache saves::

    slow = pyarrow.fs.PyFileSystem(SlowLocalHandler(0.05))
    make_reader(url, filesystem=slow, cache_type='local-disk', ...)
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ['SlowLocalHandler']


class SlowLocalHandler(pafs.FileSystemHandler):
    """The local filesystem with a fixed latency on every file opened for reading.

    Use it as ``pyarrow.fs.PyFileSystem(SlowLocalHandler(latency))``. Only the two read opens wait; listing,
    writing and the other operations run at local speed.

    Args:
        latency: seconds each ``open_input_stream`` / ``open_input_file`` waits before opening.
    """

    def __init__(self, latency: float) -> None:
        self._fs = pafs.LocalFileSystem()
        self._latency = latency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlowLocalHandler) and other._latency == self._latency

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        """``'slow-local'``, the name pyarrow shows for this filesystem."""
        return 'slow-local'

    def normalize_path(self, path: str) -> str:
        """``path`` unchanged: local paths are used as given."""
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        """The ``FileInfo`` of each path (type ``NotFound`` for a missing one)."""
        return self._fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """The ``FileInfo`` of every entry the selector lists (recursively if it says so)."""
        return self._fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        """Create the directory ``path`` (and its missing parents when ``recursive``)."""
        self._fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        """Delete the directory ``path`` and everything in it."""
        self._fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        """Delete everything in the directory ``path``, keeping the directory.

        Args:
            path: the directory.
            missing_dir_ok: succeed when ``path`` does not exist instead of raising ``FileNotFoundError``.
        """
        self._fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        """Refused: a test filesystem never empties the machine's root directory.

        Raises:
            OSError: always.
        """
        raise OSError('refusing to delete the root directory')

    def delete_file(self, path: str) -> None:
        """Delete the file ``path``."""
        self._fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        """Move (rename) the file or directory ``src`` to ``dest``."""
        self._fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        """Copy the file ``src`` to ``dest``."""
        self._fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        """A sequential-read stream of the file ``path``, after the latency."""
        time.sleep(self._latency)
        return self._fs.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        """A random-access (seekable) reader of the file ``path``, after the latency."""
        time.sleep(self._latency)
        return self._fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: dict | None) -> pa.NativeFile:
        """A stream writing the file ``path`` (replacing it); ``metadata`` is pyarrow's key-value metadata."""
        return self._fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: dict | None) -> pa.NativeFile:
        """A stream appending to the file ``path``; ``metadata`` is pyarrow's key-value metadata."""
        return self._fs.open_append_stream(path, metadata=metadata)
