"""A plain store's planning saved as bytes: what its footers told, for other ranks, other processes, later runs.

Planning a plain store without a ``_metadata`` summary reads every data file's footer: the rows of each row group
and each file's schema (unified into one). That is the whole cost of planning on an object store (a request or two
per file), and every rank of a job, every process of a node and every run of a job would pay it again for the
same answer. :func:`encode_plan` writes that answer once, with the listing it was made from; :func:`adopt_plan`
gives it to a store opened elsewhere, so that its readers plan without reading a footer, as long as the store's
listing is the one the plan was made from (same names, sizes and modification times): a file added, removed or
rewritten makes the plan stale, and it is not used.

The bytes are an Arrow IPC stream, never a pickle: one row per data file (its path relative to the store's
directory, size, modification time and row counts of its row groups) and, in the schema's metadata, the format
version, a digest of the listing and the unified schema with the files that differ from it. 100,000 files of 10
row groups take about 12 MB. When the footers were read for the plan and all of them take at most
:data:`FOOTER_BUDGET` bytes, they come along too (each file's Parquet metadata): a rank then opens the files of its
share without asking for their footers again.

Who shares the bytes (``torch.distributed``, the local disk cache, a plan file) is the reader's choice
(:mod:`petastorm.reading.job_plan`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from petastorm.errors import PetastormMetadataError
from petastorm.store.footers import metadata_row_counts, store_footer_row_counts
from petastorm.store.model import ParquetStore
from petastorm.store.unify import SchemaChange, UnifiedSchema

__all__ = [
    'FOOTER_BUDGET', 'PLAN_FORMAT_VERSION', 'PlanMismatch', 'adopt_footers', 'adopt_plan', 'encode_footers',
    'encode_plan', 'listing_digest',
]

PLAN_FORMAT_VERSION = 1
#: the most bytes of footers a plan carries (beyond, each reader reads the footers of the files it opens).
FOOTER_BUDGET = 16 << 20
_VERSION_KEY = b'petastorm.plan.format_version'
_LISTING_KEY = b'petastorm.plan.listing'
_SCHEMA_KEY = b'petastorm.plan.unified_schema'
_CHANGES_KEY = b'petastorm.plan.schema_changes'
_FILE_COLUMNS_KEY = b'petastorm.plan.file_columns'


class PlanMismatch(PetastormMetadataError):
    """The saved plan was made from another listing of the store (files added, removed or rewritten since)."""


def listing_digest(store: ParquetStore) -> str:
    """A digest of the store's listing: every data file's relative path, size and modification time."""
    digest = hashlib.sha256()
    for path in store.files:
        digest.update(f'{store.relpath(path)}\0{store.file_sizes.get(path)}\0{store.file_mtimes.get(path)}\n'
                      .encode())
    return digest.hexdigest()


def encode_plan(store: ParquetStore) -> bytes:
    """The store's plan as bytes: the row counts of every row group and, when it was made, the unified schema.

    The footers are read here when the metadata does not give the row counts (once per store: see
    :mod:`petastorm.store.footers`).
    """
    counts = store.reads.row_counts or metadata_row_counts(store) or store_footer_row_counts(store)
    files = list(store.files)
    table = pa.table({
        'path': pa.array([store.relpath(path) for path in files], pa.string()),
        'size': pa.array([store.file_sizes.get(path) for path in files], pa.int64()),
        'mtime_ns': pa.array([store.file_mtimes.get(path) for path in files], pa.int64()),
        'row_counts': pa.array([counts[path] for path in files], pa.list_(pa.int64())),
    })
    footers = _footer_bytes(store, files)
    if footers is not None:
        table = table.append_column('footer', pa.array(footers, pa.binary()))
    metadata = {_VERSION_KEY: str(PLAN_FORMAT_VERSION).encode(), _LISTING_KEY: listing_digest(store).encode()}
    unified = store.reads.unified
    if unified is not None:
        metadata[_SCHEMA_KEY] = unified.schema.serialize().to_pybytes()
        changes = pa.schema([pa.field(json.dumps([store.relpath(c.path), c.column]), c.stored or pa.null())
                             for c in unified.changes])
        metadata[_CHANGES_KEY] = changes.serialize().to_pybytes()
        metadata[_FILE_COLUMNS_KEY] = json.dumps({store.relpath(path): list(columns)
                                                  for path, columns in unified.file_columns.items()}).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema.with_metadata(metadata)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _footer_bytes(store: ParquetStore, files: list[str]) -> list[bytes] | None:
    """Each file's footer as Parquet metadata bytes, when planning read them and they fit :data:`FOOTER_BUDGET`."""
    footers = store.reads.footers
    if footers is None:
        return None
    given = store.reads.footer_bytes or {}
    out: list[bytes] = []
    total = 0
    for path in files:
        data = given.get(path)
        out.append(data if data is not None else _metadata_bytes(footers[path]))
        total += len(out[-1])
        if total > FOOTER_BUDGET:
            return None
    return out


def _metadata_bytes(footer: pq.FileMetaData) -> bytes:
    sink = pa.BufferOutputStream()
    footer.write_metadata_file(sink)
    return sink.getvalue().to_pybytes()


def encode_footers(store: ParquetStore, footers: Mapping[str, pq.FileMetaData]) -> bytes:
    """Some of the store's footers as bytes (an Arrow IPC stream of each file's relative path and Parquet metadata).

    The ranks of a job each read a share of the footers and send it so to the rank that plans
    (:func:`adopt_footers`).
    """
    table = pa.table({'path': pa.array([store.relpath(path) for path in footers], pa.string()),
                      'footer': pa.array([_metadata_bytes(footer) for footer in footers.values()], pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def adopt_footers(store: ParquetStore, shares: Sequence[bytes]) -> None:
    """Give the store every file's footer from the shares :func:`encode_footers` made: it then plans without a read.

    Its data files also take the footers that this process did not read, so that opening one of them does not
    ask for its footer again.

    Raises:
        PetastormMetadataError: a share is unreadable, or the shares do not give every file's footer.
    """
    by_relpath = {store.relpath(path): path for path in store.files}
    given: dict[str, bytes] = {}
    for share in shares:
        try:
            with pa.ipc.open_stream(pa.py_buffer(share)) as stream:
                columns = stream.read_all().to_pydict()
        except (pa.ArrowException, OSError) as err:
            raise PetastormMetadataError(f'a share of the footers of {store.url} is not readable: {err}') from err
        for relative, data in zip(columns['path'], columns['footer'], strict=True):
            path = by_relpath.get(relative)
            if path is None:
                raise PetastormMetadataError(f'a share of the footers of {store.url} names {relative}, which is not '
                                             f'one of its listed files')
            given[path] = data
    missing = [path for path in store.files if path not in given]
    if missing:
        raise PetastormMetadataError(f'the shares of the footers of {store.url} lack {len(missing)} of its files, '
                                     f'{missing[0]} among them')
    known = store.reads.data_files.known_footers if store.reads.data_files is not None else {}
    footers = {}
    for path in store.files:
        footers[path] = pq.read_metadata(pa.BufferReader(given[path]))
        known.setdefault(path, given[path])
    store.reads.footers, store.reads.footer_bytes = footers, given


def adopt_plan(store: ParquetStore, data: bytes, *, take_listing: bool = False) -> ParquetStore:
    """The store with the saved plan ``data`` in its reads: its readers then plan without reading a footer.

    Args:
        store: the store as this process opened it.
        data: what :func:`encode_plan` returned.
        take_listing: when the plan was made from another listing, use the plan's files, sizes and times (the
            ranks of one job read the same files, whatever each saw when it listed); otherwise refuse the plan.

    Raises:
        PlanMismatch: the plan was made from another listing (and ``take_listing`` is not set).
        PetastormMetadataError: ``data`` is not a plan, or one of a format newer than this package reads.
    """
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as stream:
            table = stream.read_all()
    except (pa.ArrowException, OSError) as err:
        raise PetastormMetadataError(f'a saved plan of {store.url} is not readable: {err}') from err
    metadata = table.schema.metadata or {}
    version = int(metadata.get(_VERSION_KEY, b'0'))
    if not 1 <= version <= PLAN_FORMAT_VERSION:
        raise PetastormMetadataError(f'a saved plan of {store.url} has format_version {version}; this petastorm '
                                     f'reads 1 to {PLAN_FORMAT_VERSION}: upgrade petastorm, or remove the plan')
    columns = table.to_pydict()
    if metadata.get(_LISTING_KEY, b'').decode() != listing_digest(store):
        if not take_listing:
            raise PlanMismatch(f'the saved plan of {store.url} was made from another listing of its files (some '
                               f'were added, removed or rewritten since)')
        store = _with_listing(store, columns)
    by_relpath = {store.relpath(path): path for path in store.files}
    store.reads.row_counts = {by_relpath[relative]: counts
                              for relative, counts in zip(columns['path'], columns['row_counts'], strict=True)}
    if _SCHEMA_KEY in metadata:
        store.reads.unified = _unified(metadata, by_relpath)
    if 'footer' in columns:
        store.reads.footer_bytes = {by_relpath[relative]: data
                                    for relative, data in zip(columns['path'], columns['footer'], strict=True)}
        if store.reads.data_files is not None:
            store.reads.data_files.known_footers.update(store.reads.footer_bytes)
    return store


def _with_listing(store: ParquetStore, columns: dict[str, list]) -> ParquetStore:
    """The store with the files, sizes and times of the plan's listing (nothing read from it yet)."""
    root = store.root or ''
    paths = [f'{root.rstrip("/")}/{relative}' if root else relative for relative in columns['path']]
    return dataclasses.replace(
        store, files=tuple(paths),
        file_sizes={p: s for p, s in zip(paths, columns['size'], strict=True) if s is not None},
        file_mtimes={p: t for p, t in zip(paths, columns['mtime_ns'], strict=True) if t is not None},
        reads=type(store.reads)())


def _unified(metadata: dict[bytes, bytes], by_relpath: dict[str, str]) -> UnifiedSchema:
    schema = pa.ipc.read_schema(pa.py_buffer(metadata[_SCHEMA_KEY]))
    changes = []
    for field in pa.ipc.read_schema(pa.py_buffer(metadata[_CHANGES_KEY])):
        relative, column = json.loads(field.name)
        stored = None if pa.types.is_null(field.type) and column in schema.names and \
            not pa.types.is_null(schema.field(column).type) else field.type
        changes.append(SchemaChange(by_relpath[relative], column, stored, schema.field(column).type))
    file_columns = {by_relpath[relative]: tuple(names)
                    for relative, names in json.loads(metadata[_FILE_COLUMNS_KEY]).items()}
    return UnifiedSchema(schema, tuple(changes), file_columns)
