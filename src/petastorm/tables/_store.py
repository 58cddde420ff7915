"""One version of a table as a store: its data files and planned row groups, and its answers to the store interface.

A :class:`TableStore` is a :class:`~petastorm.store.model.ParquetStore` whose files are those of one table version
(never a listing of the directory), whose partition columns and statistics come from the log, and whose row-group
pieces were planned when it was opened (each carrying a :class:`~petastorm.tables.read.TableRowGroup`, whose rows
the version may have deleted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa

from petastorm.store.model import FilterStatistics, ParquetStore, StoreSchema
from petastorm.store.pieces import RowGroupPiece
from petastorm.tables._model import TableFile, TableVersion
from petastorm.tables._pruning import matching_guarantees, row_group_guarantee
from petastorm.tables.read import TableRowGroup

__all__ = ['TableStore']


@dataclass(frozen=True)
class TableStore(ParquetStore):
    """One version of a table, with its data files and planned row groups.

    Attributes:
        version: which version this is.
        arrow_schema: the table's logical schema (partition columns included, in the table's order).
        table_partitions: the partition columns whose values the log gives per file.
        pieces: every live row group, in piece order (sorted path, then row group).
        table_files: the data files, by path.
        file_guarantees: by data file, what the log's statistics say every row of it satisfies (a
            ``pyarrow.compute.Expression``), for pruning by ``filters``.
        footers: the Parquet footers of the data files, by path (row-group statistics, for pruning).
        deleted_rows: rows the version deletes from its data files (deletion vectors, delete files).
        delete_files: delete files of the version (Iceberg), for inspection.
        features: table features in use, for inspection.
    """

    version: TableVersion = field(default_factory=lambda: TableVersion('delta', None))
    arrow_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    table_partitions: tuple[str, ...] = ()
    pieces: tuple[RowGroupPiece, ...] = ()
    table_files: dict[str, TableFile] = field(default_factory=dict)
    file_guarantees: dict[str, Any] = field(default_factory=dict)
    footers: dict[str, Any] = field(default_factory=dict)
    deleted_rows: int = 0
    delete_files: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

    @property
    def partition_names(self) -> list[str]:
        """The partition columns the log gives values of (never taken from directory names)."""
        return list(self.table_partitions)

    def row_groups(self) -> list[RowGroupPiece]:
        """The live row groups of the version, as its log planned them."""
        return list(self.pieces)

    def logical_schema(self) -> StoreSchema:
        """The table's logical schema (partition columns typed as the table says)."""
        return StoreSchema(self.arrow_schema, {})

    def column_names(self) -> set[str]:
        """The columns of the version's schema."""
        return set(self.arrow_schema.names)

    def filter_statistics(self, expression: Any, whole: bool = True) -> FilterStatistics:
        """The live row groups whose partition values and statistics (the log's, the footers') may match.

        Which of them match in every row is left undecided (an empty set): the rows a version deleted are not in the
        footers' statistics, so ``len()`` of a filtered table reader needs ``count_rows=True``.
        """
        schema = pa.schema([pa.field(f.name, f.type) for f in self.arrow_schema])
        types = {f.name: f.type for f in schema}
        guarantees = [row_group_guarantee(cast(TableRowGroup, piece.logical), piece.row_group,
                                          self.file_guarantees.get(piece.path), self.footers.get(piece.path), types)
                      for piece in self.pieces]
        kept = matching_guarantees(guarantees, schema, expression, self.url)
        return FilterStatistics(frozenset((self.pieces[i].path, self.pieces[i].row_group) for i in kept), frozenset())

    def deleted_rows_by_file(self) -> dict[str, int]:
        """The rows the version deleted from each data file (deletion vectors, delete files)."""
        return {path: file.deleted_rows for path, file in self.table_files.items()}

    def version_key(self) -> tuple[str, int | None]:
        """``(format, version)``: a position saved on another version names other rows."""
        return self.version.format, self.version.version

    def describe_version(self) -> dict[str, Any]:
        """The version, its features, its live and deleted rows and its delete files."""
        version = self.version
        return {'format': version.format, 'version': version.version, 'timestamp_ms': version.timestamp_ms,
                'features': list(self.features), 'live_rows': sum(p.num_rows for p in self.pieces),
                'deleted_rows': self.deleted_rows, 'delete_files': list(self.delete_files)}

    def metadata_source(self) -> str | None:
        """Where the table keeps our schema: its properties (at its version), or None."""
        return self.metadata_path
