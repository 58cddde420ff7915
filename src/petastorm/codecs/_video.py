"""The video codec: a column of video files (or Hugging Face ``Video`` structs) decoded to sampled RGB frames."""

from __future__ import annotations

import io
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from petastorm.codecs._base import ColumnBuilder, _field_name
from petastorm.codecs._frame_sampling import FrameSampling
from petastorm.codecs._media import MediaCodec, MediaLayout, import_media, row_rng
from petastorm.codecs._video_decode import decode_frames
from petastorm.errors import CodecError, SchemaError


class VideoCodec(MediaCodec):
    """Video files (MP4, MKV, WebM...; H.264, HEVC, VP9, AV1...) decoded to uint8 RGB frames ``(frames, H, W, 3)``.

    Only the frames asked for are decoded (see :mod:`petastorm.codecs._frame_sampling`): every frame by default, every
    ``stride``-th one, a clip of ``num_frames`` frames ``stride`` apart from a ``start`` (``'first'``, ``'middle'``,
    a frame number, or ``'random'``), the frames at ``indices``, or those shown at ``timestamps`` (seconds). A random
    start is drawn from the reader's seed, the epoch and the row's place in the dataset, so a seeded reader draws
    the same clips for every pool kind, and a reader restored from a saved position draws what the first one drew.
    Decoding seeks to the keyframe before the frames wanted and decodes forward only as far as they go, with one
    decoder thread per worker (``petastorm.codecs._video_decode``). A column whose rows have one shape is one
    ``(rows, frames, H, W, 3)`` array, else an object array of the rows' arrays.

    Writing takes the encoded files' bytes as they are, a path (``layout='hf'``), a ``{'bytes', 'path'}`` dict, or
    frames ``(frames, H, W, 3)`` uint8, encoded as H.264 in MP4 at ``frame_rate`` with a keyframe every
    ``keyframe_interval`` frames and quality ``crf`` (``crf=0`` writes lossless RGB frames: libx264rgb).

    Args:
        num_frames: frames of a clip (None: to the end).
        stride: frames between two frames taken.
        start: where a clip starts: ``'first'``, ``'middle'``, ``'random'`` or a frame number.
        indices: decode these frame numbers instead.
        timestamps: decode the frames shown at these times (seconds) instead.
        layout: ``'bytes'`` (a binary column of files) or ``'hf'`` (Hugging Face's struct of bytes and path).
        frame_rate: frames per second of the videos written from arrays.
        keyframe_interval: frames between keyframes of the videos written (the group of pictures).
        crf: H.264 quality of the videos written (0: lossless, 23: libx264's default).

    Example::

        UnischemaField('clip', np.uint8, (16, None, None, 3), VideoCodec(num_frames=16, start='random'), False)
    """

    codec_name = 'video'
    media_kind = 'video'

    def __init__(self, num_frames: int | None = None, stride: int = 1, start: str | int = 'first',
                 indices: Sequence[int] | None = None, timestamps: Sequence[float] | None = None,
                 layout: MediaLayout = 'bytes', frame_rate: float = 30, keyframe_interval: int = 30,
                 crf: int = 18) -> None:
        super().__init__(layout)
        self._sampling = FrameSampling.of(num_frames, stride, start, indices, timestamps)
        if not (isinstance(frame_rate, (int, float, np.integer, np.floating)) and 0 < frame_rate <= 1000):
            raise ValueError(f'VideoCodec: frame_rate must be a number of frames per second, got {frame_rate!r}')
        if not (isinstance(keyframe_interval, (int, np.integer)) and keyframe_interval > 0):
            raise ValueError(f'VideoCodec: keyframe_interval must be a positive int, got {keyframe_interval!r}')
        if not (isinstance(crf, (int, np.integer)) and 0 <= crf <= 51):
            raise ValueError(f'VideoCodec: crf must be an int in [0, 51], got {crf!r}')
        self._frame_rate = frame_rate
        self._keyframe_interval = int(keyframe_interval)
        self._crf = int(crf)

    @property
    def sampling(self) -> FrameSampling:
        """Which frames are decoded."""
        return self._sampling

    def to_json(self) -> dict[str, Any]:
        return {'codec': self.codec_name, **self._sampling.to_json(), 'layout': self._layout,
                'frame_rate': self._frame_rate, 'keyframe_interval': self._keyframe_interval, 'crf': self._crf}

    @classmethod
    def from_json(cls, description: dict[str, Any]) -> VideoCodec:
        return cls(description.get('num_frames'), description.get('stride', 1), description.get('start', 'first'),
                   description.get('indices'), description.get('timestamps'), description.get('layout', 'bytes'),
                   description.get('frame_rate', 30), description.get('keyframe_interval', 30),
                   description.get('crf', 18))

    def check_available(self, operation: Literal['encode', 'decode']) -> None:
        """Decoding needs PyAV."""
        if operation == 'decode':
            import_media('av', 'decoding video')

    def _decode_payload(self, field: Any, payload: memoryview, key: int, builder: ColumnBuilder | None,
                        row: int | None) -> np.ndarray:
        def reserve(shape: tuple[int, ...]) -> np.ndarray | None:
            return None if builder is None else builder.reserve(shape, np.dtype(np.uint8))

        return decode_frames(field, payload, self._sampling, lambda: row_rng(key), row, reserve)

    def _encode_array(self, field: Any, value: Any) -> bytes:
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 4 or value.shape[3] != 3 \
                or not len(value):
            raise SchemaError(f'field {_field_name(field)}: a video is uint8 RGB frames (frames, height, width, 3), '
                              f'the bytes of a video file, a path or a dict; got '
                              f'{type(value).__name__ if not isinstance(value, np.ndarray) else value.dtype}'
                              f'{"" if not isinstance(value, np.ndarray) else " " + str(value.shape)}')
        try:
            return encode_h264(value, self._frame_rate, self._keyframe_interval, self._crf)
        except Exception as err:
            raise CodecError(f'field {_field_name(field)}: could not encode {value.shape} frames as H.264: '
                             f'{err}') from err

    def __str__(self) -> str:
        sampling = str(self._sampling)
        return f'VideoCodec({sampling + ", " if sampling else ""}layout={self._layout!r})'


def encode_h264(frames: np.ndarray, frame_rate: float, keyframe_interval: int, crf: int) -> bytes:
    """``frames`` ``(n, H, W, 3)`` uint8 as an H.264 MP4 file (yuv420p, or lossless RGB with ``crf=0``)."""
    av = import_media('av', 'writing video')
    lossless = crf == 0
    height, width = frames.shape[1:3]
    if not lossless and (height % 2 or width % 2):
        raise ValueError(f'H.264 in yuv420p needs an even width and height, got {width}x{height} (crf=0 takes any)')
    buffer = io.BytesIO()
    with av.open(buffer, mode='w', format='mp4') as container:
        stream = container.add_stream('libx264rgb' if lossless else 'libx264',
                                      rate=Fraction(frame_rate).limit_denominator(1001))
        stream.width, stream.height = width, height
        stream.pix_fmt = 'rgb24' if lossless else 'yuv420p'
        stream.codec_context.gop_size = keyframe_interval
        stream.codec_context.options = {'crf': str(crf), 'preset': 'veryfast',
                                        'x264-params': f'keyint={keyframe_interval}:min-keyint={keyframe_interval}'
                                                       f':scenecut=0'}
        for picture in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(picture), format='rgb24')):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()
