"""Small helpers of Petastorm's public ``petastorm.utils`` module.

Decoding a row, running a function in a fresh process, and adding a key to a dataset's ``_common_metadata``.
"""

from __future__ import annotations

import decimal
import posixpath
from typing import Any

import numpy as np

from petastorm.errors import DecodeFieldError
from petastorm.unischema import Unischema

__all__ = ['DecodeFieldError', 'add_to_dataset_metadata', 'decode_row', 'run_in_subprocess']


def _call(_: Any, call: tuple[Any, tuple, dict[str, Any]]) -> Any:
    func, args, kwargs = call
    return func(*args, **kwargs)


def run_in_subprocess(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` run in a fresh worker process, which ends afterwards; its result.

    Whatever the call leaks (memory, file handles) goes with the process. ``func``, the arguments and the result
    must be picklable (``func`` defined at module level of an importable module). The call's exception is raised
    here.
    """
    from petastorm.pools import ProcessPool

    with ProcessPool(1) as pool:
        pool.start(_call, None)
        return next(iter(pool.imap([(func, args, kwargs)])))


def add_to_dataset_metadata(dataset: Any, key: str | bytes, value: str | bytes) -> None:
    """Add (or replace) one key of the key-value metadata of a dataset's ``_common_metadata``.

    The file is created from the dataset's ``_metadata`` or first data file when missing, written atomically,
    and Hadoop's stale ``._common_metadata.crc`` next to it is removed.

    Args:
        dataset: the dataset: its directory URL, a store from :func:`petastorm.etl.dataset_metadata.open_dataset`
            (or ``reader.dataset``), or a ``pyarrow.parquet.ParquetDataset`` of its directory.
        key: the metadata key.
        value: its value.

    Raises:
        ValueError: ``dataset`` names files rather than one dataset directory.
        TypeError: ``dataset`` is none of the above.
    """
    from petastorm.fs import resolve_location
    from petastorm.metadata.write import update_common_metadata
    from petastorm.store.model import ParquetStore
    from petastorm.store.opening import open_store

    if isinstance(dataset, str):
        dataset = open_store(resolve_location(dataset))
    if isinstance(dataset, ParquetStore):
        if dataset.root is None or dataset.subset:
            raise ValueError(f'Expected a dataset directory, not a list of files: {dataset.url}')
        filesystem, root, files = dataset.filesystem, dataset.root, list(dataset.files)
    elif hasattr(dataset, 'filesystem') and hasattr(dataset, 'files'):  # pyarrow.parquet.ParquetDataset
        files = list(dataset.files)
        if not files:
            raise ValueError('Expected a ParquetDataset of a directory holding Parquet files, got one with no files')
        filesystem, root = dataset.filesystem, posixpath.commonpath([posixpath.dirname(f) for f in files])
    else:
        raise TypeError(f'add_to_dataset_metadata needs a dataset URL, a store from open_dataset or a '
                        f'pyarrow.parquet.ParquetDataset, got {type(dataset).__name__}')
    as_bytes = [item.encode() if isinstance(item, str) else bytes(item) for item in (key, value)]
    update_common_metadata(filesystem, root, {as_bytes[0]: as_bytes[1]}, files)


def decode_row(row: dict[str, Any], schema: Unischema) -> dict[str, Any]:
    """Decode one row of stored values into field values (the per-row path; readers decode whole columns).

    Keys not in the schema are dropped and ``None`` stays ``None``. Codec fields are decoded by their codec;
    other values are cast to the field's numpy type.

    Raises:
        DecodeFieldError: naming the field that failed, with the original error chained.
    """
    decoded: dict[str, Any] = {}
    for name, value in row.items():
        field = schema.fields.get(name)
        if field is None:
            continue
        if value is None:
            decoded[name] = None
            continue
        try:
            if field.codec is not None:
                decoded[name] = field.codec.decode(field, value)
            elif tuple(field.shape) and isinstance(field.numpy_dtype, type) and issubclass(field.numpy_dtype,
                                                                                            np.generic):
                decoded[name] = np.asarray(value, dtype=field.numpy_dtype)  # a list column: np.str_(list) is wrong
            elif isinstance(field.numpy_dtype, type) and issubclass(field.numpy_dtype, (np.generic, decimal.Decimal)):
                decoded[name] = field.numpy_dtype(value)
            else:
                decoded[name] = value
        except Exception as err:
            raise DecodeFieldError(f'Decoding field "{name}" failed: {err}') from err
    return decoded
