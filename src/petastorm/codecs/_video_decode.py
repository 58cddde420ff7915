"""Decoding chosen frames of a video in memory with PyAV: from the keyframe before each, no further than needed.

The stream's packets are read once (demuxing copies compressed bytes, it decodes nothing); their times say each
frame's number in presentation order and where the keyframes are. For the frames wanted, in time order, the decoder
starts at the last keyframe at or before the first of them, decodes forward until it has them, and jumps to the
next keyframe only when a wanted frame lies past it (the decoder's buffers are flushed, as a seek would). Only the
wanted frames are converted to RGB, and frames no other frame refers to are skipped unless wanted. A clip of 8
consecutive frames of a 120-frame video with a keyframe every 30 frames decodes about 25 frames instead of 120, fewer
with B-frames.

The decoder and the RGB conversion run with one thread each (``thread_count = 1``, ``threads=1``): the reader's
workers are the parallelism, so a pool of N workers uses N cores, not N times FFmpeg's own threads. PyAV releases
the GIL while FFmpeg decodes and converts, so the thread pool's workers decode at once. The frames equal those of
PyAV's decoding of the whole stream (the tests compare them): decoding from a keyframe gives the same pictures as
decoding from the start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.codecs._frame_sampling import FrameSampling
from petastorm.codecs._media import decoding_stream


@dataclass
class _Packets:
    """A video stream's packets in decode order, and what their times say.

    Attributes:
        packets: the packets holding data, in decode order.
        times: each packet's presentation time (its decode time when it has none).
        frame_pts: each frame's presentation time (stream time base), sorted: frame ``i`` is ``frame_pts[i]``.
        key_pts: the keyframes' presentation times, sorted.
        key_positions: the keyframes' places in ``packets``, in the order of ``key_pts``.
        seconds: the stream's time base as a float.
    """

    packets: list[Any]
    times: list[int]
    frame_pts: np.ndarray
    key_pts: np.ndarray
    key_positions: np.ndarray
    seconds: float


def decode_frames(field: Any, payload: memoryview, sampling: FrameSampling,
                  rng: Callable[[], np.random.Generator], row: int | None,
                  reserve: Callable[[tuple[int, ...]], np.ndarray | None] | None = None) -> np.ndarray:
    """The frames ``sampling`` picks from the encoded video ``payload``, as one ``(frames, H, W, 3)`` uint8 array.

    Args:
        field: the field (for messages).
        payload: the encoded file.
        sampling: which frames.
        rng: makes the row's random generator.
        row: the row of the column (for messages).
        reserve: gives the array to decode into for a shape, when the column has room for it (else None).

    Raises:
        CodecError: the bytes are not a video, have no video stream, or a wanted frame does not decode.
    """
    with decoding_stream(field, 'video', payload, row) as (container, stream):
        packets = _read_packets(container, stream)
        wanted = sampling.pick(packets.frame_pts * packets.seconds, rng)
        out_shape = (len(wanted), stream.codec_context.height, stream.codec_context.width, 3)
        out = reserve(out_shape) if reserve is not None else None
        out = np.empty(out_shape, dtype=np.uint8) if out is None else out
        _decode_into(stream.codec_context, packets, packets.frame_pts[wanted], out, _rgb_converter())
    return out


def _read_packets(container: Any, stream: Any) -> _Packets:
    """The stream's packets and the times of its frames and keyframes (nothing is decoded)."""
    packets = [packet for packet in container.demux(stream) if packet.size]
    times = [packet.pts if packet.pts is not None else packet.dts for packet in packets]
    if any(t is None for t in times):
        raise ValueError('the video stream has packets without a time; cannot number its frames')
    pts = np.asarray(times, dtype=np.int64)
    keys = np.flatnonzero([packet.is_keyframe for packet in packets])
    order = np.argsort(pts[keys], kind='stable')
    return _Packets(packets, times, np.sort(pts), pts[keys][order], keys[order], float(stream.time_base))


def _rgb_converter() -> Callable[[Any], np.ndarray]:
    """Makes a decoded frame's RGB pixels, as ``frame.to_ndarray(format='rgb24')`` does (the same pixels).

    One converter serves every frame of a video (``to_ndarray`` makes a new one per frame), and it converts in the
    calling thread: by default swscale starts a thread per core for each conversion, which the reader's workers
    would multiply.
    """
    import av

    reformatter = av.video.reformatter.VideoReformatter()
    return lambda frame: reformatter.reformat(frame, format='rgb24', threads=1).to_ndarray()


def _decode_into(context: Any, packets: _Packets, wanted_pts: np.ndarray, out: np.ndarray,
                 rgb: Callable[[Any], np.ndarray]) -> None:
    """Decode the frames of ``wanted_pts`` (in any order, repeats allowed) into the rows of ``out``."""
    decoding = _Decoding(context, packets, wanted_pts, out, rgb)
    position = -1  # the next packet to send; -1: the decoder has not started
    for target in sorted(decoding.slots):
        if target in decoding.found:
            continue
        start = _keyframe_before(packets, target)
        if position < 0 or start > position:  # a keyframe lies ahead: jump to it instead of decoding up to it
            if position > 0:
                context.flush_buffers()
            position = start
        position = decoding.until(position, target)


def _keyframe_before(packets: _Packets, pts: int) -> int:
    """The place in the packets of the last keyframe shown at or before ``pts`` (0 when none is)."""
    index = int(np.searchsorted(packets.key_pts, pts, side='right')) - 1
    return int(packets.key_positions[index]) if index >= 0 else 0


class _Decoding:
    """The decoder of one video at work: the wanted frames, those found, where they go.

    Frames that are not wanted and that no other frame refers to (most B-frames) are skipped by the decoder
    (FFmpeg's ``skip_frame = NONREF``, set per packet): no frame's pixels depend on them, so the frames wanted are
    the same, and the frames on the way from a keyframe cost less.
    """

    def __init__(self, context: Any, packets: _Packets, wanted_pts: np.ndarray, out: np.ndarray,
                 rgb: Callable[[Any], np.ndarray]) -> None:
        self.context, self.packets, self.out, self.rgb = context, packets.packets, out, rgb
        self.slots: dict[int, list[int]] = {}
        for slot, pts in enumerate(wanted_pts.tolist()):
            self.slots.setdefault(pts, []).append(slot)
        self.skip = [time not in self.slots for time in packets.times]  # per packet: may the decoder skip it
        self.found: set[int] = set()

    def until(self, position: int, target: int) -> int:
        """Send packets from ``position`` until the frame of time ``target`` came out; the next position.

        Every wanted frame that comes out on the way is converted into its rows of ``out``. After the end of the
        stream the decoder is flushed and the next position is -1 (start again at a keyframe).

        Raises:
            ValueError: the stream ended without that frame.
        """
        count = len(self.packets)
        while target not in self.found:
            if position >= count:
                frames = self.context.decode(None)  # the end: the frames the decoder still holds
            else:
                self.context.skip_frame = 'NONREF' if self.skip[position] else 'DEFAULT'
                frames = self.context.decode(self.packets[position])
            position += 1
            for frame in frames:
                self._keep(frame)
            if position > count and target not in self.found:
                raise ValueError(f'the frame at time {target} of the stream did not decode')
        if position > count:
            self.context.flush_buffers()  # drained: ready to start again at a keyframe
            return -1
        return position

    def _keep(self, frame: Any) -> None:
        slots = self.slots.get(frame.pts)
        if slots is None or frame.pts in self.found:
            return
        self.found.add(frame.pts)
        picture = self.rgb(frame)
        for slot in slots:
            self.out[slot] = picture
