"""VideoCodec: the frames it decodes equal PyAV's decode of the whole video, for every way of sampling them and
several codecs; it decodes no further than the frames wanted; writing, JSON, and the errors.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow as pa
import pytest

av = pytest.importorskip('av')

import petastorm.codecs._video_decode as video_decode  # noqa: E402
from petastorm.codecs import CODECS_BY_NAME, VideoCodec, codec_from_json  # noqa: E402
from petastorm.codecs._frame_sampling import FrameSampling  # noqa: E402
from petastorm.codecs._video_decode import _decode_into, _read_packets, _rgb_converter  # noqa: E402
from petastorm.errors import CodecError, SchemaError  # noqa: E402
from petastorm.unischema import UnischemaField  # noqa: E402
from support.media import (  # noqa: E402
    moving_frames,
    pyav_audio,
    reference_frame_times,
    reference_frames,
    tone,
    video_file,
)

FIELD = UnischemaField('clip', np.uint8, (None, None, None, 3), VideoCodec(), False)
SAMPLINGS = [
    {}, {'stride': 7}, {'num_frames': 8}, {'num_frames': 8, 'start': 'middle'}, {'num_frames': 5, 'stride': 9,
                                                                                   'start': 13},
    {'num_frames': 8, 'start': 'random'}, {'indices': [59, 3, 31, 31, 0]}, {'timestamps': [0.0, 0.5, 1.0 / 3, 1.99]},
]


@pytest.fixture(scope='module')
def videos():
    """H.264 with B-frames and a keyframe every 10 frames, every frame a keyframe, VP9 in WebM, HEVC in MP4."""
    return {'h264': video_file(60, gop=10), 'intra': video_file(60, gop=1, bframes=0),
            'vp9': video_file(60, codec='libvpx-vp9', container='webm', gop=12),
            'hevc': video_file(60, codec='libx265', gop=15)}


def _expected(payload: bytes, sampling: dict, key: int) -> np.ndarray:
    from petastorm.codecs._media import row_rng

    picked = FrameSampling.of(**sampling).pick(reference_frame_times(payload), lambda: row_rng(key))
    return reference_frames(payload)[picked]


@pytest.mark.parametrize('kind', ['h264', 'intra', 'vp9', 'hevc'])
@pytest.mark.parametrize('sampling', SAMPLINGS, ids=[json.dumps(s) for s in SAMPLINGS])
def test_frames_equal_pyav_decoding_the_whole_video(videos, kind, sampling):
    payload = videos[kind]
    column = VideoCodec(**sampling).decode_column(FIELD, pa.array([payload, payload]), row_keys=[11, 12])
    for row, key in enumerate((11, 12)):
        np.testing.assert_array_equal(column[row], _expected(payload, sampling, key))


def test_sampling_laws():
    times = np.arange(120) / 30
    for seed in range(50):
        picked = FrameSampling.of(num_frames=8, stride=3, start='random').pick(
            times, lambda s=seed: np.random.default_rng(s))
        assert len(picked) == 8
        assert (np.diff(picked) == 3).all()
        assert picked[0] >= 0
        assert picked[-1] < 120
    starts = {int(FrameSampling.of(num_frames=8, start='random').pick(times, lambda s=s: np.random.default_rng(s))[0])
              for s in range(2000)}
    assert starts == set(range(113))  # every start where the clip fits, and no other
    assert FrameSampling.of(num_frames=8).pick(times[:5], lambda: None).tolist() == [0, 1, 2, 3, 4]  # short video
    assert FrameSampling.of(indices=[2, 200, 7]).pick(times, lambda: None).tolist() == [2, 7]
    assert FrameSampling.of(timestamps=[-1, 0.0333, 1 / 30, 0.05, 100]).pick(times, lambda: None).tolist() == [
        0, 1, 1, 1, 119]  # within the tolerance, at or before, clamped
    assert FrameSampling.of(num_frames=4, start='middle').pick(times, lambda: None).tolist() == [58, 59, 60, 61]
    assert FrameSampling.of(stride=50).pick(times, lambda: None).tolist() == [0, 50, 100]
    assert FrameSampling.of(num_frames=8, start='random').draws
    assert not FrameSampling.of(num_frames=8).draws


@pytest.mark.parametrize('arguments', [{'num_frames': 0}, {'stride': 0}, {'start': 'end'}, {'start': -1},
                                       {'indices': []}, {'indices': [1], 'num_frames': 2}, {'timestamps': [np.nan]},
                                       {'indices': [1], 'timestamps': [0.0]}])
def test_sampling_arguments_are_checked(arguments):
    with pytest.raises(ValueError, match='VideoCodec'):
        VideoCodec(**arguments)


class _CountingDecoder:
    """A decoder that counts the packets sent to it."""

    def __init__(self, context):
        self.context, self.sent = context, 0

    def decode(self, packet):
        self.sent += 1
        return self.context.decode(packet)

    def flush_buffers(self):
        self.context.flush_buffers()


def test_decoding_starts_at_the_keyframe_before_and_stops_after_the_last_frame_wanted():
    payload = video_file(120, gop=30)
    reference = reference_frames(payload)
    for first, expected_most in ((70, 30), (5, 16), (95, 35)):
        with av.open(io.BytesIO(payload)) as container:
            stream = container.streams.video[0]
            packets = _read_packets(container, stream)
            counting = _CountingDecoder(stream.codec_context)
            wanted = np.arange(first, first + 8)
            out = np.empty((8, *reference.shape[1:]), np.uint8)
            _decode_into(counting, packets, packets.frame_pts[wanted], out, _rgb_converter())
        np.testing.assert_array_equal(out, reference[wanted])
        # From the keyframe before (frame 60, 0, 90) to the clip's end, plus the decoder's delay of a few frames.
        assert counting.sent <= expected_most, (first, counting.sent)


def _threads() -> int:
    return len(os.listdir('/proc/self/task'))


@pytest.mark.skipif(not os.path.isdir('/proc/self/task') or (os.cpu_count() or 1) < 2,
                    reason='counts the threads of the process in /proc, on 2 cores or more')
def test_a_worker_decodes_in_its_own_thread_only(monkeypatch):
    """One decoder thread per reader worker: FFmpeg starts no threads of its own (its default starts one per core,
    which the workers would multiply), so N workers use N cores."""
    payload = video_file(60, 320, 240, gop=30)
    with av.open(io.BytesIO(payload)) as container:  # the control: FFmpeg's own threading is seen
        stream = container.streams.video[0]
        stream.thread_type = 'AUTO'
        before = _threads()
        during = max(_threads() for _ in container.decode(stream))
    assert during > before, 'FFmpeg started no decoder threads: this test could not see them'
    counts = []
    converter = video_decode._rgb_converter

    def counting_converter():
        convert = converter()
        return lambda frame: counts.append(_threads()) or convert(frame)

    monkeypatch.setattr(video_decode, '_rgb_converter', counting_converter)
    before = _threads()
    VideoCodec(num_frames=8, stride=4).decode_column(FIELD, pa.array([payload] * 2))
    assert counts
    assert max(counts) == before


def test_draws_follow_the_row_keys():
    payload = video_file(60, gop=10)
    codec = VideoCodec(num_frames=4, start='random')
    column = pa.array([payload] * 6)
    first = codec.decode_column(FIELD, column, row_keys=np.arange(6, dtype=np.uint64))
    again = codec.decode_column(FIELD, column, row_keys=np.arange(6, dtype=np.uint64))
    other = codec.decode_column(FIELD, column, row_keys=np.arange(100, 106, dtype=np.uint64))
    assert first.shape == (6, 4, 48, 64, 3)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert len({first[i].tobytes() for i in range(6)}) > 1  # rows draw differently


def test_lossless_writing_gives_back_the_frames():
    frames = moving_frames(12, 30, 21)  # odd sizes: lossless RGB takes any
    payload = VideoCodec(crf=0, keyframe_interval=4).encode(FIELD, frames)
    np.testing.assert_array_equal(VideoCodec().decode(FIELD, payload), frames)
    np.testing.assert_array_equal(VideoCodec(indices=[9, 2]).decode(FIELD, payload), frames[[9, 2]])
    lossy = VideoCodec(frame_rate=25).encode(FIELD, moving_frames(10, 32, 24))
    with av.open(io.BytesIO(lossy)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == 'h264'
        assert stream.average_rate == 25
    hf = VideoCodec(layout='hf')
    assert hf.encode(FIELD, 'episode_0.mp4') == {'bytes': None, 'path': 'episode_0.mp4'}
    assert hf.encode(FIELD, {'bytes': b'x', 'path': 'p'}) == {'bytes': b'x', 'path': 'p'}


@pytest.mark.parametrize('value', [np.zeros((4, 8, 8), np.uint8), np.zeros((2, 8, 8, 3), np.float32), [1, 2],
                                   np.zeros((0, 8, 8, 3), np.uint8)])
def test_writing_refuses_what_is_not_frames(value):
    with pytest.raises(SchemaError, match=r'field clip: a video is uint8 RGB frames \(frames, height, width, 3\)'):
        VideoCodec().encode(FIELD, value)


def test_odd_sizes_need_lossless_writing():
    from petastorm.errors import CodecError as Error

    with pytest.raises(Error, match='even width and height'):
        VideoCodec().encode(FIELD, moving_frames(3, 31, 20))


def test_json_round_trip_and_registry():
    codec = VideoCodec(num_frames=16, stride=2, start='random', layout='hf', frame_rate=15, crf=0)
    assert codec_from_json(json.loads(json.dumps(codec.to_json()))) == codec
    assert codec_from_json(VideoCodec(timestamps=[0.5, 1.0]).to_json()).sampling.timestamps == (0.5, 1.0)
    assert CODECS_BY_NAME['video'] is VideoCodec
    assert str(VideoCodec(num_frames=8, start='random')) == "VideoCodec(num_frames=8, start='random', layout='bytes')"


def test_errors_name_the_field_the_row_and_what_was_wrong():
    codec = VideoCodec()
    payload = video_file(10)
    with pytest.raises(CodecError, match=r'field clip \(row 1 of the column\): the stored value is not a decodable '
                                         r'video file \(500 bytes\)'):
        codec.decode_column(FIELD, pa.array([payload, b'\x00' * 500]))
    with pytest.raises(CodecError, match='it has no video stream'):
        codec.decode(FIELD, pyav_audio(tone(0.2, 8000), 8000, 'mp3', 'libmp3lame'))
    truncated = payload[:len(payload) // 2]
    with pytest.raises(CodecError, match='not a decodable video file'):
        codec.decode(FIELD, truncated)
    with pytest.raises(CodecError, match='video is stored in a binary column'):
        codec.decode_column(FIELD, pa.array(['text']))
