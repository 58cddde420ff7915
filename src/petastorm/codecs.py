"""Codecs: how a field's values are stored in a Parquet cell, and how whole columns are decoded back.

Byte formats are the standard ones Petastorm uses, so datasets move between the two implementations:

* :class:`NdarrayCodec`: a ``.npy`` file (what ``np.save`` writes);
* :class:`CompressedNdarrayCodec`: an ``.npz`` archive holding ``arr.npy`` (``np.savez_compressed``);
* :class:`CompressedImageCodec`: a standard PNG or JPEG of the RGB (or grey) image;
* :class:`ScalarCodec`: the native Parquet value of a Spark/Arrow type.

Every codec has a stable registry name and a JSON description (:meth:`DataframeColumnCodec.to_json`) that is
what the dataset metadata stores. ``decode_column`` decodes a whole Arrow column at once; readers call it per
row group, never per row.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sized
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from petastorm.errors import CodecError, SchemaError
from petastorm.scalars import arrow_type_from_json, arrow_type_to_json, scalar_column_to_numpy, to_arrow_scalar
from petastorm.spark_types import arrow_type_from_spark, is_spark_type

OPENCV_AVAILABLE: bool
"""Kept for compatibility; computed on first access without importing OpenCV eagerly."""


def __getattr__(name: str) -> Any:
    if name == 'OPENCV_AVAILABLE':
        import importlib.util

        return importlib.util.find_spec('cv2') is not None
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _field_name(field: Any) -> str:
    return getattr(field, 'name', None) or (field[0] if isinstance(field, tuple) else '<unnamed>')


def _shape_matches(expected: tuple, actual: tuple) -> bool:
    return len(expected) == len(actual) and all(e is None or e == a for e, a in zip(expected, actual, strict=True))


def _dtype_matches(expected: Any, dtype: np.dtype) -> bool:
    return dtype.type == expected


def _check_decoded_arrays(field: Any, column: np.ndarray) -> np.ndarray:
    """Refuse stored arrays whose dtype or shape is not the schema's: they were not written through it.

    ``column`` is what ``decode_column`` built: one stacked array, or an object array of arrays and Nones.

    Raises:
        CodecError: naming the field, the stored and the expected dtype or shape.
    """
    if column.dtype != object:
        _check_decoded_array(field, column.dtype, column.shape[1:])
        return column
    for value in column:
        if value is not None:
            _check_decoded_array(field, value.dtype, value.shape)
    return column


def _check_decoded_array(field: Any, dtype: np.dtype, shape: tuple) -> None:
    expected_shape = tuple(field.shape)
    # Only a numpy scalar type pins the dtype; anything else in the schema (e.g. None) leaves it open.
    if isinstance(field.numpy_dtype, type) and not _dtype_matches(field.numpy_dtype, dtype):
        raise CodecError(f'field {field.name}: the stored array has dtype {dtype}; the schema expects '
                         f'{np.dtype(field.numpy_dtype)}')
    if not _shape_matches(expected_shape, tuple(shape)):
        raise CodecError(f'field {field.name}: the stored array has shape {tuple(shape)}; the schema expects '
                         f'{expected_shape}')


def check_array(field: Any, value: Any) -> np.ndarray:
    """Check that ``value`` is an ndarray of the field's numpy type and shape (``None`` dims are wildcards).

    Raises:
        SchemaError: naming the field, the expected and the actual type or shape.
    """
    name = _field_name(field)
    if not isinstance(value, np.ndarray):
        raise SchemaError(f'Unexpected type of {name} feature, expected numpy.ndarray of {field.numpy_dtype}, '
                          f'got {type(value).__name__}')
    if not _dtype_matches(field.numpy_dtype, value.dtype):
        raise SchemaError(f'Unexpected type of {name} feature, expected {np.dtype(field.numpy_dtype)}, '
                          f'got {value.dtype}')
    if not _shape_matches(tuple(field.shape), value.shape):
        raise SchemaError(f'Unexpected dimensions of {name} feature, expected {tuple(field.shape)}, '
                          f'got {value.shape}')
    return value


def _binary_payloads(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_large_binary(column.type) or pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
    raise CodecError(f'expected a binary column of encoded values, got Arrow type {column.type}')


class ColumnBuilder:
    """Assembles the decoded values of one column straight into one ``(n, *shape)`` array.

    Values are written into their row of a preallocated array as they are decoded, so a column never exists
    twice (a list of per-row arrays and their stacked copy). When a value's shape or dtype differs from the
    first value's, or a value is None or not an array, the column becomes a 1-d object array holding each value
    instead (rows written so far are copied out and the array, sized for the whole column, is released).

    Args:
        num_rows: the number of values that will be added.
    """

    def __init__(self, num_rows: int) -> None:
        self._num_rows = num_rows
        self._array: np.ndarray | None = None
        self._objects: np.ndarray | None = None
        self._count = 0

    def add(self, value: Any, convert: Callable[[Any, np.ndarray | None], Any] | None = None) -> None:
        """Add the next value; ``convert(value, out)`` (if given) makes the stored value, writing into ``out``.

        ``out`` is the value's row of the array when the converted value will have ``value``'s shape and dtype,
        else None (then ``convert`` returns a new value).
        """
        if self._objects is None and isinstance(value, np.ndarray):
            if self._array is None:
                self._array = np.empty((self._num_rows, *value.shape), dtype=value.dtype)
            if value.shape == self._array.shape[1:] and value.dtype == self._array.dtype:
                row = self._array[self._count, ...]  # a view, also for 0-d values
                if convert is None:
                    row[...] = value
                else:
                    convert(value, row)
                self._count += 1
                return
        if self._objects is None:
            self._objects = np.empty(self._num_rows, dtype=object)
            if self._array is not None:
                # Copies, not views: a view of one row would keep the whole-column array alive.
                for i in range(self._count):
                    self._objects[i] = self._array[i, ...].copy()
                self._array = None
        self._objects[self._count] = value if convert is None or value is None else convert(value, None)
        self._count += 1

    def result(self) -> np.ndarray:
        """The column: the filled array, or the object array (also for a column without values)."""
        if self._count != self._num_rows:
            raise ValueError(f'ColumnBuilder expected {self._num_rows} values, got {self._count}')
        if self._objects is None and self._array is not None:
            return self._array
        if self._objects is None:
            self._objects = np.empty(self._num_rows, dtype=object)
        return self._objects


def stack_or_objects(values: Iterable[Any], count: int | None = None) -> np.ndarray:
    """Stack equal-shaped arrays into one array; otherwise a 1-d object array holding each value (or None).

    Args:
        values: the values; may be a generator (e.g. decoding lazily) when ``count`` is given.
        count: how many values ``values`` yields; default ``len(values)``.
    """
    if count is None:
        values = values if isinstance(values, Sized) else list(values)
        count = len(values)  # type: ignore[arg-type]
    builder = ColumnBuilder(count)
    for value in values:
        builder.add(value)
    return builder.result()


class DataframeColumnCodec(ABC):
    """Base of all codecs.

    Subclasses define :meth:`encode`, :meth:`decode`, :meth:`spark_dtype`, :meth:`arrow_type` and their JSON
    description. :meth:`decode_column` has a per-value default that codecs override with a columnar one.
    """

    #: stable registry key, stored in the dataset metadata.
    codec_name: ClassVar[str]

    @abstractmethod
    def encode(self, unischema_field: Any, value: Any) -> Any:
        """Turn one value into what its Parquet cell stores."""

    @abstractmethod
    def decode(self, unischema_field: Any, value: Any) -> Any:
        """Turn one stored cell back into the field's value."""

    @abstractmethod
    def spark_dtype(self) -> Any:
        """The pyspark type of the stored column (imports pyspark)."""

    @abstractmethod
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the stored column."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable description; ``codec_from_json`` rebuilds an equal codec from it."""
        return {'codec': self.codec_name}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> DataframeColumnCodec:
        """Rebuild a codec from :meth:`to_json` output."""
        return cls()

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Decode a whole column: a stacked array when every value has one shape, else an object array."""
        values = column.to_pylist()
        return stack_or_objects((None if value is None else self.decode(unischema_field, value)
                                 for value in values), len(values))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.to_json().items())))

    def __repr__(self) -> str:
        return str(self)


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


_IMAGE_FORMATS = {'png': '.png', 'jpeg': '.jpeg', 'jpg': '.jpeg'}


def _cv2() -> Any:
    from petastorm._optional import import_optional

    cv2 = import_optional('cv2', 'CompressedImageCodec')
    return cv2


class CompressedImageCodec(DataframeColumnCodec):
    """Stores a uint8/uint16 image (H x W grey or H x W x 3 RGB) as a standard PNG or JPEG file.

    Args:
        image_codec: ``'png'`` (lossless) or ``'jpeg'``.
        quality: JPEG quality, 0-100 (ignored for PNG).
    """

    codec_name = 'compressed_image'

    def __init__(self, image_codec: str = 'png', quality: int = 80):
        key = str(image_codec).lower().lstrip('.')
        if key not in _IMAGE_FORMATS:
            raise ValueError(f'CompressedImageCodec: image_codec must be "png" or "jpeg", got {image_codec!r}')
        if not isinstance(quality, (int, np.integer)) or not 0 <= int(quality) <= 100:
            raise ValueError(f'CompressedImageCodec: quality must be an int in [0, 100], got {quality!r}')
        self._image_codec = _IMAGE_FORMATS[key]
        self._quality = int(quality)

    @property
    def image_codec(self) -> str:
        """``'png'`` or ``'jpeg'``."""
        return self._image_codec[1:]

    @property
    def quality(self) -> int:
        """JPEG quality."""
        return self._quality

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, 'format': self.image_codec, 'quality': self._quality}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> CompressedImageCodec:
        return cls(description.get('format', 'png'), description.get('quality', 80))

    def encode(self, unischema_field: Any, value: Any) -> bytes:
        value = check_array(unischema_field, value)
        if value.ndim == 3 and value.shape[2] == 3:
            value = value[:, :, ::-1]  # OpenCV takes BGR; the file stays standard RGB
        elif value.ndim != 2:
            raise SchemaError(f'Unexpected image dimensions of {_field_name(unischema_field)}. Supported '
                              f'dimensions are (H, W) or (H, W, 3). Got {value.shape}')
        if value.dtype not in (np.uint8, np.uint16) or (value.dtype == np.uint16 and self.image_codec == 'jpeg'):
            raise SchemaError(f'field {_field_name(unischema_field)}: {self.image_codec} images must be uint8'
                              f'{" or uint16" if self.image_codec == "png" else ""}, got {value.dtype}')
        cv2 = _cv2()
        params = [cv2.IMWRITE_JPEG_QUALITY, self._quality] if self.image_codec == 'jpeg' else []
        ok, encoded = cv2.imencode(self._image_codec, np.ascontiguousarray(value), params)
        if not ok:
            raise CodecError(f'field {_field_name(unischema_field)}: OpenCV failed to encode a {value.shape} '
                             f'{value.dtype} image as {self.image_codec}')
        return encoded.tobytes()

    def _decode_stored(self, cv2: Any, unischema_field: Any, value: Any) -> np.ndarray:
        """The image as OpenCV decodes it (BGR channel order for colour images)."""
        # OpenCV raises (rather than returning None) for an empty buffer
        image = cv2.imdecode(np.frombuffer(value, dtype=np.uint8), cv2.IMREAD_UNCHANGED) if len(value) else None
        if image is None:
            raise CodecError(f'field {_field_name(unischema_field)}: the stored value is not a decodable '
                             f'{self.image_codec} image ({len(value)} bytes)')
        return image

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        cv2 = _cv2()
        return _to_rgb(cv2, self._decode_stored(cv2, unischema_field, value), None)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        cv2 = _cv2()
        payloads = _binary_payloads(column)
        builder = ColumnBuilder(len(payloads))
        for payload in _iter_buffers(payloads):
            if payload is None:
                builder.add(None)
            else:
                # The colour conversion writes straight into the image's row of the column.
                builder.add(self._decode_stored(cv2, unischema_field, payload),
                            lambda image, out: _to_rgb(cv2, image, out))
        return builder.result()

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        return import_optional('pyspark.sql.types', 'CompressedImageCodec.spark_dtype()').BinaryType()

    def arrow_type(self) -> pa.DataType:
        return pa.binary()

    def __str__(self) -> str:
        return f'CompressedImageCodec({self.image_codec!r}, {self._quality})'


def _to_rgb(cv2: Any, image: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A decoded colour image in RGB order (written into ``out`` when given); other images as they are."""
    if image.ndim == 3 and image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=out)
    if out is None:
        return image
    out[...] = image
    return out


def _iter_buffers(payloads: pa.Array):
    """Yield each cell of a binary array as a zero-copy memoryview (None for nulls)."""
    n = len(payloads)
    offset_type = np.int64 if pa.types.is_large_binary(payloads.type) else np.int32
    offsets = np.frombuffer(payloads.buffers()[1], dtype=offset_type)[payloads.offset:payloads.offset + n + 1]
    data = memoryview(payloads.buffers()[2]) if payloads.buffers()[2] is not None else memoryview(b'')
    valid = payloads.is_valid().to_numpy(zero_copy_only=False) if payloads.null_count else None
    bounds = offsets.tolist()
    for i in range(n):
        if valid is not None and not valid[i]:
            yield None
        else:
            yield data[bounds[i]:bounds[i + 1]]


class ScalarCodec(DataframeColumnCodec):
    """Stores a scalar as a native Parquet value of a Spark SQL type or an Arrow type.

    Args:
        spark_type: a ``pyspark.sql.types`` instance (``IntegerType()``, ``DecimalType(10, 9)``, ...) or a
            ``pyarrow.DataType`` (``pa.int32()``); pyspark is not needed for the latter.
    """

    codec_name = 'scalar'

    def __init__(self, spark_type: Any):
        if isinstance(spark_type, pa.DataType):
            self._arrow_type = spark_type
        elif is_spark_type(spark_type) or type(spark_type).__name__.endswith('Type'):
            self._arrow_type = arrow_type_from_spark(spark_type)
        else:
            raise SchemaError(f'ScalarCodec expects a pyspark SQL type or a pyarrow DataType, got {spark_type!r}')
        self._spark_type = spark_type

    def arrow_type(self) -> pa.DataType:
        return self._arrow_type

    def spark_dtype(self) -> Any:
        if not isinstance(self._spark_type, pa.DataType) and is_spark_type(self._spark_type):
            return self._spark_type
        from petastorm._optional import import_optional
        from petastorm.spark_types import spark_type_from_arrow

        return spark_type_from_arrow(self._arrow_type, import_optional('pyspark.sql.types', 'spark_dtype()'))

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, **arrow_type_to_json(self._arrow_type)}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> ScalarCodec:
        return cls(arrow_type_from_json(description))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScalarCodec) and self._arrow_type == other._arrow_type

    def __hash__(self) -> int:
        return hash(str(self._arrow_type))

    def __getstate__(self) -> dict:
        # Arrow types pickle everywhere; a Spark type is kept only for spark_dtype() on machines with pyspark.
        return {'_arrow_type': self._arrow_type, '_spark_type': self._spark_type}

    def encode(self, unischema_field: Any, value: Any) -> Any:
        name = _field_name(unischema_field)
        if hasattr(value, '__len__') and not isinstance(value, (str, bytes)) and not (
                isinstance(value, np.ndarray) and value.ndim == 0):
            raise TypeError(f"Expected a scalar as a value for field '{name}'. Got a non-numpy type'{type(value)}'")
        if tuple(unischema_field.shape) != ():
            raise SchemaError(f'The shape field of a scalar field {name!r} must be an empty tuple (i.e. \'()\'). '
                              f'Got {unischema_field.shape}')
        return to_arrow_scalar(name, self._arrow_type, value)

    def decode(self, unischema_field: Any, value: Any) -> Any:
        return unischema_field.numpy_dtype(value)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return scalar_column_to_numpy(unischema_field, column)

    def __str__(self) -> str:
        if not isinstance(self._spark_type, pa.DataType):
            return f'ScalarCodec({type(self._spark_type).__name__}())'
        return f'ScalarCodec({self._arrow_type})'


#: Codec classes by their persisted name.
CODECS_BY_NAME: dict[str, type[DataframeColumnCodec]] = {
    cls.codec_name: cls for cls in (NdarrayCodec, CompressedNdarrayCodec, CompressedImageCodec, ScalarCodec)}


def codec_from_json(description: dict[str, Any], where: str = '') -> DataframeColumnCodec:
    """Rebuild a codec from its JSON description.

    Raises:
        SchemaError: the codec name is unknown (the message names it, ``where`` it was found, and the known names).
    """
    name = description.get('codec') if isinstance(description, dict) else None
    cls = CODECS_BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        raise SchemaError(f'unknown codec {name!r}{" in " + where if where else ""}; known codecs: '
                          f'{", ".join(sorted(CODECS_BY_NAME))}')
    return cls.from_json(description)


def encode_value(field: Any, value: Any) -> Any:
    """Encode one non-None value of ``field`` for storage (codec, or native scalar/list conversion)."""
    if field.codec is not None:
        return field.codec.encode(field, value)
    from petastorm.unischema import arrow_type_of_field

    arrow_type = arrow_type_of_field(field)
    if pa.types.is_list(arrow_type):
        array = np.asarray(value)
        if array.ndim != 1 or not _shape_matches(tuple(field.shape), array.shape):
            raise SchemaError(f'Unexpected dimensions of {field.name} feature, expected {tuple(field.shape)}, '
                              f'got {array.shape}')
        return [to_arrow_scalar(field.name, arrow_type.value_type, v) for v in array.tolist()]
    if isinstance(value, np.generic) and field.numpy_dtype is not None and isinstance(field.numpy_dtype, type) \
            and issubclass(field.numpy_dtype, np.generic) and not isinstance(value, field.numpy_dtype) \
            and np.dtype(type(value)).kind != np.dtype(field.numpy_dtype).kind:
        raise SchemaError(f'Unexpected type of {field.name} feature, expected {np.dtype(field.numpy_dtype)}, '
                          f'got {np.dtype(type(value))}')
    return to_arrow_scalar(field.name, arrow_type, value)
