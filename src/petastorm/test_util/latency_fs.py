"""A local filesystem that answers every file open after a delay: remote storage latency, simulated.

Used to show what the local disk cache saves::

    slow = pyarrow.fs.PyFileSystem(SlowLocalHandler(0.05))
    make_reader(url, filesystem=slow, cache_type='local-disk', ...)
"""

from __future__ import annotations

import time

import pyarrow.fs as pafs


class SlowLocalHandler(pafs.FileSystemHandler):
    """The local filesystem with a fixed latency on every file opened for reading."""

    def __init__(self, latency: float) -> None:
        self._fs = pafs.LocalFileSystem()
        self._latency = latency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlowLocalHandler) and other._latency == self._latency

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self):
        return 'slow-local'

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self._fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self._fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self._fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self._fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self._fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError('refusing to delete the root directory')

    def delete_file(self, path):
        self._fs.delete_file(path)

    def move(self, src, dest):
        self._fs.move(src, dest)

    def copy_file(self, src, dest):
        self._fs.copy_file(src, dest)

    def open_input_stream(self, path):
        time.sleep(self._latency)
        return self._fs.open_input_stream(path)

    def open_input_file(self, path):
        time.sleep(self._latency)
        return self._fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self._fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self._fs.open_append_stream(path, metadata=metadata)
