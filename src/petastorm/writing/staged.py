"""A dataset write committed or rolled back as a whole, through a hidden staging directory in the target.

:class:`StagedWrite` is how a failed write leaves nothing that looks like a complete dataset: files are written
into the staging directory, moved into place on commit, and the metadata that makes the directory a dataset is
written last.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import uuid
from collections.abc import Iterator, Mapping

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.errors import DatasetWriteError
from petastorm.fs._files import move_file, remove_dir
from petastorm.metadata.write import write_dataset_metadata, write_summary
from petastorm.unischema import Unischema
from petastorm.writing.files import FileRoller

__all__ = ['StagedWrite']

logger = logging.getLogger(__name__)


class StagedWrite:
    """A dataset write into ``root`` through a hidden staging directory, committed or rolled back as a whole.

    :meth:`begin` checks the target and makes the staging directory; files are written there (:meth:`file_roller`);
    :meth:`commit` moves them into place and writes ``_common_metadata`` last, so the dataset exists only once
    everything is in place. :meth:`roll_back` removes what the write made: the staging directory, files already
    moved, and the target directory when the write created it. The object is picklable (the filesystem and
    paths), so write tasks on other machines can write into the staging directory.

    Args:
        dataset_url: the target URL, for messages.
        filesystem: the target's filesystem.
        root: the target directory on ``filesystem``.
        replace: replace the target's contents on commit (``mode='overwrite'``) instead of refusing a non-empty
            target.
    """

    def __init__(self, dataset_url: str, filesystem: pafs.FileSystem, root: str, *, replace: bool) -> None:
        self.url = dataset_url
        self.filesystem = filesystem
        self.root = root
        self.replace = replace
        self.staging = posixpath.join(root, f'_petastorm_staging-{uuid.uuid4().hex}')
        self._created_root = False
        self._moved: list[str] = []

    def begin(self) -> None:
        """Check the target and make the staging directory.

        Raises:
            FileExistsError: the target is a file, or a non-empty directory and ``replace`` is False.
        """
        existing = self.filesystem.get_file_info(self.root)
        if existing.type == pafs.FileType.File:
            raise FileExistsError(f'cannot write a dataset to {self.url}: it is a file')
        if existing.type == pafs.FileType.Directory and not self.replace and self.filesystem.get_file_info(
                pafs.FileSelector(self.root, recursive=False)):
            raise FileExistsError(f'cannot write a dataset to {self.url}: the directory is not empty '
                                  f"(pass mode='overwrite' to replace it)")
        self._created_root = existing.type == pafs.FileType.NotFound
        self.filesystem.create_dir(self.staging, recursive=True)

    def file_roller(self, arrow_schema: pa.Schema, row_group_bytes: int, file_bytes: int,
                    compression: str | None) -> FileRoller:
        """A :class:`FileRoller` writing into the staging directory."""
        return FileRoller(self.filesystem, self.staging, arrow_schema, row_group_bytes, file_bytes, compression)

    def commit(self, schema: Unischema, row_groups: Mapping[str, list[int]], *, legacy_metadata: bool,
               summary: Mapping[str, pq.FileMetaData] | None = None) -> None:
        """Move the staged files into place (replacing the target's contents if asked), then write the metadata.

        Args:
            schema: the schema the files follow.
            row_groups: ``{staged file name: [rows of each row group]}`` of every file of the dataset.
            legacy_metadata: also store Petastorm's pickled schema entry (see :func:`write_dataset`).
            summary: the files' footers by name, to write as the ``_metadata`` summary (None: none).

        Raises:
            OSError, pyarrow.ArrowException: the storage failed; call :meth:`roll_back` (or commit inside
                :meth:`rolling_back_on_error`).
        """
        fs = self.filesystem
        if self.replace:
            for info in fs.get_file_info(pafs.FileSelector(self.root, recursive=False)):
                if info.path.rstrip('/') == self.staging:
                    continue
                if info.type == pafs.FileType.Directory:
                    fs.delete_dir(info.path)
                else:
                    fs.delete_file(info.path)
        for name in row_groups:
            move_file(fs, posixpath.join(self.staging, name), posixpath.join(self.root, name))
            self._moved.append(name)
        remove_dir(fs, self.staging)
        if summary:
            write_summary(fs, self.root, summary)
        write_dataset_metadata(fs, self.root, schema, dict(row_groups), legacy_metadata=legacy_metadata)

    def roll_back(self) -> None:
        """Remove the staging directory, the files already moved into place and a target the write created.

        Failures to remove are logged, not raised: the write already failed.
        """
        _remove_quietly(self.filesystem, self.staging)
        for name in self._moved:
            _remove_quietly(self.filesystem, posixpath.join(self.root, name))
        self._moved = []
        if self._created_root:
            _remove_quietly(self.filesystem, self.root)

    @contextlib.contextmanager
    def rolling_back_on_error(self) -> Iterator[None]:
        """Roll the write back when the ``with`` block raises, then re-raise.

        Raises:
            DatasetWriteError: the block raised a storage error (``OSError`` other than ``FileExistsError``, or
                a pyarrow error), chained as the cause; other exceptions are re-raised as they are.
        """
        try:
            yield
        except BaseException as err:
            self.roll_back()
            if isinstance(err, (OSError, pa.ArrowException)) and not isinstance(err, FileExistsError):
                raise DatasetWriteError(f'writing the dataset {self.url} failed and was rolled back: {err}') from err
            raise


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)
    except OSError:
        logger.warning('could not remove %s after a failed write', path, exc_info=True)
