"""Writing a Petastorm dataset into a Delta table as one commit: a new table, an append, or an overwrite.

:class:`DeltaWrite` is :func:`petastorm.write_dataset`'s target when it writes a Delta table: the Parquet files
are written by our writer (row groups and codecs as for any Petastorm dataset) into the table's directory, where
no reader sees them until the log names them; one commit of delta-rs then adds them all (with their statistics,
so readers can skip files by ``filters``), or replaces every file of the table with them (``overwrite``). If
anything fails before that commit, the files written are removed and the table stays at its last version. The
Unischema is kept in the table's properties (``petastorm.unischema.json``), so ``make_reader`` reads the table
as the Petastorm dataset it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from petastorm._describe import display_url
from petastorm._optional import import_optional
from petastorm.errors import DatasetWriteError, SchemaError
from petastorm.fs.settings import delta_storage_options
from petastorm.metadata.schema_json import unischema_from_json, unischema_to_json
from petastorm.store.listing import DELTA_LOG
from petastorm.tables.delta import UNISCHEMA_PROPERTY, delta_uri
from petastorm.unischema import Unischema

__all__ = ['DeltaWrite', 'file_stats']

logger = logging.getLogger(__name__)


def _json_value(value: Any) -> Any:
    if hasattr(value, 'isoformat'):
        return value.isoformat()
    if isinstance(value, bytes):
        return None  # binary bounds are not kept in Delta statistics
    return value


def file_stats(metadata: pq.FileMetaData) -> str:
    """The Delta ``stats`` JSON of a Parquet file from its footer: rows, and bounds and nulls of flat columns."""
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for j in range(metadata.num_columns):
        name = metadata.row_group(0).column(j).path_in_schema if metadata.num_row_groups else None
        if name is None or '.' in name:
            continue  # nested columns (lists) have no statistics in the log
        lows, highs, null_count, complete = [], [], 0, True
        for i in range(metadata.num_row_groups):
            statistics = metadata.row_group(i).column(j).statistics
            if statistics is None or not statistics.has_null_count:
                complete = False
                break
            null_count += statistics.null_count
            if statistics.has_min_max:
                lows.append(statistics.min)
                highs.append(statistics.max)
        if not complete:
            continue
        nulls[name] = null_count
        if lows and _json_value(min(lows)) is not None:
            minimum[name], maximum[name] = _json_value(min(lows)), _json_value(max(highs))
    return json.dumps({'numRecords': metadata.num_rows, 'minValues': minimum, 'maxValues': maximum,
                       'nullCount': nulls})


class DeltaWrite:
    """A write of a Petastorm dataset into the Delta table at ``root``, committed as one version or not at all.

    It has the interface of :class:`petastorm.writing.StagedWrite` (:meth:`begin`, :meth:`commit`,
    :meth:`roll_back`, :meth:`rolling_back_on_error`), except that the files are written straight into
    :attr:`root` by a roller the writer makes and hands to :meth:`track`.

    Args:
        dataset_url: the table's URL.
        filesystem: its filesystem (the data files are written through it).
        root: the table's directory on ``filesystem``.
        schema: the Unischema of the rows.
        mode: ``'error'`` (the table must not exist), ``'append'`` (create it or add to it) or ``'overwrite'``
            (create it or replace its rows in a new version; older versions keep theirs).
        storage_options: the writer's storage options (translated for delta-rs).
    """

    def __init__(self, dataset_url: str, filesystem: pafs.FileSystem, root: str, schema: Unischema, mode: str,
                 storage_options: dict[str, Any] | None) -> None:
        self.url = dataset_url
        self.filesystem = filesystem
        self.root = root
        self.schema = schema
        self.mode = mode
        self._options = delta_storage_options(dataset_url, storage_options)
        self._table: Any = None
        self._roller: Any = None
        self._created = False
        self._schema_property = unischema_to_json(schema)

    def begin(self) -> None:
        """Check the target: an existing table must hold this schema, a directory that is not a table be empty.

        Raises:
            FileExistsError: the table exists and ``mode='error'``, or the directory holds other files.
            SchemaError: the table's columns, partitioning or stored Unischema differ from the schema written.
        """
        deltalake = import_optional('deltalake', 'writing a Delta table')
        fs = self.filesystem
        is_table = fs.get_file_info(posixpath.join(self.root, DELTA_LOG)).type == pafs.FileType.Directory
        if not is_table:
            info = fs.get_file_info(self.root)
            if info.type == pafs.FileType.File or (info.type == pafs.FileType.Directory and fs.get_file_info(
                    pafs.FileSelector(self.root))):
                raise FileExistsError(f'cannot write a Delta table to {display_url(self.url)}: it exists and is not '
                                      f'a Delta table')
            fs.create_dir(self.root, recursive=True)
            return
        if self.mode == 'error':
            raise FileExistsError(f'the Delta table {display_url(self.url)} exists: pass mode=\'append\' to add '
                                  f"rows to it or mode='overwrite' to replace them")
        self._table = deltalake.DeltaTable(delta_uri(self.url), storage_options=self._options)
        self._check_table()

    def _check_table(self) -> None:
        table = self._table
        metadata = table.metadata()
        if metadata.partition_columns:
            raise SchemaError(f'the Delta table {display_url(self.url)} is partitioned by '
                              f'{metadata.partition_columns}; write_dataset writes unpartitioned tables only')
        existing = pa.schema(table.schema().to_arrow())
        wanted = self.schema.as_pyarrow_schema()
        ours = [(f.name, f.type) for f in wanted]
        theirs = [(f.name, _plain_type(f.type)) for f in existing]
        if ours != theirs:
            raise SchemaError(f'the columns of the Delta table {display_url(self.url)} ({theirs}) are not those of '
                              f'the schema {self.schema._name} ({ours})')
        stored = (metadata.configuration or {}).get(UNISCHEMA_PROPERTY)
        if stored and unischema_from_json(stored, UNISCHEMA_PROPERTY) != self.schema:
            raise SchemaError(f'the Delta table {display_url(self.url)} holds another Unischema '
                              f'({unischema_from_json(stored, UNISCHEMA_PROPERTY)}) than the one written '
                              f'({self.schema})')

    def track(self, roller: Any) -> None:
        """Remember the :class:`petastorm.writing.FileRoller` writing into :attr:`root`, to roll its files back."""
        self._roller = roller

    def commit(self, schema: Unischema, row_groups: Mapping[str, list[int]], *, legacy_metadata: bool) -> None:
        """Commit the files written as one new version of the table (its first, for a new table).

        Raises:
            DatasetWriteError: delta-rs refused the commit (another writer committed a conflicting version...).
        """
        del legacy_metadata  # the schema lives in the table's properties, as JSON only
        deltalake = import_optional('deltalake', 'writing a Delta table')
        from deltalake.transaction import AddAction

        now = int(time.time() * 1000)
        actions = []
        for name in row_groups:
            path = posixpath.join(self.root, name)
            with self.filesystem.open_input_file(path) as f:
                size = f.size()
                metadata = pq.read_metadata(f)
            actions.append(AddAction(name, size, {}, now, True, file_stats(metadata)))
        arrow_schema = schema.as_pyarrow_schema()
        try:
            table = self._table
            if table is None:
                # Version 0 holds the schema and our property (delta-rs takes properties it does not know only
                # there); the rows come in the next commit, and a failure before it removes the whole table.
                table = deltalake.DeltaTable.create(
                    delta_uri(self.url), deltalake.Schema.from_arrow(arrow_schema), mode='error', name=schema._name,
                    configuration={UNISCHEMA_PROPERTY: self._schema_property}, storage_options=self._options,
                    raise_if_key_not_exists=False)
                self._created = True
            elif not (table.metadata().configuration or {}).get(UNISCHEMA_PROPERTY):
                # A table another tool made: its properties get the schema first (a commit of its own).
                table.alter.set_table_properties({UNISCHEMA_PROPERTY: self._schema_property},
                                                 raise_if_not_exists=False)
            table.create_write_transaction(actions, mode='overwrite' if self.mode == 'overwrite' else 'append',
                                           schema=arrow_schema)
        except (deltalake.exceptions.DeltaError, OSError) as err:
            raise DatasetWriteError(f'the commit to the Delta table {display_url(self.url)} failed: '
                                    f'{str(err).splitlines()[0] if str(err) else type(err).__name__}') from err

    def roll_back(self) -> None:
        """Remove the data files written (the table never named them); never raises."""
        names = list(self._roller.row_groups) if self._roller is not None else []
        for name in names:
            path = posixpath.join(self.root, name)
            try:
                if self.filesystem.get_file_info(path).type == pafs.FileType.File:
                    self.filesystem.delete_file(path)
            except OSError:
                logger.warning('could not remove %s after a failed write', path, exc_info=True)
        if self._table is None:  # a table this write made (or would have made): nothing of it stays
            with contextlib.suppress(OSError):
                log = posixpath.join(self.root, DELTA_LOG)
                if self._created and self.filesystem.get_file_info(log).type == pafs.FileType.Directory:
                    self.filesystem.delete_dir(log)
                if not self.filesystem.get_file_info(pafs.FileSelector(self.root)):
                    self.filesystem.delete_dir(self.root)

    @contextlib.contextmanager
    def rolling_back_on_error(self) -> Iterator[None]:
        """Roll the write back when the ``with`` block raises, then re-raise (storage errors as DatasetWriteError)."""
        try:
            yield
        except BaseException as err:
            self.roll_back()
            if isinstance(err, (OSError, pa.ArrowException)) and not isinstance(err, (FileExistsError,
                                                                                      DatasetWriteError)):
                raise DatasetWriteError(f'writing the Delta table {display_url(self.url)} failed and was rolled '
                                        f'back (the table is at its last version): {err}') from err
            raise


def _plain_type(arrow_type: pa.DataType) -> pa.DataType:
    """delta-rs's Arrow types as ours: view and large strings are plain ones."""
    from petastorm.tables._files import normalized_type

    return normalized_type(arrow_type)
