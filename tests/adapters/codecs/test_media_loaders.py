"""Audio and video fields written by write_dataset, read by every reader, pool kind and loader.

The values are compared with the samples written (lossless FLAC) and with PyAV's decode of the whole video; random
clips with themselves across pool kinds, reader kinds and a restored loader.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip('av')
pytest.importorskip('soundfile')

from petastorm import make_batch_reader, make_reader, write_dataset  # noqa: E402
from petastorm.codecs import AudioCodec, VideoCodec  # noqa: E402
from petastorm.errors import CodecError, DecodeFieldError  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402
from support.media import reference_frames, tone, video_file  # noqa: E402

ROWS = 24
CLIP = 4
MediaSchema = Unischema('MediaSchema', [
    UnischemaField('id', np.int64, (), None, False),
    UnischemaField('speech', np.float32, (None,), AudioCodec(sample_rate=16000, mono=True), False),
    UnischemaField('clip', np.uint8, (CLIP, None, None, 3), VideoCodec(num_frames=CLIP, start='random'), False),
])


def _samples(i: int) -> np.ndarray:
    return tone(0.05 + 0.01 * (i % 5), 16000, seed=i)[0]  # 800 to 1440 samples: rows differ in length


@pytest.fixture(scope='module')
def media(tmp_path_factory):
    """A store of 24 rows (several row groups): speech written as int16 arrays, clips from three videos."""
    videos = [video_file(30 + 10 * k, gop=10, seed=k) for k in range(3)]
    url = f'file://{tmp_path_factory.mktemp("media")}/store'
    rows = [{'id': i, 'speech': _samples(i), 'clip': videos[i % 3]} for i in range(ROWS)]
    write_dataset(url, MediaSchema, rows, row_group_size_mb=0.05, mode='overwrite')
    return url, [reference_frames(v) for v in videos]


def _clip_start(frames: np.ndarray, clip: np.ndarray) -> int:
    """Where ``clip`` is in the video's frames: it must be consecutive frames of it."""
    starts = [s for s in range(len(frames) - len(clip) + 1) if np.array_equal(frames[s:s + len(clip)], clip)]
    assert starts, 'the clip is not a run of the video\'s frames'
    return starts[0]


def _check_rows(ids, speech, clips, references) -> dict[int, int]:
    starts = {}
    for i, audio, clip in zip(ids, speech, clips, strict=True):
        np.testing.assert_array_equal(audio, _samples(int(i)) / np.float32(32768))
        starts[int(i)] = _clip_start(references[int(i) % 3], clip)
    return starts


def _batch_starts(url, references, pool, seed, shuffle_rows=True):
    starts = {}
    with make_batch_reader(url, reader_pool_type=pool, workers_count=2, seed=seed, shuffle_rows=shuffle_rows) as reader:
        for batch in reader:
            assert batch.clip.dtype == np.uint8
            assert batch.clip.shape[1:] == (CLIP, 48, 64, 3)
            starts.update(_check_rows(batch.id, batch.speech, batch.clip, references))
    return starts


@pytest.mark.parametrize('pool', ['dummy', 'thread', 'process'])
def test_every_reader_and_pool_kind_decodes_the_same_values_and_clips(media, pool):
    url, references = media
    starts = _batch_starts(url, references, pool, seed=5)
    with make_reader(url, reader_pool_type=pool, workers_count=2, seed=5) as reader:
        row_starts = {}
        for row in reader:
            row_starts.update(_check_rows([row.id], [row.speech], [row.clip], references))
    assert sorted(starts) == list(range(ROWS))
    assert row_starts == starts, 'the clips are drawn by the rows, not by the order or the reader kind'
    assert starts == _batch_starts(url, references, 'dummy', seed=5, shuffle_rows=False), 'nor by the pool kind'
    assert len(set(starts.values())) > 3, 'the starts are drawn'
    assert _batch_starts(url, references, 'dummy', seed=6) != starts, 'another seed draws other clips'


def test_long_clips_of_different_lengths_cross_the_process_pool_equal(tmp_path):
    """Row groups of clips past the pool's inline size travel as one flat buffer in shared memory (the object
    column of per-clip arrays is rebuilt on the reader's side)."""
    schema = Unischema('Speech', [MediaSchema.fields['id'], MediaSchema.fields['speech']])
    speech = [tone(0.5 + 0.1 * (i % 4), 16000, seed=i)[0] for i in range(12)]
    url = f'file://{tmp_path}/speech'
    write_dataset(url, schema, [{'id': i, 'speech': s} for i, s in enumerate(speech)], row_group_size_mb=0.05,
                  mode='overwrite')
    with make_batch_reader(url, reader_pool_type='process', workers_count=2) as reader:
        got = {int(i): clip for batch in reader for i, clip in zip(batch.id, batch.speech, strict=True)}
    assert sorted(got) == list(range(12))
    for i, samples in enumerate(speech):
        np.testing.assert_array_equal(got[i], samples / np.float32(32768))


def test_torch_loaders_batch_padded_speech_with_its_lengths_and_dense_clips(media):
    torch = pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    url, references = media
    with BatchedDataLoader(make_batch_reader(url, seed=1), batch_size=5, variable_length='pad') as loader:
        seen = 0
        for batch in loader:
            lengths = batch['speech_mask'].sum(dim=1)
            assert batch['speech'].dtype == torch.float32
            assert batch['clip'].shape[1:] == (CLIP, 48, 64, 3)
            for k, i in enumerate(batch['id'].tolist()):
                expected = _samples(i) / np.float32(32768)
                assert lengths[k] == len(expected)
                np.testing.assert_array_equal(batch['speech'][k, :len(expected)].numpy(), expected)
                assert not batch['speech'][k, len(expected):].any()
                _clip_start(references[i % 3], batch['clip'][k].numpy())
            seen += len(batch['id'])
    assert seen == ROWS
    with BatchedDataLoader(make_batch_reader(url, schema_fields=['id', 'speech']), batch_size=6,
                           variable_length='jagged') as loader:
        batch = next(iter(loader))
        for k, i in enumerate(batch['id'].tolist()):
            start, stop = batch['speech'].offsets[k], batch['speech'].offsets[k + 1]
            np.testing.assert_array_equal(batch['speech'].values[start:stop].numpy(), _samples(i) / np.float32(32768))
    with DataLoader(make_reader(url, schema_fields=['id', 'speech']), batch_size=4, variable_length='pad') as loader:
        batch = next(iter(loader))
        assert batch['speech'].shape[0] == 4
        assert batch['speech_mask'].sum(dim=1).tolist() == [len(_samples(i)) for i in batch['id'].tolist()]


def test_a_restored_loader_draws_the_clips_the_first_one_drew(media):
    pytest.importorskip('torch')
    from petastorm.pytorch import BatchedDataLoader

    url, references = media

    def loader():
        reader = make_batch_reader(url, seed=9, shuffle_rows=True, num_epochs=1, schema_fields=['id', 'clip'])
        return BatchedDataLoader(reader, batch_size=5, shuffling_queue_capacity=8)

    def clips(batches):
        return {i: batch['clip'][k].numpy() for batch in batches for k, i in enumerate(batch['id'].tolist())}

    with loader() as whole:
        reference = clips(whole)
    with loader() as first:
        batches = iter(first)
        head = clips([next(batches), next(batches)])
        state = first.state_dict()  # mid-epoch: rows read ahead wait in the shuffling buffer
    with loader() as second:
        second.load_state_dict(state)
        tail = clips(second)
    assert sorted([*head, *tail]) == list(range(ROWS))
    for i, clip in {**head, **tail}.items():
        np.testing.assert_array_equal(clip, reference[i])
        _clip_start(references[i % 3], clip)


def test_tensorflow_gets_dense_clips_and_fixed_length_audio(tmp_path):
    tf = pytest.importorskip('tensorflow')
    from petastorm.tf_utils import make_petastorm_dataset

    schema = Unischema('Fixed', [UnischemaField('id', np.int64, (), None, False),
                                 UnischemaField('speech', np.float32, (800,), AudioCodec(mono=True), False),
                                 UnischemaField('clip', np.uint8, (2, 48, 64, 3), VideoCodec(indices=[0, 9]), False)])
    video = video_file(12)
    frames = reference_frames(video)
    rows = [{'id': i, 'speech': {'array': _samples(0), 'sampling_rate': 16000}, 'clip': video} for i in range(4)]
    write_dataset(f'file://{tmp_path}/tf', schema, rows)
    with make_batch_reader(f'file://{tmp_path}/tf') as reader:
        batch = next(iter(make_petastorm_dataset(reader)))
    assert batch.clip.dtype == tf.uint8
    np.testing.assert_array_equal(batch.clip.numpy()[1], frames[[0, 9]])
    np.testing.assert_array_equal(batch.speech.numpy()[2], _samples(0) / np.float32(32768))


def test_undecodable_bytes_name_the_field_and_the_file(tmp_path):
    schema = Unischema('Bad', [UnischemaField('id', np.int64, (), None, False),
                               UnischemaField('clip', np.uint8, (None, None, None, 3), VideoCodec(), False)])
    write_dataset(f'file://{tmp_path}/bad', schema, [{'id': 0, 'clip': b'not a video at all'}])
    with make_reader(f'file://{tmp_path}/bad') as reader, pytest.raises(DecodeFieldError) as caught:
        next(iter(reader))
    message = str(caught.value)
    assert 'Decoding field "clip" failed in file://' in message
    assert '.parquet (row group 0' in message
    assert 'the stored value is not a decodable video file (18 bytes)' in message
    assert isinstance(caught.value.__cause__, CodecError)


def test_a_plain_binary_column_is_decoded_with_a_codec_given_for_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    video = video_file(20)
    pq.write_table(pa.table({'n': [0, 1], 'mp4': [video, video]}), tmp_path / 'plain.parquet')
    url = f'file://{tmp_path}/plain.parquet'
    given = UnischemaField('mp4', np.uint8, (3, None, None, 3), VideoCodec(indices=[1, 5, 19]), False)
    with make_batch_reader(url, schema_fields=['n', given]) as reader:
        assert reader.schema.fields['mp4'].codec == given.codec
        batch = next(iter(reader))
    np.testing.assert_array_equal(batch.mp4[1], reference_frames(video)[[1, 5, 19]])
    with make_batch_reader(url, schema_fields=['n', 'mp4']) as reader:
        assert next(iter(reader)).mp4[0] == video  # without a codec: the bytes, as before
    wrong = UnischemaField('n', np.float32, (None,), AudioCodec(), False)
    with make_batch_reader(url, schema_fields=[wrong]) as reader, pytest.raises(DecodeFieldError,
                                                                                match='audio is stored in a binary'):
        next(iter(reader))


def test_a_field_stored_with_another_codec_takes_no_media_codec(media):
    from petastorm.errors import SchemaError

    url, _ = media
    wrong = UnischemaField('speech', np.uint8, (None, None, None, 3), VideoCodec(), False)
    with pytest.raises(SchemaError, match=r"schema_fields gives 'speech' with VideoCodec\(layout='bytes'\), but the "
                                          r'dataset stores it with AudioCodec'):
        make_batch_reader(url, schema_fields=[wrong])
    resampled = UnischemaField('speech', np.float32, (None,), AudioCodec(sample_rate=8000, mono=True), False)
    with make_batch_reader(url, schema_fields=['id', resampled], shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    assert [len(s) for s in batch.speech] == [len(_samples(int(i))) // 2 for i in batch.id]


def test_every_epoch_draws_new_clips(media):
    url, references = media
    epochs: list[dict[int, int]] = [{}, {}]
    with make_batch_reader(url, seed=5, num_epochs=2, shuffle_row_groups=False, schema_fields=['id', 'speech',
                                                                                              'clip']) as reader:
        for batch in reader:
            epoch = 1 if all(int(i) in epochs[0] for i in batch.id) else 0
            epochs[epoch].update(_check_rows(batch.id, batch.speech, batch.clip, references))
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(ROWS))
    assert sum(epochs[0][i] != epochs[1][i] for i in range(ROWS)) > ROWS // 2
