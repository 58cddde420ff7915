"""materialize_dataset around a Spark write of audio and video fields: the values read back are the values written."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip('av')
pytest.importorskip('soundfile')
T = pytest.importorskip('pyspark.sql.types')

from petastorm import make_batch_reader, make_reader  # noqa: E402
from petastorm.codecs import AudioCodec, ScalarCodec, VideoCodec  # noqa: E402
from petastorm.etl.dataset_metadata import materialize_dataset  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row  # noqa: E402
from support.media import reference_frames, tone, video_file  # noqa: E402

pytestmark = pytest.mark.spark

FRAMES = [0, 3, 7]
Media = Unischema('Media', [
    UnischemaField('id', np.int64, (), ScalarCodec(T.LongType()), False),
    UnischemaField('speech', np.float32, (None,), AudioCodec(sample_rate=16000, mono=True), False),
    UnischemaField('clip', np.uint8, (len(FRAMES), None, None, 3), VideoCodec(indices=FRAMES, layout='hf'), False),
])


def test_audio_and_video_fields_written_by_spark_read_back_equal(spark, tmp_path):
    speech = [tone(0.03 + 0.01 * i, 16000, seed=i)[0] for i in range(4)]  # int16, of different lengths
    videos = [video_file(12, gop=4, seed=i) for i in range(2)]
    rows = [{'id': i, 'speech': speech[i], 'clip': {'bytes': videos[i % 2], 'path': f'{i}.mp4'}} for i in range(4)]
    url = f'file://{tmp_path}/media'
    with materialize_dataset(spark, url, Media, row_group_size_mb=1):
        spark.createDataFrame([dict_to_spark_row(Media, row) for row in rows], Media.as_spark_schema()) \
            .coalesce(1).write.mode('overwrite').parquet(url)
    expected_clips = [reference_frames(v)[FRAMES] for v in videos]
    with make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        got = sorted((row.id, row.speech, row.clip) for row in reader)
    assert [i for i, _, _ in got] == list(range(4))
    for i, samples, clip in got:
        np.testing.assert_array_equal(samples, speech[i] / np.float32(32768))
        np.testing.assert_array_equal(clip, expected_clips[i % 2])
    with make_batch_reader(url, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    order = np.argsort(batch.id)
    assert batch.clip[order].tolist() == np.stack([expected_clips[i % 2] for i in range(4)]).tolist()
