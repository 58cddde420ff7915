"""``.npy`` and ``.npz`` blob codecs for n-d arrays: Petastorm's byte formats, decoded a whole column at a time."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from petastorm.codecs._base import (
    DataframeColumnCodec,
    _binary_payloads,
    _check_decoded_arrays,
    _field_name,
    check_array,
)
from petastorm.errors import CodecError, SchemaError


class NdarrayCodec(DataframeColumnCodec):
    """Stores an ndarray as a standard ``.npy`` file (byte-identical to ``np.save``)."""

    codec_name = 'ndarray'

    def encode(self, unischema_field: Any, value: Any) -> bytes:
        value = check_array(unischema_field, value)
        if value.dtype.hasobject:
            raise SchemaError(f'field {_field_name(unischema_field)}: object arrays cannot be stored')
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return buffer.getvalue()

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        try:
            result = np.load(io.BytesIO(value), allow_pickle=False)
        except Exception as err:  # np.load raises ValueError/OSError/EOFError for bad bytes
            raise CodecError(f'field {_field_name(unischema_field)}: the stored value is not a valid .npy '
                             f'payload ({err})') from err
        if not isinstance(result, np.ndarray):  # e.g. an .npz archive: np.load returns an NpzFile
            result.close()
            raise CodecError(f'field {_field_name(unischema_field)}: the stored value is not a valid .npy '
                             f'payload (got {type(result).__name__})')
        return result

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        payloads = _binary_payloads(column)
        fast = _decode_uniform_npy(payloads)
        if fast is not None:
            return _check_decoded_arrays(unischema_field, fast)
        return _check_decoded_arrays(unischema_field, super().decode_column(unischema_field, payloads))

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        return import_optional('pyspark.sql.types', 'NdarrayCodec.spark_dtype()').BinaryType()

    def arrow_type(self) -> pa.DataType:
        return pa.binary()

    def __str__(self) -> str:
        return 'NdarrayCodec()'


def _decode_uniform_npy(payloads: pa.Array) -> np.ndarray | None:
    """Decode a column of ``.npy`` payloads without a per-row loop when every payload has the same header.

    Returns None when the column does not qualify (nulls, varying lengths or headers, object dtype).
    """
    n = len(payloads)
    if n == 0 or payloads.null_count:
        return None
    offset_type = np.int64 if pa.types.is_large_binary(payloads.type) else np.int32
    offsets = np.frombuffer(payloads.buffers()[1], dtype=offset_type)[payloads.offset:payloads.offset + n + 1]
    lengths = np.diff(offsets)
    length = int(lengths[0])
    if length == 0 or not (lengths == length).all():
        return None
    data = np.frombuffer(payloads.buffers()[2], dtype=np.uint8)
    start = int(offsets[0])
    block = data[start:start + n * length].reshape(n, length)
    header = io.BytesIO(block[0].tobytes())
    try:
        version = np.lib.format.read_magic(header)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(header)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(header)
        else:
            return None
    except Exception:  # a malformed header (ValueError, SyntaxError...): the per-value path reports it
        return None
    header_length = header.tell()
    if fortran or dtype.hasobject or header_length + dtype.itemsize * int(np.prod(shape)) != length:
        return None
    if not (block[:, :header_length] == block[0, :header_length]).all():
        return None
    values = np.ascontiguousarray(block[:, header_length:])
    return values.view(dtype).reshape((n, *shape))


class CompressedNdarrayCodec(DataframeColumnCodec):
    """Stores an ndarray as a deflate-compressed ``.npz`` archive holding ``arr.npy``."""

    codec_name = 'compressed_ndarray'

    def encode(self, unischema_field: Any, value: Any) -> bytes:
        value = check_array(unischema_field, value)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, arr=value)
        return buffer.getvalue()

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        try:
            with np.load(io.BytesIO(value), allow_pickle=False) as archive:
                return archive['arr']
        except Exception as err:
            raise CodecError(f'field {_field_name(unischema_field)}: the stored value is not a valid .npz '
                             f'archive holding "arr" ({err})') from err

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return _check_decoded_arrays(unischema_field, super().decode_column(unischema_field, column))

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        return import_optional('pyspark.sql.types', 'CompressedNdarrayCodec.spark_dtype()').BinaryType()

    def arrow_type(self) -> pa.DataType:
        return pa.binary()

    def __str__(self) -> str:
        return 'CompressedNdarrayCodec()'
