"""Audio and video fields through Ray Data: the read tasks decode them (Ray reads without a seed: its clips are runs
of the video's frames, drawn anew by each read)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip('av')
pytest.importorskip('soundfile')
ray = pytest.importorskip('ray')

from petastorm import make_batch_reader, write_dataset  # noqa: E402
from petastorm.codecs import AudioCodec, VideoCodec  # noqa: E402
from petastorm.ray import read_petastorm  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402
from support.media import reference_frames, tone, video_file  # noqa: E402
from support.ray_session import start_ray, stop_ray  # noqa: E402

Schema = Unischema('RayMedia', [
    UnischemaField('id', np.int64, (), None, False),
    UnischemaField('speech', np.float32, (None,), AudioCodec(sample_rate=8000, mono=True), False),
    UnischemaField('clip', np.uint8, (3, None, None, 3), VideoCodec(num_frames=3, start='random'), False),
])


@pytest.fixture(scope='module')
def ray_cluster():
    start_ray(__name__)
    yield
    stop_ray()


def test_ray_reads_decoded_audio_and_the_readers_clips(ray_cluster, tmp_path):
    url = (tmp_path / 'media').as_uri()
    video = video_file(20)
    rows = [{'id': i, 'speech': tone(0.05 + 0.01 * i, 8000, seed=i)[0], 'clip': video} for i in range(6)]
    write_dataset(url, Schema, rows, row_group_size_mb=0.01, progress=False)
    with make_batch_reader(url) as reader:
        expected = {int(i): s for batch in reader for i, s in zip(batch.id, batch.speech, strict=True)}
    frames = reference_frames(video)
    got = read_petastorm(url).take_all()
    assert sorted(row['id'] for row in got) == list(range(6))
    for row in got:
        np.testing.assert_array_equal(row['speech'], expected[row['id']])
        assert row['clip'].shape == (3, 48, 64, 3)
        assert any(np.array_equal(frames[s:s + 3], row['clip']) for s in range(18))
