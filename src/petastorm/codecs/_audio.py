"""The audio codec: a column of audio files (or Hugging Face ``Audio`` structs) decoded to float32 samples."""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np

from petastorm.codecs._audio_decode import decode_audio, resample, to_channels
from petastorm.codecs._base import ColumnBuilder, _field_name
from petastorm.codecs._media import MediaCodec, MediaLayout, decode_error, import_media
from petastorm.errors import CodecError, MissingDependencyError, SchemaError

_FORMATS = {'flac': ('FLAC', {'int16': 'PCM_16', 'float': 'PCM_24'}),
            'wav': ('WAV', {'int16': 'PCM_16', 'float': 'FLOAT'})}


class AudioCodec(MediaCodec):
    """Audio files (FLAC, WAV, MP3, AAC, Opus, Vorbis...) decoded to float32 samples.

    Each row becomes ``(channels, samples)``, or ``(samples,)`` with ``mono=True``; a column whose rows have one
    shape is one ``(rows, ...)`` array, else an object array of the rows' arrays (the torch loaders batch mono rows
    of different lengths padded, with a mask, or as a ``JaggedTensor``: docs/media.md). Decoding reads the bytes in
    memory: FLAC and WAV through soundfile, other formats through PyAV (``petastorm.codecs._audio_decode``);
    resampling is soxr's.

    Writing takes the encoded files' bytes as they are, a path (``layout='hf'``), a ``{'bytes', 'path'}`` dict,
    or an array of samples (``(samples,)`` or ``(channels, samples)``, int16 or float in [-1, 1], or
    ``{'array': ..., 'sampling_rate': ...}``), encoded as ``format`` at ``sample_rate``: int16 samples losslessly;
    float samples as 24-bit FLAC or float WAV.

    Args:
        sample_rate: the rate every row is delivered at, resampled when its file has another (None: each file's
            own rate); also the rate arrays are written at.
        channels: the channels delivered: None (the file's), 1 (the mean of the file's channels, kept as a
            dimension), or a number equal to the file's (a mono file is copied to each).
        mono: deliver ``(samples,)``, the mean of the file's channels.
        layout: ``'bytes'`` (a binary column of files) or ``'hf'`` (Hugging Face's struct of bytes and path).
        format: the file format arrays are written in, ``'flac'`` or ``'wav'``.

    Example::

        UnischemaField('speech', np.float32, (None,), AudioCodec(sample_rate=16000, mono=True), False)
    """

    codec_name = 'audio'
    media_kind = 'audio'

    def __init__(self, sample_rate: int | None = None, channels: int | None = None, mono: bool = False,
                 layout: MediaLayout = 'bytes', format: Literal['flac', 'wav'] = 'flac') -> None:
        super().__init__(layout)
        if sample_rate is not None and not (isinstance(sample_rate, (int, np.integer)) and int(sample_rate) > 0):
            raise ValueError(f'AudioCodec: sample_rate must be a positive int or None, got {sample_rate!r}')
        if channels is not None and not (isinstance(channels, (int, np.integer)) and int(channels) > 0):
            raise ValueError(f'AudioCodec: channels must be a positive int or None, got {channels!r}')
        if format not in _FORMATS:
            raise ValueError(f"AudioCodec: format must be 'flac' or 'wav', got {format!r}")
        self._sample_rate = None if sample_rate is None else int(sample_rate)
        self._channels = None if channels is None else int(channels)
        self._mono = bool(mono)
        self._format = format

    @property
    def sample_rate(self) -> int | None:
        """The rate rows are delivered at (None: each file's own)."""
        return self._sample_rate

    @property
    def channels(self) -> int | None:
        """The channels delivered (None: the file's)."""
        return self._channels

    @property
    def mono(self) -> bool:
        """Rows are ``(samples,)``: the mean of the channels."""
        return self._mono

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, 'sample_rate': self._sample_rate, 'channels': self._channels,
                'mono': self._mono, 'layout': self._layout, 'format': self._format}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> AudioCodec:
        return cls(description.get('sample_rate'), description.get('channels'), bool(description.get('mono')),
                   description.get('layout', 'bytes'), description.get('format', 'flac'))

    def check_available(self, operation: Literal['encode', 'decode']) -> None:
        """Decoding needs PyAV or soundfile (soxr is asked for when a file needs resampling)."""
        if operation == 'decode':
            try:
                import_media('av', 'decoding audio')
            except MissingDependencyError:
                import_media('soundfile', 'decoding audio')

    def _decode_payload(self, field: Any, payload: memoryview, key: int, builder: ColumnBuilder | None,
                        row: int | None) -> np.ndarray:
        samples, rate = decode_audio(field, payload, row)
        try:
            samples = to_channels(samples, self._channels, self._mono)
        except ValueError as err:
            raise decode_error(field, 'audio', payload, row, err) from err
        if self._sample_rate is None:
            return samples
        return resample(samples.reshape(-1, samples.shape[-1]), rate, self._sample_rate).reshape(
            *samples.shape[:-1], -1)

    def _encode_array(self, field: Any, value: Any) -> bytes:
        rate = self._sample_rate
        if isinstance(value, dict) and 'array' in value:
            rate = value.get('sampling_rate', rate)
            value = value['array']
        if not isinstance(value, np.ndarray) or value.ndim not in (1, 2) or value.dtype.kind not in 'if':
            raise SchemaError(f'field {_field_name(field)}: audio is an array of samples ((samples,) or (channels, '
                              f'samples), int16 or float), the bytes of an audio file, a path or a dict; got '
                              f'{_describe(value)}')
        if rate is None:
            raise SchemaError(f'field {_field_name(field)}: writing samples needs their rate: give the codec a '
                              f"sample_rate, or write {{'array': samples, 'sampling_rate': rate}}")
        kind = 'int16' if value.dtype == np.int16 else 'float'
        if kind == 'float' and value.dtype.kind != 'f':
            raise SchemaError(f'field {_field_name(field)}: integer samples must be int16, got {value.dtype}')
        soundfile = import_media('soundfile', 'writing audio')
        file_format, subtypes = _FORMATS[self._format]
        buffer = io.BytesIO()
        try:
            soundfile.write(buffer, value.T if value.ndim == 2 else value, int(rate), format=file_format,
                            subtype=subtypes[kind])
        except Exception as err:
            raise CodecError(f'field {_field_name(field)}: could not write {value.shape} {value.dtype} samples as '
                             f'{self._format}: {err}') from err
        return buffer.getvalue()

    def __str__(self) -> str:
        return (f'AudioCodec(sample_rate={self._sample_rate}, channels={self._channels}, mono={self._mono}, '
                f'layout={self._layout!r})')


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f'a {value.shape} {value.dtype} array'
    return type(value).__name__
