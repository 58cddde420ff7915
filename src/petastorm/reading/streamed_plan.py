"""A reader's first batch before its whole plan: the row groups of a plain store planned as its footers come.

A plain Parquet store without a ``_metadata`` summary (or our row-group map, or a shared plan) learns its row
groups from one footer per data file. A reader that waited for all of them would wait about
``files / 64`` round trips before its first batch (9 s for 10,000 files at 10 ms), where ``pyarrow.dataset``
waits for the first file's. When the order of the first epoch does not depend on the row groups not yet known,
:class:`StreamedPlan` lets the reader start at once: a :class:`~petastorm.store.footer_stream.FooterStream` reads
the footers in listing order behind the reader, the first epoch's items are made as they arrive
(:func:`petastorm.plan.streamed_first_epoch`), and whatever needs every row group (``len()``, a saved position,
the epochs after the first) waits, when it is asked, for the plan :func:`petastorm.reading.setup.set_up_reader`
would have made up front: the same layout, the same seeded order, the same positions.

:func:`can_stream` says when that holds. What waits for every footer before the first batch, and why:

* ``shuffle_row_groups=True`` (the default): a seeded permutation of every row group needs their number;
* ``shard_mode='rows'`` with shards: equal shares of the rows need their total;
* ``filters`` (pruned with every footer's statistics), a ``rowgroup_selector``, a ``predicate`` on partition
  fields only (both decided for every row group when planning), ``count_rows=True`` (reads them all),
  ``categorical_codes`` (categories not given are read from every row group);
* an NGram, a process pool (its workers receive every row group once, when they start), a reader cache,
  ``plan_file=`` or a ``torch.distributed`` job (they share one whole plan: :mod:`petastorm.reading.job_plan`);
* a store whose metadata gives the row groups already (they cost no footer).

A store without Petastorm metadata has its schema inferred from its files' footers, their schemas unified. Such a
store is streamed only when it has more files than one round of footer reads (16 from local disk, 64 from remote
storage), which plans in one round trip anyway and keeps its unified schema; a larger one streamed takes the
first file's schema, and every later file is checked against it as its footer arrives: a file whose schema differs
raises :class:`SchemaError` (its files are unified only when the plan is made whole, before the first batch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from petastorm.errors import SchemaError
from petastorm.metadata.schemas import has_petastorm_metadata
from petastorm.ngram import NGram
from petastorm.plan import RowMatches, ScheduledItem, ShardLayout, ShardSpec, Stage, streamed_first_epoch
from petastorm.reading.options import ReaderOptions
from petastorm.store import keys
from petastorm.store.footer_stream import FooterStream, FooterStreamStopped
from petastorm.store.footers import footer_threads
from petastorm.store.model import ParquetStore
from petastorm.store.pieces import RowGroupPiece
from petastorm.store.plain import PlainStore
from petastorm.store.unify import UnifiedSchema, unify_file_schemas

__all__ = ['PlannedEpochs', 'StreamedPlan', 'StreamedUnits', 'can_stream']


@dataclass(frozen=True)
class PlannedEpochs:
    """What planning a read decides once every row group is known (see :class:`petastorm.reading.ReaderSetup`)."""

    layout: ShardLayout
    rows_known: bool
    row_matches: RowMatches | None = None


def can_stream(options: ReaderOptions, dataset: ParquetStore) -> bool:
    """Whether a reader of ``options`` can read ``dataset``'s first rows before every footer (module docstring)."""
    shard = options.shard
    return (isinstance(dataset, PlainStore) and bool(dataset.files) and _plans_from_footers(dataset)
            and not options.shuffle_row_groups and not (shard.mode == 'rows' and shard.sharded)
            and shard.count <= len(dataset.files) and options.filters is None and options.rowgroup_selector is None
            and not options.count_rows and options.categorical_codes is False
            and not isinstance(options.schema_fields, NGram)
            and options.reader_pool_type in ('thread', 'dummy') and options.cache_type in (None, 'null')
            and options.plan_file is None and not _partition_predicate(options, dataset)
            and (has_petastorm_metadata(dataset) or len(dataset.files) > footer_threads(dataset.filesystem)))


def _plans_from_footers(dataset: ParquetStore) -> bool:
    """Nothing gave the row groups: no shared plan, no footers read, no row-group map, no summary."""
    reads = dataset.reads
    if reads.row_counts is not None or reads.footers is not None or reads.footer_stream is not None:
        return False
    if keys.ROW_GROUPS_JSON_KEY in dataset.metadata_kv or keys.ROW_GROUPS_PER_FILE_KEY in dataset.metadata_kv:
        return False
    # A summary is looked for only where the listing saw one (or could not tell).
    return dataset.metadata_path is None or dataset.root is None or dataset.has_summary is False


def _partition_predicate(options: ReaderOptions, dataset: ParquetStore) -> bool:
    if options.predicate is None:
        return False
    names = set(options.predicate.get_fields())
    return bool(names) and names <= set(dataset.partition_names)


class StreamedPlan:
    """The row groups of a plain store as its footers arrive, and the plan made once all have (module docstring).

    Args:
        dataset: the store (plain Parquet, planned from its footers).
        shard: this reader's shard.
        seed: the seed of the layout (drawn already for an unseeded reader).
        drop_partitions: ``shuffle_row_drop_partitions``.
    """

    def __init__(self, dataset: PlainStore, shard: ShardSpec, seed: int, drop_partitions: int) -> None:
        self._dataset = dataset
        self._shard, self._seed, self._drop_partitions = shard, seed, drop_partitions
        self._stream = FooterStream(dataset)
        #: every row group found so far, in piece order: the workers' pieces (grows; never reordered).
        self.pieces: list[RowGroupPiece] = []
        self._file_starts: list[int] = []  # the index of each taken file's first piece
        self._check_schemas = not has_petastorm_metadata(dataset)
        self._first_schema: Any = None
        self._taking = threading.Lock()
        self._planning = threading.Lock()
        self._finish: Callable[[], PlannedEpochs] | None = None
        self._planned: PlannedEpochs | None = None

    def start(self) -> StreamedPlan:
        """Start reading the footers; the store's schema, when inferred, is the first file's (module docstring)."""
        self._stream.start()
        if self._check_schemas and self._dataset.reads.unified is None:
            self._dataset.reads.unified = UnifiedSchema(self._stream.footer(0).schema.to_arrow_schema())
        return self

    def finish_with(self, finish: Callable[[], PlannedEpochs]) -> None:
        """What makes the plan once every row group is known (called once, by :meth:`planned`)."""
        self._finish = finish

    def first_stage(self, head_rows: int) -> StreamedUnits:
        """The scheduled items of ``Stage(0)`` as they come (see :class:`StreamedUnits`)."""
        return StreamedUnits(self, head_rows)

    def piece_rows(self) -> Iterator[tuple[int, int]]:
        """``(piece index, rows)`` of every row group in piece order, waiting for each file's footer."""
        for file_index in range(len(self._stream)):
            start, stop = self._take(file_index)
            for index in range(start, stop):
                yield index, self.pieces[index].num_rows

    def all_pieces(self) -> list[RowGroupPiece]:
        """Every row group of the store, once every footer is read (checked, as each is)."""
        self._take(len(self._stream) - 1)
        return self.pieces

    def planned(self) -> PlannedEpochs:
        """The plan of every row group (waits for every footer; made once)."""
        with self._planning:
            if self._planned is None:
                if self._finish is None:
                    raise RuntimeError('StreamedPlan.planned() before finish_with()')
                self._planned = self._finish()
            return self._planned

    def stop(self) -> None:
        """Stop reading footers (non-blocking)."""
        self._stream.stop()

    def join(self) -> None:
        """Wait for the footer stream's thread (stopped first if still reading)."""
        self._stream.join()

    def _take(self, file_index: int) -> tuple[int, int]:
        """The piece indexes ``[start, stop)`` of data file ``file_index``, taking every file up to it first."""
        with self._taking:
            while len(self._file_starts) <= file_index:
                taken = len(self._file_starts)
                path = self._dataset.files[taken]
                footer = self._stream.footer(taken)
                self._check_schema(path, footer)
                self._file_starts.append(len(self.pieces))
                counts = [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
                self.pieces.extend(self._dataset.file_pieces(path, counts))
            start = self._file_starts[file_index]
            stop = self._file_starts[file_index + 1] if file_index + 1 < len(self._file_starts) else len(self.pieces)
            return start, stop

    def _check_schema(self, path: str, footer: Any) -> None:
        """A store whose schema was inferred from its first file: this file must have the same schema."""
        if not self._check_schemas:
            return
        if self._first_schema is None:
            self._first_schema = footer.schema
            return
        if footer.schema.equals(self._first_schema):
            return
        first = self._dataset.files[0]
        unified = unify_file_schemas({first: self._first_schema.to_arrow_schema(),
                                      path: footer.schema.to_arrow_schema()})
        if unified.differs:
            dataset = self._dataset
            raise SchemaError(
                f'{dataset.url_of(path)} has another schema than {dataset.url_of(first)} ({unified.describe()}). '
                f'This reader took the first data file\'s schema as the store\'s to read its first rows before every '
                f'footer was read (shuffle_row_groups=False); the schemas of files that differ are unified only when '
                f'the whole store is planned first. Read it with shuffle_row_groups=True, or write a _metadata '
                f'summary: petastorm-generate-metadata.py --dataset_url {dataset.url}')


class StreamedUnits(Sequence[ScheduledItem]):
    """The scheduled items of a fresh first epoch, handed out as the row groups come (a reader's streamed stage).

    :meth:`stream` gives them in reading order, each as soon as its row group is known. As a sequence, the items
    handed out so far are there at once; its length and the rest wait for the whole plan, whose
    ``layout.units(Stage(0))`` they equal (what a saved position is computed from).
    """

    def __init__(self, plan: StreamedPlan, head_rows: int) -> None:
        self._plan = plan
        self._head_rows = head_rows
        self._handed: list[ScheduledItem] = []
        self._whole: list[ScheduledItem] | None = None
        #: the stream ended because the reader was stopped (not every item was handed out).
        self.stopped = False

    def stream(self) -> Iterator[ScheduledItem]:
        """The items in reading order, each when its row group is known (until the reader is stopped)."""
        plan = self._plan
        units = streamed_first_epoch(plan.piece_rows(), plan._shard, seed=plan._seed,
                                     drop_partitions=plan._drop_partitions, head_rows=self._head_rows)
        while True:
            try:
                unit = next(units)
            except StopIteration:
                return
            except FooterStreamStopped:
                self.stopped = True
                return
            self._handed.append(unit)
            yield unit

    def _all(self) -> list[ScheduledItem]:
        if self._whole is None:
            self._whole = self._plan.planned().layout.units(Stage(0), self._head_rows)[0]
        return self._whole

    @overload
    def __getitem__(self, index: int) -> ScheduledItem: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ScheduledItem]: ...

    def __getitem__(self, index: int | slice) -> ScheduledItem | Sequence[ScheduledItem]:
        if isinstance(index, int) and 0 <= index < len(self._handed):
            return self._handed[index]
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[ScheduledItem]:
        return iter(self._all())
