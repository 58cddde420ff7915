"""The decoded-column cache: row groups kept on local disk after their images and arrays were decoded.

``cache_type='local-disk-decoded'`` keeps, for each row group a reader reads, its columns with every image and
array already decoded, in an Arrow IPC file of the local disk cache (:class:`~petastorm.cache.LocalDiskCache`:
the same directory layout, keys hashed the same way, size limit, eviction and sharing between processes). The
first epoch decodes as without a cache and writes the file; later epochs map the file and skip both the read
and the decode.

What an entry holds: the whole row group (before filters, predicates, shuffles, drop partitions and the
transform, so that one entry serves every work item, shard and epoch) of the columns one read of the worker
asks for. Each column of a field whose codec is :class:`~petastorm.codecs.CompressedImageCodec`,
:class:`~petastorm.codecs.NdarrayCodec` or :class:`~petastorm.codecs.CompressedNdarrayCodec` is decoded with
that codec and kept in a layout of :mod:`petastorm.cache._layouts` when its values have one (numeric arrays, of
one shape or of varying shapes); every other column -- scalars, strings, Decimals, other codecs' columns,
columns holding nulls, columns a filter expression reads, and columns whose decoding failed -- is kept as the
file stores it, and the worker decodes the rows it needs as it does without a cache (then a decoding error is
raised for exactly the work items that raise it without a cache). So every value is the one the reader gives
without the cache, of the same type, shape and dtype.

Keys: those of the raw row-group cache (dataset, file path, size and modification time, row group, columns)
plus, for each decoded column, its codec's JSON description, numpy type and shape, under a format tag of their
own. A rewritten file, another codec or another field selection is another key; raw and decoded entries can
share one directory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.cache._layouts import is_packed, pack_column, unpack_column
from petastorm.cache._row_groups import RowGroupCache, in_order
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec
from petastorm.unischema import UnischemaField

logger = logging.getLogger(__name__)

#: Part of every key of a decoded entry; a change of what an entry holds changes it.
DECODED_FORMAT = 'petastorm-decoded-row-group-1'

# Codecs whose stored column is bytes that decoding turns into arrays: the decode is the cost the cache saves,
# and the packed layouts (never bytes) cannot be mistaken for their stored columns. Their decode_column assembles
# rows like stack_or_objects, which the ragged layout relies on; subclasses may not, so types match exactly.
_DECODED_CODECS = (CompressedImageCodec, NdarrayCodec, CompressedNdarrayCodec)


def decodes_in_cache(field: UnischemaField) -> bool:
    """True when the decoded-column cache stores ``field``'s column decoded (see the module doc)."""
    return type(field.codec) in _DECODED_CODECS


def cached_decoded_values(field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """The decoded values of ``field`` when ``column`` holds them in a cache layout; None for a stored column.

    This is the worker's decoding step for columns that come from a decoded-column cache entry: any selection or
    slice of a cached row group's column gives exactly the array that decoding the same rows would give. None
    means that ``column`` is as the file stores it, for the field's codec to decode.
    """
    if not decodes_in_cache(field) or not is_packed(column.type):
        return None
    if not len(column):
        # No rows: the codec's own answer for no rows (an empty object column for most of them).
        return field.codec.decode_column(field, pa.array([], type=field.codec.arrow_type()))
    return unpack_column(column)


def _field_key(field: UnischemaField) -> list[Any]:
    dtype = field.numpy_dtype
    return [field.name, field.codec.to_json(), getattr(dtype, '__name__', str(dtype)),
            [None if d is None else int(d) for d in field.shape]]


@dataclass(frozen=True)
class DecodedRowGroupCache(RowGroupCache):
    """Caches row groups with their images and arrays decoded (see the module doc).

    Like :class:`RowGroupCache`, it is part of the worker context and is sent to worker processes.

    Attributes:
        cache: where the tables are kept.
        dataset: the dataset URL (or URLs), part of every key.
        stamps: size and modification time of the dataset's files, taken when the reader was created.
        fields: the fields whose columns are stored decoded, by name (see :func:`decodes_in_cache`).
    """

    fields: Mapping[str, UnischemaField]

    def key(self, path: str, row_group: int, columns: Sequence[str]) -> str:
        """The cache key of ``columns`` (in any order) of a row group, with how each decoded column is decoded."""
        decoded = [_field_key(self.fields[name]) for name in sorted(columns) if name in self.fields]
        return json.dumps([DECODED_FORMAT, *self.identity(path, row_group, columns), decoded])

    def read(self, path: str, row_group: int, columns: Sequence[str], read_func: Callable[[], pa.Table]) -> pa.Table:
        """The row group's ``columns``, decoded where possible: from the cache, or read and decoded on a miss.

        Args:
            path: the data file.
            row_group: the row-group number in the file.
            columns: the columns ``read_func`` reads, in the order the result must have.
            read_func: reads those columns from the file.

        Returns:
            A table of ``columns``: decoded columns in their cache layout, the others as stored. Decode it with
            :func:`cached_decoded_values` (then the field's codec for the columns it returns None for).
        """
        where = f'{path} (row group {row_group})'
        return in_order(self.cache.get(self.key(path, row_group, columns), lambda: self._decoded(read_func(), where)),
                        columns)

    def _decoded(self, table: pa.Table, where: str) -> pa.Table:
        """``table`` with each column that the cache stores decoded replaced by its decoded layout."""
        for index, name in enumerate(table.column_names):
            field = self.fields.get(name)
            if field is None:
                continue
            try:
                values = field.codec.decode_column(field, table.column(index))
            except Exception as err:  # the worker decodes the rows it needs and raises what it raised without cache
                logger.debug('field %s of %s is cached as stored: decoding it failed (%s)', name, where, err)
                continue
            packed = pack_column(values)
            if packed is None:
                logger.debug('field %s of %s is cached as stored: its decoded values (%s) have no cache layout',
                             name, where, values.dtype)
                continue
            table = table.set_column(index, name, packed)
        return table
