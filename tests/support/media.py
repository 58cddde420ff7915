"""Audio and video files made in the tests (PyAV and soundfile encode them; no media file is shipped), and the
reference decodes the codecs are compared with: PyAV decoding the whole file, as a plain loop would.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np


def tone(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """int16 samples ``(channels, n)``: a sine per channel plus noise (each channel differs)."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    waves = [0.3 * np.sin(2 * np.pi * (220 + 110 * c + 7 * seed) * t) for c in range(channels)]
    x = np.stack(waves) + 0.05 * rng.standard_normal((channels, n))
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


def audio_file(samples: np.ndarray, rate: int, file_format: str = 'FLAC', subtype: str = 'PCM_16') -> bytes:
    """A FLAC or WAV file of ``samples`` ``(channels, n)`` written by soundfile."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples.T, rate, format=file_format, subtype=subtype)
    return buffer.getvalue()


def pyav_audio(samples: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """A file of int16 ``samples`` ``(channels, n)`` encoded by FFmpeg through PyAV (mp3, ogg/opus, adts/aac...)."""
    import av

    layout = {1: 'mono', 2: 'stereo'}[samples.shape[0]]
    buffer = io.BytesIO()
    with av.open(buffer, 'w', format=container) as output:
        stream = output.add_stream(codec, rate=rate)
        stream.layout = layout
        resampler = av.AudioResampler(format=stream.codec_context.format, layout=layout, rate=rate,
                                      frame_size=stream.codec_context.frame_size or None)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format='s16p', layout=layout)
        frame.sample_rate = rate
        for chunk in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(chunk):
                output.mux(packet)
        for packet in stream.encode(None):
            output.mux(packet)
    return buffer.getvalue()


def moving_frames(count: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """uint8 RGB frames ``(count, height, width, 3)`` of a textured picture that moves: every frame differs."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    picture = np.repeat(np.repeat(base, 8, axis=0), 8, axis=1)[:height, :width]
    return np.stack([np.roll(picture, 3 * i, axis=1) for i in range(count)])


def video_file(count: int = 60, width: int = 64, height: int = 48, fps: int = 30, gop: int = 30, seed: int = 0,
               codec: str = 'libx264', container: str = 'mp4', bframes: int = 2, frames: np.ndarray | None = None,
               pix_fmt: str = 'yuv420p') -> bytes:
    """A video of :func:`moving_frames` (or ``frames``) encoded through PyAV: H.264 in MP4 by default, a keyframe
    every ``gop`` frames, with B-frames (frames decoded out of presentation order)."""
    import av

    pictures = moving_frames(count, width, height, seed) if frames is None else frames
    buffer = io.BytesIO()
    with av.open(buffer, 'w', format=container) as output:
        stream = output.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = pictures.shape[2], pictures.shape[1], pix_fmt
        stream.codec_context.gop_size = gop
        if codec.startswith('libx264'):
            stream.codec_context.options = {
                'preset': 'veryfast', 'crf': '23',
                'x264-params': f'keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}'}
        elif codec == 'libvpx-vp9':
            stream.codec_context.options = {'deadline': 'realtime', 'cpu-used': '8', 'g': str(gop)}
        for picture in pictures:
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format='rgb24')):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def reference_frames(payload: bytes) -> np.ndarray:
    """Every frame of the video, decoded from the start by PyAV, as RGB ``(frames, H, W, 3)``."""
    import av

    with av.open(io.BytesIO(payload)) as container:
        return np.stack([frame.to_ndarray(format='rgb24') for frame in container.decode(video=0)])


def reference_frame_times(payload: bytes) -> np.ndarray:
    """Each frame's time in seconds (presentation order), from PyAV's decode of the whole video."""
    import av

    with av.open(io.BytesIO(payload)) as container:
        stream = container.streams.video[0]
        return np.array([float(frame.pts * stream.time_base) for frame in container.decode(stream)])


def reference_audio(payload: bytes) -> tuple[np.ndarray, int]:
    """The file's samples as PyAV decodes and converts them to float planar: ``(channels, n)`` float32, rate."""
    import av

    with av.open(io.BytesIO(payload)) as container:
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format='fltp')
        parts = [converted.to_ndarray() for frame in container.decode(stream)
                 for converted in resampler.resample(frame)]
        parts += [converted.to_ndarray() for converted in resampler.resample(None)]
        return np.concatenate(parts, axis=1), stream.codec_context.sample_rate
