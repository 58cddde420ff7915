"""What the audio and video codecs share: their two stored layouts, the payloads of a column, errors, draws.

A media field is stored in one of two layouts:

* ``'bytes'``: a binary column holding each row's encoded file (a FLAC, WAV, MP3... or an MP4, MKV, WebM...), what
  a Unischema field with :class:`~petastorm.codecs.AudioCodec` or :class:`~petastorm.codecs.VideoCodec` writes;
* ``'hf'``: Hugging Face ``datasets``' ``struct<bytes: binary, path: string>`` of its ``Audio`` and ``Video``
  features (the file's bytes, or only its path; the reader reads a path next to the data file first).

Either layout is decoded whatever the codec was made with, so a codec given for a field decodes its column as it is
stored. Decoding happens from the bytes in memory, one row at a time, in the reader's workers; the libraries
(PyAV, soundfile, soxr) are imported on first use, with an error naming the ``media`` extra when missing.

Draws (a random clip start) are made from one key per row, which the reader derives from its seed, the epoch and
the row's place in the dataset (:func:`petastorm.plan.row_keys.row_draw_keys`): the same seed draws the same frames
for every pool kind and worker count, and a reader restored from a saved position draws what the first one drew.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa

from petastorm.codecs._base import ColumnBuilder, DataframeColumnCodec, _field_name
from petastorm.errors import CodecError, SchemaError

MediaLayout = Literal['bytes', 'hf']
#: The stored type of the ``'hf'`` layout (``datasets``' ``Audio`` and ``Video`` features).
BYTES_PATH_TYPE = pa.struct([pa.field('bytes', pa.binary()), pa.field('path', pa.string())])
_LAYOUTS = ('bytes', 'hf')
# Mixed into each row's key, so that a codec's draws never repeat another random stream made from the same numbers.
_DRAW_STREAM = 0x6D656469


def import_media(module_name: str, feature: str) -> ModuleType:
    """Import one of the media libraries, or raise ``MissingDependencyError`` naming the ``media`` extra."""
    from petastorm._optional import import_optional

    return import_optional(module_name, feature)


def check_layout(owner: str, layout: Any) -> MediaLayout:
    """``layout`` when it is one of the stored layouts.

    Raises:
        ValueError: naming the codec and the layouts.
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"{owner}: layout must be 'bytes' (a binary column of files) or 'hf' (Hugging Face's "
                         f'struct of bytes and path), got {layout!r}')
    return layout  # type: ignore[no-any-return]


def row_rng(key: int) -> np.random.Generator:
    """The random generator of one row's draws, from its key."""
    return np.random.default_rng([int(key) & 0xFFFFFFFFFFFFFFFF, _DRAW_STREAM])


class MediaCodec(DataframeColumnCodec):
    """Base of :class:`~petastorm.codecs.AudioCodec` and :class:`~petastorm.codecs.VideoCodec`.

    Subclasses say what a file becomes (:meth:`_decode_payload`) and how an array is encoded into a file
    (:meth:`_encode_array`); this class owns the layouts, the payloads of a column and the errors.
    """

    #: ``'audio'`` or ``'video'``: what the messages call a value.
    media_kind: ClassVar[str]

    def __init__(self, layout: MediaLayout = 'bytes') -> None:
        self._layout = check_layout(type(self).__name__, layout)

    @property
    def layout(self) -> MediaLayout:
        """The stored layout written: ``'bytes'`` or ``'hf'``."""
        return self._layout

    def arrow_type(self) -> pa.DataType:
        return BYTES_PATH_TYPE if self._layout == 'hf' else pa.binary()

    def spark_dtype(self) -> Any:
        from petastorm._optional import import_optional

        types = import_optional('pyspark.sql.types', f'{type(self).__name__}.spark_dtype()')
        if self._layout == 'bytes':
            return types.BinaryType()
        return types.StructType([types.StructField('bytes', types.BinaryType(), True),
                                 types.StructField('path', types.StringType(), True)])

    # -- writing -------------------------------------------------------------------------------------------------

    def encode(self, unischema_field: Any, value: Any) -> Any:
        """One value as the layout stores it: encoded bytes as they are, arrays encoded, paths (``'hf'``) kept."""
        if isinstance(value, dict) and ('bytes' in value or 'path' in value) and 'array' not in value:
            payload, path = value.get('bytes'), value.get('path')
        elif isinstance(value, (bytes, bytearray, memoryview)):
            payload, path = bytes(value), None
        elif isinstance(value, str):
            payload, path = None, value
        else:
            payload, path = self._encode_array(unischema_field, value), None
        if self._layout == 'hf':
            return {'bytes': None if payload is None else bytes(payload), 'path': path}
        if payload is None:
            raise SchemaError(f"field {_field_name(unischema_field)}: the 'bytes' layout stores the {self.media_kind} "
                              f"file's bytes, not a path ({path!r}); read the file, or use layout='hf'")
        return bytes(payload)

    def _encode_array(self, field: Any, value: Any) -> bytes:
        raise NotImplementedError

    # -- reading -------------------------------------------------------------------------------------------------

    def decode(self, unischema_field: Any, value: Any) -> Any:
        if isinstance(value, dict):
            if value.get('bytes') is None:
                raise _path_only_error(unischema_field, self.media_kind, value.get('path'), None)
            value = value['bytes']
        return self._decode_payload(unischema_field, memoryview(value), 0, None, None)

    def decode_column(self, unischema_field: Any, column: pa.Array | pa.ChunkedArray,
                      row_keys: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Decode a whole column; null rows stay None.

        Args:
            unischema_field: the field.
            column: a binary column, or a struct of ``bytes`` and ``path``.
            row_keys: one key per row for the random draws (the reader gives them); by default the row numbers.

        Returns:
            One ``(rows, ...)`` array when every row has one shape, else an object array of the rows' arrays.
        """
        payloads = list(iter_payloads(unischema_field, self.media_kind, column))
        if row_keys is not None and len(row_keys) != len(payloads):
            raise ValueError(f'{len(row_keys)} row keys for a column of {len(payloads)} rows')
        builder = ColumnBuilder(len(payloads))
        for row, payload in enumerate(payloads):
            if payload is None:
                builder.add(None)
                continue
            key = row if row_keys is None else int(row_keys[row])
            builder.add(self._decode_payload(unischema_field, payload, key, builder, row))
        return builder.result()

    def _decode_payload(self, field: Any, payload: memoryview, key: int, builder: ColumnBuilder | None,
                        row: int | None) -> np.ndarray:
        raise NotImplementedError


def decode_stored_column(field: Any, column: pa.Array | pa.ChunkedArray, row_keys: np.ndarray | None) -> Any:
    """The decoded column of a field with a codec; media codecs get the rows' keys for their draws."""
    if isinstance(field.codec, MediaCodec):
        return field.codec.decode_column(field, column, row_keys)
    return field.codec.decode_column(field, column)


def iter_payloads(field: Any, kind: str, column: pa.Array | pa.ChunkedArray) -> Iterator[memoryview | None]:
    """Each row's encoded file as a memoryview (None for a null row), from either stored layout.

    Raises:
        CodecError: the column is neither layout, or a row holds a path only (the reader reads paths next to the
            data file before decoding: such a row was not found there).
    """
    from petastorm.codecs._image import _iter_buffers

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_struct(column.type) and column.type.get_field_index('bytes') >= 0:
        payloads = column.field('bytes')
        row_valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
        paths = column.field('path') if column.type.get_field_index('path') >= 0 else None
    elif _is_binary(column.type):
        payloads, row_valid, paths = column, None, None
    else:
        raise CodecError(f'field {_field_name(field)}: {kind} is stored in a binary column (the files) or a struct of '
                         f'"bytes" and "path" (Hugging Face), got Arrow type {column.type}')
    if not _is_binary(payloads.type):
        payloads = payloads.cast(pa.binary())
    for row, payload in enumerate(_iter_buffers(payloads)):
        if row_valid is not None and not row_valid[row]:
            yield None
        elif payload is None and paths is not None:
            raise _path_only_error(field, kind, paths[row].as_py(), row)
        else:
            yield payload


def _is_binary(arrow_type: pa.DataType) -> bool:
    return pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)


def open_container(field: Any, kind: str, payload: memoryview, row: int | None) -> Any:
    """The PyAV container of an encoded file in memory (no file is written).

    Raises:
        CodecError: the bytes are not a media file PyAV can open (naming the field, the row and the size).
    """
    av = import_media('av', f'decoding {kind}')
    try:
        return av.open(io.BytesIO(payload), mode='r')
    except Exception as err:
        raise decode_error(field, kind, payload, row, err) from err


@contextmanager
def decoding_stream(field: Any, kind: str, payload: memoryview, row: int | None) -> Iterator[tuple[Any, Any]]:
    """``(container, stream)``: the file's first ``kind`` stream, opened in memory with one decoder thread.

    PyAV's errors inside the block become the :func:`decode_error` of the value.

    Raises:
        CodecError: the bytes are not a media file, have no ``kind`` stream, or do not decode.
    """
    with open_container(field, kind, payload, row) as container:
        streams = container.streams.audio if kind == 'audio' else container.streams.video
        if not streams:
            raise decode_error(field, kind, payload, row, f'it has no {kind} stream')
        stream = streams[0]
        stream.codec_context.thread_count = 1  # the reader's workers are the parallelism
        try:
            yield container, stream
        except CodecError:
            raise
        except (ValueError, OSError) as err:  # PyAV's errors (av.FFmpegError) derive from both
            raise decode_error(field, kind, payload, row, err) from err


def decode_error(field: Any, kind: str, payload: memoryview, row: int | None, err: Exception | str) -> CodecError:
    """The error of a value that does not decode, naming the field, the row of the column and the size."""
    where = '' if row is None else f' (row {row} of the column)'
    return CodecError(f'field {_field_name(field)}{where}: the stored value is not a decodable {kind} file '
                      f'({len(payload)} bytes): {err}')


def _path_only_error(field: Any, kind: str, path: str | None, row: int | None) -> CodecError:
    where = '' if row is None else f' (row {row} of the column)'
    if path is None:
        return CodecError(f'field {_field_name(field)}{where}: the {kind} has neither bytes nor a path')
    return CodecError(f'field {_field_name(field)}{where}: the {kind} is stored as the path {path!r} only, which was '
                      f'not found; keep the files next to the dataset (paths are taken relative to the data file), '
                      f'or write the dataset with the files embedded')

