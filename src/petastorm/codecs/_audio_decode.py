"""Decoding an audio file in memory to float32 samples ``(channels, samples)``, and changing its rate and channels.

Two decoders, each used where it is the faster and gives the same values (``benchmarks/media_bench.py`` measures
them; the tests compare them):

* soundfile (libsndfile) for FLAC and WAV files, recognised by their first bytes;
* PyAV (FFmpeg) for everything else (MP3, AAC/M4A, Opus, Vorbis, ...), and for FLAC and WAV without soundfile.

Integer samples become floats as both libraries make them: divided by 2^15 (16 bits) or 2^31 (24 and 32 bits,
which FFmpeg keeps in 32 bits), so a FLAC of int16 samples decodes to exactly ``samples / 32768``. Resampling is
soxr's (``'HQ'`` quality); a mono downmix is the mean of the channels (what ``datasets`` did before version 4).
Both libraries release the GIL while they decode.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from petastorm.codecs._media import decode_error, decoding_stream, import_media

# Divisors of PyAV's integer sample formats (FFmpeg's own conversion to float).
_SCALE = {'u8': 128.0, 's16': 32768.0, 's32': 2147483648.0, 's64': 9223372036854775808.0}


def sniff_soundfile_format(payload: memoryview) -> str | None:
    """``'FLAC'`` or ``'WAV'`` when the bytes start as such a file, else None."""
    head = bytes(payload[:12])
    if head[:4] == b'fLaC':
        return 'FLAC'
    if head[:4] == b'RIFF' and head[8:12] == b'WAVE':
        return 'WAV'
    return None


def decode_audio(field: Any, payload: memoryview, row: int | None) -> tuple[np.ndarray, int]:
    """``(samples, rate)``: the file's float32 samples, ``(channels, samples)``, and its sampling rate.

    Raises:
        CodecError: the bytes are not an audio file, or have no audio stream.
    """
    if sniff_soundfile_format(payload) is not None and _soundfile() is not None:
        try:
            return _decode_soundfile(payload)
        except Exception as err:
            raise decode_error(field, 'audio', payload, row, err) from err
    return _decode_pyav(field, payload, row)


def _soundfile() -> Any:
    try:
        import soundfile
    except (ImportError, OSError):  # OSError: the wheel's libsndfile did not load
        return None
    return soundfile


def _decode_soundfile(payload: memoryview) -> tuple[np.ndarray, int]:
    samples, rate = _soundfile().read(io.BytesIO(payload), dtype='float32', always_2d=True)
    return np.ascontiguousarray(samples.T), int(rate)


def _decode_pyav(field: Any, payload: memoryview, row: int | None) -> tuple[np.ndarray, int]:
    with decoding_stream(field, 'audio', payload, row) as (container, stream):
        parts = [_float_planar(frame) for frame in container.decode(stream)]
        rate = int(stream.codec_context.sample_rate or stream.rate or 0)
        channels = stream.codec_context.channels
    if not parts:
        return np.zeros((channels, 0), dtype=np.float32), rate
    return (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)), rate


def _float_planar(frame: Any) -> np.ndarray:
    """One decoded frame's samples as float32 ``(channels, samples)``."""
    name = frame.format.name
    values = frame.to_ndarray()
    if not frame.format.is_planar:  # interleaved: (1, samples * channels)
        values = values.reshape(-1, len(frame.layout.channels)).T
    base = name.rstrip('p')
    if base in ('flt', 'dbl'):
        return np.ascontiguousarray(values, dtype=np.float32)
    converted = values.astype(np.float32)
    if base == 'u8':
        converted -= 128.0
    converted *= np.float32(1.0 / _SCALE[base])
    return converted


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` ``(channels, n)`` at ``rate`` resampled to ``target`` with soxr (unchanged when equal)."""
    if rate == target or samples.shape[1] == 0:
        return samples
    soxr = import_media('soxr', 'resampling audio')
    resampled = soxr.resample(np.ascontiguousarray(samples.T), rate, target, quality='HQ')
    return np.ascontiguousarray(resampled.reshape(len(resampled), -1).T, dtype=np.float32)


def to_channels(samples: np.ndarray, channels: int | None, mono: bool) -> np.ndarray:
    """The samples with the channels asked for: ``(samples,)`` for mono, ``(channels, samples)`` otherwise.

    Raises:
        ValueError: ``channels`` cannot be made from the file's (only a downmix to 1, or copies of one channel).
    """
    have = samples.shape[0]
    if mono or channels == 1:
        single = samples[0] if have == 1 else samples.mean(axis=0, dtype=np.float32)
        return single if mono else single[np.newaxis]
    if channels is None or channels == have:
        return samples
    if have == 1:
        return np.repeat(samples, channels, axis=0)
    raise ValueError(f'the file has {have} channels; {channels} cannot be made of them (ask for 1, for the '
                     f'mono mix, or for the file\'s own number)')
