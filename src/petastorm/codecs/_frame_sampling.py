"""Which frames of a video a :class:`~petastorm.codecs.VideoCodec` decodes: a pure function of the video's frame times.

A :class:`FrameSampling` is one of four rules:

* every frame, or every ``stride``-th frame (``num_frames=None``);
* a clip: ``num_frames`` frames ``stride`` apart, from a ``start`` that is the first frame, the one that centres the
  clip, a fixed frame number, or drawn at random among the starts where the whole clip fits;
* ``indices``: those frame numbers (in presentation order, from 0);
* ``timestamps``: the frames shown at those times, in seconds of the stream (the last frame whose time is at or
  before the time, within :data:`TIME_TOLERANCE`; times before the first frame give the first one, times after the
  last frame the last one).

A clip that does not fit in a short video, and indices past its end, give fewer frames: the rows then differ in
length (see docs/media.md for how the loaders batch them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Seconds a requested time may fall short of a frame's time and still show that frame (float rounding of
#: ``frame_index / fps``); LeRobot checks its timestamps with the same tolerance.
TIME_TOLERANCE = 1e-4
_STARTS = ('first', 'middle', 'random')


@dataclass(frozen=True)
class FrameSampling:
    """Which frames to decode (see the module documentation); the default is every frame.

    Attributes:
        num_frames: frames of a clip (None: to the end of the video).
        stride: frames between two frames taken (1: consecutive frames).
        start: where the clip starts: ``'first'``, ``'middle'``, ``'random'`` or a frame number.
        indices: these frame numbers instead of a clip.
        timestamps: the frames shown at these times (seconds) instead of a clip.
    """

    num_frames: int | None = None
    stride: int = 1
    start: str | int = 'first'
    indices: tuple[int, ...] | None = None
    timestamps: tuple[float, ...] | None = None

    @classmethod
    def of(cls, num_frames: Any = None, stride: Any = 1, start: Any = 'first', indices: Any = None,
           timestamps: Any = None) -> FrameSampling:
        """A checked sampling from a codec's arguments.

        Raises:
            ValueError: naming the argument and what it takes.
        """
        if indices is not None and timestamps is not None:
            raise ValueError('VideoCodec: pass indices or timestamps, not both')
        if (indices is not None or timestamps is not None) and (num_frames is not None or stride != 1 or
                                                               start != 'first'):
            raise ValueError('VideoCodec: indices and timestamps choose the frames themselves; leave num_frames, '
                             'stride and start out')
        if num_frames is not None and not _positive_int(num_frames):
            raise ValueError(f'VideoCodec: num_frames must be a positive int or None, got {num_frames!r}')
        if not _positive_int(stride):
            raise ValueError(f'VideoCodec: stride must be a positive int, got {stride!r}')
        if not (start in _STARTS or (_integer(start) and int(start) >= 0)):
            raise ValueError(f"VideoCodec: start must be 'first', 'middle', 'random' or a frame number >= 0, "
                             f'got {start!r}')
        return cls(None if num_frames is None else int(num_frames), int(stride),
                   start if isinstance(start, str) else int(start), _indices(indices), _times(timestamps))

    @property
    def draws(self) -> bool:
        """The frames are drawn at random (a random clip start)."""
        return self.start == 'random' and self.indices is None and self.timestamps is None

    @property
    def fixed_length(self) -> int | None:
        """Frames every row has when the video is long enough (None: it depends on the video)."""
        if self.indices is not None:
            return len(self.indices)
        if self.timestamps is not None:
            return len(self.timestamps)
        return self.num_frames

    def pick(self, frame_times: np.ndarray, rng: Callable[[], np.random.Generator]) -> np.ndarray:
        """The frame numbers to decode, in the order they are delivered.

        Args:
            frame_times: each frame's time in seconds, in presentation order (sorted).
            rng: makes the row's random generator (called only for a random start).
        """
        count = len(frame_times)
        if self.timestamps is not None:
            wanted = np.asarray(self.timestamps, dtype=np.float64)
            shown = np.searchsorted(frame_times, wanted + TIME_TOLERANCE, side='right') - 1
            return np.clip(shown, 0, max(count - 1, 0)) if count else np.zeros(0, dtype=np.int64)
        if self.indices is not None:
            picked = np.asarray(self.indices, dtype=np.int64)
            return picked[picked < count]
        span = count if self.num_frames is None else (self.num_frames - 1) * self.stride + 1
        first = self._first(count, span, rng)
        stop = count if self.num_frames is None else min(count, first + span)
        return np.arange(first, stop, self.stride, dtype=np.int64)

    def _first(self, count: int, span: int, rng: Callable[[], np.random.Generator]) -> int:
        room = max(count - span, 0)  # starts after which the clip still fits
        if self.start == 'first':
            return 0
        if self.start == 'middle':
            return room // 2
        if self.start == 'random':
            return int(rng().integers(0, room + 1))
        return min(int(self.start), count)

    def to_json(self) -> dict[str, Any]:
        """What the codec's JSON description stores (the arguments that differ from the defaults)."""
        out: dict[str, Any] = {}
        if self.indices is not None:
            out['indices'] = list(self.indices)
        if self.timestamps is not None:
            out['timestamps'] = list(self.timestamps)
        if self.num_frames is not None:
            out['num_frames'] = self.num_frames
        if self.stride != 1:
            out['stride'] = self.stride
        if self.start != 'first':
            out['start'] = self.start
        return out

    def __str__(self) -> str:
        return ', '.join(f'{name}={value!r}' for name, value in self.to_json().items())


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _positive_int(value: Any) -> bool:
    return _integer(value) and int(value) > 0


def _indices(indices: Sequence[int] | None) -> tuple[int, ...] | None:
    if indices is None:
        return None
    values = list(indices)
    if not values or not all(_integer(i) and int(i) >= 0 for i in values):
        raise ValueError(f'VideoCodec: indices must be frame numbers >= 0 (at least one), got {indices!r}')
    return tuple(int(i) for i in values)


def _times(timestamps: Sequence[float] | None) -> tuple[float, ...] | None:
    if timestamps is None:
        return None
    values = list(timestamps)
    if not values or not all(isinstance(t, (int, float, np.integer, np.floating)) and np.isfinite(t)
                             for t in values):
        raise ValueError(f'VideoCodec: timestamps must be finite numbers of seconds (at least one), got '
                         f'{timestamps!r}')
    return tuple(float(t) for t in values)
