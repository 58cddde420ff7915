"""Hugging Face ``Audio`` and ``Video`` columns, and a LeRobot-like layout (episode videos beside Parquet files).

The ``datasets`` files are written by ``datasets`` itself (``Dataset.cast`` to the features, then ``to_parquet``:
both work without torchcodec; decoding them in ``datasets`` needs torchcodec, which does not load here, so the values
are compared with PyAV's decode of the stored bytes). Rows holding a path only are written with pyarrow and the
``huggingface`` metadata ``datasets`` wrote, since ``to_parquet`` embeds the files it finds.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ['HF_HUB_OFFLINE'] = '1'
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
datasets = pytest.importorskip('datasets')
pytest.importorskip('av')
soxr = pytest.importorskip('soxr')

from petastorm import make_batch_reader, make_reader  # noqa: E402
from petastorm.codecs import AudioCodec, VideoCodec  # noqa: E402
from support.media import audio_file, reference_audio, reference_frame_times, reference_frames, tone, video_file  # noqa: E402

RATES = [16000, 44100, 8000, 22050]


def _write_hf(path, columns: dict, features: dict) -> pa.Table:
    dataset = datasets.Dataset.from_dict(columns).cast(datasets.Features(features))
    dataset.to_parquet(str(path))
    return pq.read_table(path)


@pytest.fixture(scope='module')
def speech(tmp_path_factory):
    """A speech-like dataset: FLAC clips at several rates and lengths, an ``Audio(sampling_rate=16000)`` column."""
    path = tmp_path_factory.mktemp('hf_audio') / 'train.parquet'
    clips = [audio_file(tone(0.1 + 0.03 * i, RATES[i % 4], channels=1 + i % 2, seed=i), RATES[i % 4])
             for i in range(8)]
    table = _write_hf(path, {'audio': [{'bytes': c, 'path': f'clip{i}.flac'} for i, c in enumerate(clips)],
                             'text': [f'utterance {i}' for i in range(8)]},
                      {'audio': datasets.Audio(sampling_rate=16000), 'text': datasets.Value('string')})
    return f'file://{path}', clips, table


def _expected_speech(payload: bytes, rate: int = 16000) -> np.ndarray:
    samples, native = reference_audio(payload)
    mono = samples.mean(axis=0, dtype=np.float32) if len(samples) > 1 else samples[0]
    return mono if native == rate else soxr.resample(mono, native, rate, quality='HQ')


def test_an_audio_feature_is_decoded_mono_at_its_sampling_rate(speech):
    url, clips, table = speech
    assert 'Audio' in table.schema.metadata[b'huggingface'].decode()
    with make_batch_reader(url, shuffle_row_groups=False) as reader:
        field = reader.schema.fields['audio']
        assert field.codec == AudioCodec(sample_rate=16000, mono=True, layout='hf')
        assert (field.numpy_dtype, field.shape) == (np.float32, (None,))
        batch = next(iter(reader))
    for i, samples in enumerate(batch.audio):
        np.testing.assert_array_equal(samples, _expected_speech(clips[i]))
    assert list(batch.text) == [f'utterance {i}' for i in range(8)]


def test_speech_reaches_torch_padded_with_its_lengths(speech):
    pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader

    url, clips, table = speech
    texts = table.column('text').to_pylist()
    with BatchedDataLoader(make_batch_reader(url, schema_fields=['audio'], shuffle_row_groups=False),
                           batch_size=4, variable_length='pad') as loader:
        batches = list(loader)
    lengths = [length for batch in batches for length in batch['audio_mask'].sum(dim=1).tolist()]
    assert lengths == [len(_expected_speech(c)) for c in clips]
    assert batches[0]['audio'].shape == (4, max(lengths[:4]))
    assert len(texts) == 8


def test_channels_and_undecoded_features(tmp_path):
    clips = [audio_file(tone(0.1, 8000, channels=2, seed=i), 8000) for i in range(3)]
    _write_hf(tmp_path / 'stereo.parquet', {'a': [{'bytes': c, 'path': None} for c in clips]},
                       {'a': datasets.Audio(num_channels=2)})
    with make_reader(f'file://{tmp_path}/stereo.parquet', shuffle_row_groups=False) as reader:
        assert reader.schema.fields['a'].shape == (2, None)
        rows = [row.a for row in reader]
    for clip, samples in zip(clips, rows, strict=True):
        np.testing.assert_array_equal(samples, reference_audio(clip)[0])
    _write_hf(tmp_path / 'raw.parquet', {'a': [{'bytes': clips[0], 'path': None}]}, {'a': datasets.Audio(decode=False)})
    with make_batch_reader(f'file://{tmp_path}/raw.parquet') as reader:
        assert reader.schema.fields['a'].codec.to_json()['codec'] == 'scalar'  # the struct, as stored
        assert next(iter(reader)).a['bytes'][0] == clips[0]


def test_a_video_feature_decodes_every_frame_or_the_frames_asked_for(tmp_path):
    videos = [video_file(20 + 5 * i, gop=8, seed=i) for i in range(3)]
    _write_hf(tmp_path / 'v.parquet', {'video': [{'bytes': v, 'path': f'v{i}.mp4'} for i, v in enumerate(videos)],
                                       'label': [0, 1, 0]},
              {'video': datasets.Video(), 'label': datasets.Value('int64')})
    url = f'file://{tmp_path}/v.parquet'
    with make_batch_reader(url, shuffle_row_groups=False) as reader:
        assert reader.schema.fields['video'].codec == VideoCodec(layout='hf')
        batch = next(iter(reader))
    for video, frames in zip(videos, batch.video, strict=True):
        np.testing.assert_array_equal(frames, reference_frames(video))
    clip = reader.schema.fields['video']._replace(shape=(6, None, None, 3),
                                                  codec=VideoCodec(num_frames=6, stride=2, start='middle'))
    with make_batch_reader(url, schema_fields=[clip, 'label'], shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    assert batch.video.shape == (3, 6, 48, 64, 3)
    for video, frames in zip(videos, batch.video, strict=True):
        times = reference_frame_times(video)
        np.testing.assert_array_equal(frames, reference_frames(video)[clip.codec.sampling.pick(times, lambda: None)])


def _lerobot_store(root, episodes: int = 3, fps: int = 10):
    """LeRobot's layout: a Parquet file of frames (episode, frame, timestamp) and one MP4 per episode beside it,
    and an episode table naming each episode's video by a path relative to it (Hugging Face's ``Video`` struct)."""
    (root / 'videos').mkdir(parents=True)
    lengths = [12 + 4 * e for e in range(episodes)]
    for e, length in enumerate(lengths):
        (root / 'videos' / f'episode_{e:06d}.mp4').write_bytes(video_file(length, fps=fps, gop=5, seed=e))
    frames = pa.table({'episode_index': np.repeat(np.arange(episodes), lengths),
                       'frame_index': np.concatenate([np.arange(n) for n in lengths]),
                       'timestamp': np.concatenate([np.arange(n) / fps for n in lengths]).astype(np.float32)})
    pq.write_table(frames, root / 'frames.parquet')
    probe = _write_hf(root / 'probe.parquet', {'image': [{'bytes': b'', 'path': None}]}, {'image': datasets.Video()})
    (root / 'probe.parquet').unlink()
    paths = [{'bytes': None, 'path': f'videos/episode_{e:06d}.mp4'} for e in range(episodes)]
    table = pa.table({'episode_index': np.arange(episodes), 'image': pa.array(paths, probe.schema.field('image').type)})
    pq.write_table(table.replace_schema_metadata(probe.schema.metadata), root / 'episodes.parquet')
    return frames


def _episode_video(root, episode: int) -> bytes:
    return (root / 'videos' / f'episode_{episode:06d}.mp4').read_bytes()


def test_a_lerobot_layout_reads_the_videos_beside_the_parquet_at_the_frames_timestamps(tmp_path):
    root = tmp_path / 'lerobot'
    frames = _lerobot_store(root)
    url = f'file://{root}/episodes.parquet'
    with make_reader(url, shuffle_row_groups=False) as reader:
        stored = reader.schema.fields['image']
        for row in reader:
            np.testing.assert_array_equal(row.image, reference_frames(_episode_video(root, row.episode_index)))
    # The frame table's timestamps of episode 1 pick exactly its frames by number.
    episode = frames.filter(pa.compute.equal(frames.column('episode_index'), 1))
    timestamps = episode.column('timestamp').to_pylist()[::3]
    at = stored._replace(codec=VideoCodec(timestamps=timestamps, layout='hf'))
    with make_batch_reader(url, schema_fields=['episode_index', at], shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    expected = reference_frames(_episode_video(root, 1))[episode.column('frame_index').to_numpy()[::3]]
    np.testing.assert_array_equal(batch.image[1], expected)


def test_episode_videos_as_mp4_bytes_in_a_column_and_a_missing_video_named(tmp_path):
    root = tmp_path / 'lerobot'
    _lerobot_store(root)
    videos = [_episode_video(root, e) for e in range(3)]
    pq.write_table(pa.table({'episode_index': [0, 1, 2], 'mp4': videos}), root / 'embedded.parquet')
    with make_batch_reader(f'file://{root}/embedded.parquet') as reader:
        stored_field = reader.schema.fields['mp4']
    clip = stored_field._replace(numpy_dtype=np.uint8, shape=(3, None, None, 3),
                                 codec=VideoCodec(num_frames=3, stride=2, start='random'))
    with make_batch_reader(f'file://{root}/embedded.parquet', schema_fields=['episode_index', clip], seed=2,
                           shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    for video, decoded in zip(videos, batch.mp4, strict=True):
        everything = reference_frames(video)
        assert any(np.array_equal(everything[s:s + 5:2], decoded) for s in range(len(everything) - 4))
    (root / 'videos' / 'episode_000002.mp4').unlink()
    with make_batch_reader(f'file://{root}/episodes.parquet') as reader, \
            pytest.raises(Exception, match=r"field 'image', row 2 of row group 0 of .*episodes.parquet: the video is "
                                           r"stored as the path 'videos/episode_000002.mp4' only, and no file is at"):
        list(reader)
