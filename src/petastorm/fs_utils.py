"""Petastorm's ``petastorm.fs_utils`` module path. Re-exports only; see :mod:`petastorm.fs.compat`."""

from __future__ import annotations

from petastorm.fs import normalize_dir_url
from petastorm.fs.compat import FilesystemResolver, get_dataset_path, get_filesystem_and_path_or_paths

__all__ = ['FilesystemResolver', 'get_dataset_path', 'get_filesystem_and_path_or_paths', 'normalize_dir_url']
