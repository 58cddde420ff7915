"""Writing a dataset's metadata files: ``_common_metadata`` and the ``_metadata`` summary.

``_common_metadata`` holds the schema and row-group map that turn a Parquet store into a dataset; the summary
holds every row group's footer. Used by every writer: the Spark-free :func:`petastorm.write_dataset`, Spark's
``materialize_dataset`` and ``petastorm-generate-metadata.py``. The
metadata file is written last and atomically (a temporary file renamed into place), so a store without it is
never mistaken for a complete dataset.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm.errors import PetastormMetadataGenerationError
from petastorm.fs._files import move_file
from petastorm.metadata.legacy_write import LegacySchemaError, unischema_to_legacy_pickle
from petastorm.metadata.schema_json import unischema_to_json
from petastorm.store import keys
from petastorm.store.footers import footer_row_counts
from petastorm.store.listing import COMMON_METADATA, SUMMARY_METADATA, list_data_files
from petastorm.unischema import Unischema

__all__ = ['replace_file', 'update_common_metadata', 'write_dataset_metadata', 'write_summary']

logger = logging.getLogger(__name__)


def _base_arrow_schema(filesystem: pafs.FileSystem, root: str, data_files: list[str]) -> pa.Schema:
    for name in (COMMON_METADATA, SUMMARY_METADATA):
        path = posixpath.join(root, name)
        if filesystem.get_file_info(path).type == pafs.FileType.File:
            with filesystem.open_input_file(path) as f:
                return pq.read_schema(f)
    with filesystem.open_input_file(data_files[0]) as f:
        return pq.read_schema(f)


def update_common_metadata(filesystem: pafs.FileSystem, root: str, updates: Mapping[bytes, bytes | None],
                           data_files: list[str] | None = None) -> None:
    """Merge ``updates`` into the key-value metadata of ``root/_common_metadata`` (created if missing).

    A key whose value is ``None`` is removed.

    The Arrow schema comes from the existing ``_common_metadata``, else ``_metadata``, else the first data file.
    """
    data_files = data_files if data_files is not None else list_data_files(filesystem, root)
    if not data_files and filesystem.get_file_info(posixpath.join(root, COMMON_METADATA)).type != \
            pafs.FileType.File:
        raise PetastormMetadataGenerationError(f'no Parquet data files were found under {root}: nothing was '
                                               f'written, so there is no dataset to describe')
    schema = _base_arrow_schema(filesystem, root, data_files)
    merged = dict(schema.metadata or {})
    for key, value in updates.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    schema = schema.with_metadata(merged)
    replace_file(filesystem, posixpath.join(root, COMMON_METADATA), lambda out: pq.write_metadata(schema, out))


def write_summary(filesystem: pafs.FileSystem, root: str, footers: Mapping[str, pq.FileMetaData]) -> None:
    """Write ``root/_metadata``: every file's row groups in one footer, each tagged with its file's path.

    Args:
        filesystem: where the dataset lives.
        root: dataset directory.
        footers: each data file's footer by its path relative to ``root`` (the footers are tagged in place).

    Raises:
        PetastormMetadataGenerationError: a file's Parquet schema differs from those before it (in path order).
    """
    summary: pq.FileMetaData | None = None
    for name in sorted(footers):
        footer = footers[name]
        footer.set_file_path(name)
        if summary is None:
            summary = footer
            continue
        try:
            summary.append_row_groups(footer)
        except (RuntimeError, pa.ArrowException) as err:
            raise PetastormMetadataGenerationError(
                f'cannot write a _metadata summary for {root}: {name} has a different Parquet schema than the '
                f'files before it ({err}): a summary describes files of one schema.') from err
    if summary is not None:
        replace_file(filesystem, posixpath.join(root, SUMMARY_METADATA), summary.write_metadata_file)


def replace_file(filesystem: pafs.FileSystem, target: str, write: Callable[[Any], None]) -> None:
    """Write ``target`` through a temporary sibling moved into place, then drop Hadoop's stale checksum of it.

    Readers never see a half-written metadata file: the target is the old one or the new one.
    """
    directory, name = posixpath.split(target)
    temporary = posixpath.join(directory, f'.{name}.{uuid.uuid4().hex}.tmp')
    try:
        with filesystem.open_output_stream(temporary) as out:
            write(out)
        move_file(filesystem, temporary, target)
    finally:
        if filesystem.get_file_info(temporary).type == pafs.FileType.File:
            filesystem.delete_file(temporary)
    crc = posixpath.join(directory, f'.{name}.crc')  # Spark's (Hadoop's) checksum of the file replaced
    if filesystem.get_file_info(crc).type == pafs.FileType.File:
        filesystem.delete_file(crc)


def write_dataset_metadata(filesystem: pafs.FileSystem, root: str, schema: Unischema,
                           row_groups: dict[str, list[int]] | None = None, *,
                           legacy_metadata: bool = True) -> dict[str, list[int]]:
    """Write the schema and the row-group map of the dataset at ``root``.

    Args:
        filesystem: where the dataset lives.
        root: dataset directory.
        schema: the Unischema of the stored fields.
        row_groups: ``{relative file path: [rows of each row group]}`` when the writer knows it; otherwise the
            footers of the data files are read (in parallel).
        legacy_metadata: also store the schema as Petastorm's pickled ``dataset-toolkit.unischema.v1`` so that
            Petastorm releases can open the dataset. Skipped with a warning when the schema holds something
            Petastorm cannot express (e.g. a custom codec). ``False`` writes (and leaves) no such entry.

    Returns:
        The row-group map that was stored.

    Raises:
        PetastormMetadataGenerationError: the directory holds no data files.
    """
    data_files = list_data_files(filesystem, root)
    if not data_files:
        raise PetastormMetadataGenerationError(f'no Parquet data files were found under {root}: the write produced '
                                               f'no files, so no dataset metadata was written')
    if row_groups is None:
        counts = footer_row_counts(filesystem, data_files)
        row_groups = {posixpath.relpath(p, root): c for p, c in counts.items()}
    updates: dict[bytes, bytes | None] = {
        keys.SCHEMA_JSON_KEY: unischema_to_json(schema).encode(),
        keys.ROW_GROUPS_JSON_KEY: json.dumps({'format_version': keys.ROW_GROUPS_FORMAT_VERSION,
                                              'files': row_groups}, sort_keys=True).encode(),
        keys.ROW_GROUPS_PER_FILE_KEY: json.dumps({k: len(v) for k, v in row_groups.items()}, sort_keys=True).encode(),
    }
    updates[keys.UNISCHEMA_KEY] = None  # never leave a stale pickled schema next to the new one
    if legacy_metadata:
        try:
            updates[keys.UNISCHEMA_KEY] = unischema_to_legacy_pickle(schema)
        except LegacySchemaError as err:
            logger.warning('not writing the Petastorm 0.x schema entry %s (Petastorm releases will not open this '
                           'dataset): %s', keys.UNISCHEMA_KEY.decode(), err)
    update_common_metadata(filesystem, root, updates, data_files)
    return row_groups
