"""AudioCodec: samples equal to those written (lossless files) and to PyAV's decode (every format), resampling,
channels, the stored layouts, JSON, and the errors (not audio, a path only, a missing library).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip('av')
pytest.importorskip('soundfile')

from petastorm.codecs import CODECS_BY_NAME, AudioCodec, codec_from_json  # noqa: E402
from petastorm.codecs._audio_decode import _decode_pyav, _decode_soundfile  # noqa: E402
from petastorm.errors import CodecError, MissingDependencyError, SchemaError  # noqa: E402
from petastorm.unischema import UnischemaField  # noqa: E402
from support.media import audio_file, pyav_audio, reference_audio, tone  # noqa: E402

FIELD = UnischemaField('speech', np.float32, (None, None), AudioCodec(), False)


@pytest.mark.parametrize(('file_format', 'subtype', 'scale'), [
    ('FLAC', 'PCM_16', 2 ** 15), ('WAV', 'PCM_16', 2 ** 15), ('FLAC', 'PCM_24', 2 ** 23), ('WAV', 'PCM_24', 2 ** 23)])
def test_lossless_files_decode_to_the_samples_written(file_format, subtype, scale):
    samples = tone(0.5, 16000, channels=2, seed=1)
    written = samples
    if subtype == 'PCM_24':
        samples = samples.astype(np.int32) * 256 + 17  # 24-bit values using all their bits
        written = samples * 256  # soundfile takes int32 at full scale and keeps the top 24 bits
    payload = audio_file(written, 16000, file_format, subtype)
    decoded = AudioCodec().decode(FIELD, payload)
    assert decoded.dtype == np.float32
    assert decoded.shape == samples.shape
    np.testing.assert_array_equal(decoded, samples.astype(np.float32) / np.float32(scale))
    reference, rate = reference_audio(payload)
    np.testing.assert_array_equal(decoded, reference)
    assert rate == 16000


@pytest.mark.parametrize(('container', 'codec', 'rate'), [
    ('mp3', 'libmp3lame', 16000), ('ogg', 'libopus', 48000), ('adts', 'aac', 22050), ('flac', 'flac', 16000),
    ('wav', 'pcm_s16le', 8000)])
def test_every_format_decodes_to_pyav_samples(container, codec, rate):
    payload = pyav_audio(tone(0.4, rate, channels=2, seed=2), rate, container, codec)
    decoded = AudioCodec().decode(FIELD, payload)
    reference, reference_rate = reference_audio(payload)
    np.testing.assert_array_equal(decoded, reference)
    assert reference_rate == rate


def test_soundfile_and_pyav_give_the_same_samples_for_flac_and_wav():
    for payload in (audio_file(tone(1.0, 16000, 2), 16000), audio_file(tone(1.0, 44100, 1), 44100, 'WAV')):
        by_soundfile, rate_a = _decode_soundfile(memoryview(payload))
        by_pyav, rate_b = _decode_pyav(FIELD, memoryview(payload), 0)
        np.testing.assert_array_equal(by_soundfile, by_pyav)
        assert rate_a == rate_b


def test_resampling_is_soxr_of_the_decoded_samples():
    soxr = pytest.importorskip('soxr')
    samples = tone(1.0, 44100, channels=2)
    payload = audio_file(samples, 44100)
    decoded = AudioCodec(sample_rate=16000).decode(FIELD, payload)
    reference, _ = reference_audio(payload)
    expected = soxr.resample(reference.T, 44100, 16000, quality='HQ').T
    assert decoded.shape == (2, 16000)
    np.testing.assert_array_equal(decoded, expected)
    same_rate = AudioCodec(sample_rate=44100).decode(FIELD, payload)
    np.testing.assert_array_equal(same_rate, reference)


def test_channels_mono_and_copies():
    stereo = audio_file(tone(0.25, 8000, channels=2), 8000)
    mono_file = audio_file(tone(0.25, 8000, channels=1), 8000)
    reference, _ = reference_audio(stereo)
    assert AudioCodec(mono=True).decode(FIELD, stereo).shape == (2000,)
    np.testing.assert_array_equal(AudioCodec(mono=True).decode(FIELD, stereo), reference.mean(axis=0, dtype=np.float32))
    np.testing.assert_array_equal(AudioCodec(channels=1).decode(FIELD, stereo)[0], reference.mean(axis=0))
    assert AudioCodec(channels=2).decode(FIELD, mono_file).shape == (2, 2000)
    assert AudioCodec().decode(FIELD, mono_file).shape == (1, 2000)
    with pytest.raises(CodecError, match='2 channels; 3 cannot be made'):
        AudioCodec(channels=3).decode(FIELD, stereo)


def test_a_column_of_either_layout_decodes_with_nulls_and_ragged_rows():
    files = [audio_file(tone(0.1 * (i + 1), 8000), 8000) for i in range(3)]
    binary = pa.array([files[0], None, files[1], files[2]], pa.binary())
    struct = pa.array([{'bytes': f, 'path': f'a{i}.flac'} for i, f in enumerate(files)],
                      pa.struct([('bytes', pa.binary()), ('path', pa.string())]))
    column = AudioCodec(mono=True).decode_column(FIELD, binary)
    assert column.dtype == object
    assert column[1] is None
    assert [len(v) for v in column if v is not None] == [800, 1600, 2400]
    decoded = AudioCodec(mono=True).decode_column(FIELD, pa.chunked_array([struct]))
    assert [len(v) for v in decoded] == [800, 1600, 2400]
    same = AudioCodec(mono=True).decode_column(FIELD, pa.array([files[0]] * 3, pa.large_binary()))
    assert same.shape == (3, 800)
    assert same.dtype == np.float32


def test_writing_arrays_and_files_in_both_layouts():
    samples = tone(0.2, 16000, channels=2)
    flac = AudioCodec(sample_rate=16000).encode(FIELD, samples)
    assert flac[:4] == b'fLaC'
    np.testing.assert_array_equal(AudioCodec().decode(FIELD, flac), samples / np.float32(32768))
    wav = AudioCodec(format='wav').encode(FIELD, {'array': samples[0].astype(np.float32) / 4, 'sampling_rate': 8000})
    np.testing.assert_array_equal(AudioCodec().decode(FIELD, wav)[0], samples[0].astype(np.float32) / 4)
    hf = AudioCodec(layout='hf')
    assert hf.encode(FIELD, b'abc') == {'bytes': b'abc', 'path': None}
    assert hf.encode(FIELD, 'clips/a.flac') == {'bytes': None, 'path': 'clips/a.flac'}
    assert hf.arrow_type() == pa.struct([('bytes', pa.binary()), ('path', pa.string())])
    assert AudioCodec().arrow_type() == pa.binary()
    with pytest.raises(SchemaError, match="field speech: the 'bytes' layout stores the audio file's bytes"):
        AudioCodec().encode(FIELD, 'a.flac')
    with pytest.raises(SchemaError, match='writing samples needs their rate'):
        AudioCodec().encode(FIELD, samples)
    with pytest.raises(SchemaError, match='integer samples must be int16'):
        AudioCodec(sample_rate=8000).encode(FIELD, samples.astype(np.int32))


def test_json_round_trip_and_registry():
    codec = AudioCodec(sample_rate=16000, channels=2, layout='hf', format='wav')
    description = json.loads(json.dumps(codec.to_json()))
    assert codec_from_json(description) == codec
    assert CODECS_BY_NAME['audio'] is AudioCodec
    assert AudioCodec(mono=True) != AudioCodec()
    for bad in ({'sample_rate': 0}, {'channels': -1}, {'layout': 'zip'}, {'format': 'mp3'}):
        with pytest.raises(ValueError, match='AudioCodec'):
            AudioCodec(**bad)


def test_errors_name_the_field_the_row_and_what_was_wrong():
    codec = AudioCodec()
    with pytest.raises(CodecError, match=r'field speech \(row 1 of the column\): the stored value is not a decodable '
                                         r'audio file \(300 bytes\)'):
        codec.decode_column(FIELD, pa.array([audio_file(tone(0.1, 8000), 8000), b'x' * 300]))
    from support.media import video_file

    with pytest.raises(CodecError, match='it has no audio stream'):
        codec.decode(FIELD, video_file(count=3))
    with pytest.raises(CodecError, match=r"stored as the path 'gone\.flac' only"):
        codec.decode_column(FIELD, pa.array([{'bytes': None, 'path': 'gone.flac'}]))
    with pytest.raises(CodecError, match='audio is stored in a binary column'):
        codec.decode_column(FIELD, pa.array([1, 2]))


def test_a_missing_library_names_the_media_extra(monkeypatch):
    mp3 = pyav_audio(tone(0.1, 8000), 8000, 'mp3', 'libmp3lame')
    for module in ('av', 'soundfile', 'soxr'):
        monkeypatch.setitem(sys.modules, module, None)  # what an import finds when the package is not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'neo-petastorm\[media\]'"):
        AudioCodec().check_available('decode')
    with pytest.raises(MissingDependencyError, match=r"pip install 'neo-petastorm\[media\]'"):
        AudioCodec(sample_rate=8000).encode(FIELD, tone(0.1, 8000))
    with pytest.raises(MissingDependencyError, match=r"decoding audio needs the optional package 'av'"):
        AudioCodec().decode(FIELD, mp3)
