"""Audio and video columns: decoded clips per second through our loader, next to the decoders in a plain loop.

Audio: 3 s FLAC clips at 16 kHz (mono int16 speech-like noise), stored as a Hugging Face ``Audio(sampling_rate=16000)``
column written by ``datasets`` in row groups of 64 clips. Clips per second of

* ``ours``: ``make_batch_reader`` (thread pool, ``--workers`` workers) into ``BatchedDataLoader`` batches of 32,
  ``variable_length='pad'`` (padded float32 samples and their mask); with ``--process-pool``, ``ours, process
  pool`` is the same with ``reader_pool_type='process'`` (its rounds include starting the worker processes);
* ``PyAV loop``: the limit of the brief: ``pyarrow`` reads the column, PyAV decodes each file to float32 in one
  thread (what a hand-written loop does);
* ``soundfile loop``: the same with soundfile (the decoder ``AudioCodec`` picks for FLAC and WAV);
* ``datasets``: ``datasets``' ``Audio`` feature, ``with_format('torch')``. Its decoding needs torchcodec; where
  torchcodec does not load (this machine: its wheel wants a CUDA build of torch and a system FFmpeg), the row is
  ``datasets``' own per-row path with the decoding ``datasets`` 3 did (``Audio(decode=False)`` and a
  ``with_transform`` decoding each row with soundfile), so that its per-row formatting is measured;
* ``datasets 3.x Audio`` (optional): ``datasets``' own ``Audio`` feature, ``with_format('torch')``, as released
  before torchcodec (it decodes with soundfile), run by the Python of a side venv given with ``--datasets-python``
  or ``MEDIA_BENCH_DATASETS_PYTHON`` (this file runs there as a child per round, timing its own loop after a
  warm-up pass, so the child's start is not counted). Never install ``datasets`` 3 into the project's venv::

      python3.11 -m venv /tmp/dsvenv
      /tmp/dsvenv/bin/pip install 'torch==2.13.0+cpu' 'datasets>=3,<4' soundfile librosa
      python benchmarks/media_bench.py --only audio --datasets-python /tmp/dsvenv/bin/python

Video: 4 s 320x240 H.264 clips at 30 fps with a keyframe every 30 frames (x264's B-frames), a ``Video`` column in
row groups of 8 clips (a worker decodes a row group's clips into one array), 8 of the 120 frames sampled per clip
(a clip of 8 frames 4 apart at a random start). Clips per second of

* ``ours``: ``make_batch_reader`` with ``VideoCodec(num_frames=8, stride=4, start='random')`` into
  ``BatchedDataLoader`` batches of 8 (``(8, 8, 240, 320, 3)`` uint8);
* ``PyAV seek, 1 thread``: the single-thread decoder done well: seek to the keyframe before the clip, decode to
  its last frame, convert the 8 frames (the same frames, the same work, one thread, no loader);
* ``PyAV from start, 1 thread``: a plain loop decoding from the first frame to the clip's last one;
* ``torchcodec`` when it loads; ``datasets`` ``Video`` as for audio (``Video(decode=False)`` rows and the
  seeking decoder per row in ``with_transform``, where torchcodec does not load);
* ``datasets 3.x Video`` (optional, ``--datasets-python``): ``datasets``' own ``Video`` feature as released before
  torchcodec: ``with_format('torch')`` hands each row over as a torchvision ``VideoReader`` (a torchvision that still
  has it: 0.16 here, on its PyAV backend), seeked to the clip's start and read until its 8 frames are taken. Its side
  venv needs a torch of that age::

      python3.11 -m venv /tmp/dsvvenv
      /tmp/dsvvenv/bin/pip install 'torch==2.1.0' 'torchvision==0.16.0' 'numpy<2' 'pyarrow<20' 'datasets>=3,<4' av
      python benchmarks/media_bench.py --only video --datasets-python /tmp/dsvvenv/bin/python

With ``--one-worker``, ``ours, 1 worker`` runs too, so the speed-up of the workers is measured in the same run.

Every case runs once per round, the rounds interleaved; the table shows the median clips/s and the median of each
round's ratio to ours (the machine is shared: same-run ratios are what compare). The first line says how many cores
the machine gives the process: 2 threads hashing (which releases the GIL) against 1, measured before and after.

    python benchmarks/media_bench.py                # full run
    python benchmarks/media_bench.py --quick        # smoke run
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests'))

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

CLIP_FRAMES, CLIP_STRIDE = 8, 4
#: The end of the names of cases that warm up and time themselves (in a child process).
SELF_TIMED = '(side venv)'


# -- data ----------------------------------------------------------------------------------------------------------

def write_hf_store(path: str, column: str, payloads: list[bytes], feature: object, rows_per_group: int) -> str:
    """A Parquet file of ``payloads`` as a Hugging Face feature column, written by ``datasets``."""
    import datasets

    rows = {column: [{'bytes': p, 'path': f'{i}.bin'} for i, p in enumerate(payloads)]}
    dataset = datasets.Dataset.from_dict(rows).cast(datasets.Features({column: feature}))
    dataset.to_parquet(path, batch_size=rows_per_group)
    return path


def audio_clips(count: int) -> list[bytes]:
    from support.media import audio_file, tone

    return [audio_file(tone(3.0, 16000, seed=i), 16000) for i in range(count)]


def video_clips(count: int) -> list[bytes]:
    from support.media import video_file

    distinct = [video_file(120, 320, 240, fps=30, gop=30, seed=i, bframes=3) for i in range(min(count, 8))]
    return [distinct[i % len(distinct)] for i in range(count)]


# -- audio cases ---------------------------------------------------------------------------------------------------

def pyav_audio(payload: bytes) -> np.ndarray:
    import av

    with av.open(io.BytesIO(payload)) as container:
        stream = container.streams.audio[0]
        stream.codec_context.thread_count = 1
        parts = [frame.to_ndarray() for frame in container.decode(stream)]
    return np.concatenate(parts, axis=1).astype(np.float32) / np.float32(32768)


def soundfile_audio(payload: bytes) -> np.ndarray:
    import soundfile

    return soundfile.read(io.BytesIO(payload), dtype='float32', always_2d=True)[0].T


def loop_clips(path: str, column: str, decode: Callable[[bytes], np.ndarray]) -> int:
    count = 0
    for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=64):
        for cell in batch.column(0).field('bytes').to_pylist():
            decode(cell)
            count += 1
    return count


def ours_audio(path: str, workers: int, pool: str = 'thread') -> int:
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    reader = make_batch_reader(f'file://{path}', workers_count=workers, num_epochs=1, reader_pool_type=pool)
    count = 0
    with BatchedDataLoader(reader, batch_size=32, variable_length='pad') as loader:
        for batch in loader:
            count += len(batch['audio'])
    return count


def datasets_audio(path: str) -> tuple[str, Callable[[], int]]:
    """``datasets``' loop: its Audio feature, else its per-row formatting with the decoding it did before torchcodec."""
    import datasets
    import torch

    if _torchcodec_loads():
        dataset = datasets.Dataset.from_parquet(path).with_format('torch')

        def run() -> int:
            return sum(1 for row in dataset if row['audio'].get_all_samples() is not None)

        return 'datasets Audio, with_format(torch)', run
    dataset = datasets.Dataset.from_parquet(path).cast_column('audio', datasets.Audio(decode=False))

    def decode(batch: dict) -> dict:
        return {'audio': [torch.from_numpy(soundfile_audio(cell['bytes'])[0]) for cell in batch['audio']]}

    rows = dataset.with_transform(decode)

    def run_rows() -> int:
        return sum(1 for row in rows if row['audio'] is not None)

    return 'datasets rows + soundfile (no torchcodec)', run_rows


def side_datasets_version(python: str) -> str:
    """The version of ``datasets`` in the side venv of ``python``."""
    return subprocess.run([python, '-c', 'import datasets; print(datasets.__version__)'], check=True,
                          capture_output=True, text=True, timeout=120).stdout.strip()


def side_datasets(python: str, kind: str, path: str) -> tuple[int, float]:
    """``(clips, seconds)`` of one timed pass of ``datasets``' ``kind`` feature, run by the side venv's ``python``."""
    done = subprocess.run([python, os.path.abspath(__file__), '--side', kind, path], check=True, capture_output=True,
                          text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return int(result['clips']), float(result['seconds'])


def side_main(kind: str, path: str) -> None:
    """In the side venv: one warm-up pass and one timed pass of ``datasets``' feature, printed as JSON."""
    import datasets

    datasets.disable_progress_bars()
    cache = os.path.join(os.path.dirname(path), f'side_datasets_cache_{kind}')
    dataset = datasets.Dataset.from_parquet(path, cache_dir=cache).with_format('torch')

    def run() -> int:
        if kind == 'audio':
            return sum(1 for row in dataset if row['audio']['array'].shape[-1] > 0)
        return sum(1 for key, row in enumerate(dataset) if len(torchvision_clip(row['video'], clip_indices(key))))

    run()
    start = time.perf_counter()
    clips = run()
    print(json.dumps({'clips': clips, 'seconds': time.perf_counter() - start}))


# -- video cases ---------------------------------------------------------------------------------------------------

def clip_indices(key: int, count: int = 120) -> np.ndarray:
    span = (CLIP_FRAMES - 1) * CLIP_STRIDE + 1
    start = int(np.random.default_rng(key).integers(0, count - span + 1))
    return np.arange(start, start + span, CLIP_STRIDE)


def pyav_seek_clip(payload: bytes, indices: np.ndarray) -> np.ndarray:
    """The single-thread decoder done well: seek to the keyframe before the clip, decode to its end (CFR video)."""
    import av

    with av.open(io.BytesIO(payload)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        ticks = 1 / (stream.average_rate * stream.time_base)  # time-base units per frame
        wanted = {int(round(i * ticks)) + (stream.start_time or 0): k for k, i in enumerate(indices.tolist())}
        out = np.empty((len(indices), stream.height, stream.width, 3), np.uint8)
        container.seek(min(wanted), stream=stream, backward=True, any_frame=False)
        last, found = max(wanted), 0
        for frame in container.decode(stream):
            if frame.pts in wanted:
                out[wanted[frame.pts]] = frame.to_ndarray(format='rgb24', threads=1)
                found += 1
            if frame.pts >= last:
                break
    assert found == len(indices)
    return out


def pyav_start_clip(payload: bytes, indices: np.ndarray) -> np.ndarray:
    """A plain loop: decode from the first frame until the clip's last one."""
    import av

    wanted = {int(i): k for k, i in enumerate(indices.tolist())}
    with av.open(io.BytesIO(payload)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        out = np.empty((len(indices), stream.height, stream.width, 3), np.uint8)
        for number, frame in enumerate(container.decode(stream)):
            if number in wanted:
                out[wanted[number]] = frame.to_ndarray(format='rgb24', threads=1)
            if number >= max(wanted):
                break
    return out


def loop_video(path: str, decode: Callable[[bytes, np.ndarray], np.ndarray]) -> int:
    count = 0
    for batch in pq.ParquetFile(path).iter_batches(columns=['video'], batch_size=16):
        for cell in batch.column(0).field('bytes').to_pylist():
            decode(cell, clip_indices(count))
            count += 1
    return count


def torchvision_clip(reader: object, indices: np.ndarray, fps: int = 30) -> list:
    """A clip through a torchvision ``VideoReader`` (what ``datasets`` 3's ``Video`` gives): seek, then read frames."""
    times = (indices / fps).tolist()
    reader.seek(times[0])  # type: ignore[attr-defined]
    frames: list = []
    for frame in reader:  # type: ignore[attr-defined]
        if frame['pts'] >= times[len(frames)] - 0.5 / fps:
            frames.append(frame['data'])
            if len(frames) == len(times):
                break
    assert len(frames) == len(times)
    return frames


def torchcodec_clip(payload: bytes, indices: np.ndarray) -> np.ndarray:
    from torchcodec.decoders import VideoDecoder

    return VideoDecoder(payload, num_ffmpeg_threads=1, seek_mode='approximate').get_frames_at(
        indices.tolist()).data.numpy()


def ours_video(path: str, workers: int, pool: str = 'thread') -> int:
    from petastorm import make_batch_reader
    from petastorm.codecs import VideoCodec
    from petastorm.pytorch import BatchedDataLoader
    from petastorm.unischema import UnischemaField

    clip = UnischemaField('video', np.uint8, (CLIP_FRAMES, None, None, 3),
                          VideoCodec(num_frames=CLIP_FRAMES, stride=CLIP_STRIDE, start='random', layout='hf'), False)
    reader = make_batch_reader(f'file://{path}', schema_fields=[clip], workers_count=workers, num_epochs=1,
                               reader_pool_type=pool)
    count = 0
    with BatchedDataLoader(reader, batch_size=8) as loader:
        for batch in loader:
            assert batch['video'].shape[1:] == (CLIP_FRAMES, 240, 320, 3)
            count += len(batch['video'])
    return count


def datasets_video(path: str) -> tuple[str, Callable[[], int]]:
    import datasets
    import torch

    if _torchcodec_loads():
        dataset = datasets.Dataset.from_parquet(path).with_format('torch')

        def run() -> int:
            return sum(1 for i, row in enumerate(dataset)
                       if row['video'].get_frames_at(clip_indices(i).tolist()) is not None)

        return 'datasets Video, with_format(torch)', run
    dataset = datasets.Dataset.from_parquet(path).cast_column('video', datasets.Video(decode=False))
    counter = iter(range(10 ** 9))

    def decode(batch: dict) -> dict:
        return {'video': [torch.from_numpy(pyav_seek_clip(cell['bytes'], clip_indices(next(counter))))
                          for cell in batch['video']]}

    rows = dataset.with_transform(decode)

    def run_rows() -> int:
        return sum(1 for row in rows if row['video'] is not None)

    return 'datasets rows + PyAV seek (no torchcodec)', run_rows


def _torchcodec_loads() -> bool:
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:  # ImportError, or OSError/RuntimeError when its libraries do not load
        return False
    return True


# -- running -------------------------------------------------------------------------------------------------------

def free_cores(rounds: int = 5) -> float:
    """How much faster 2 threads hash than 1 right now (sha256 releases the GIL): 2.0 on an idle 2-core machine,
    1.0 when the machine gives this process no second core. Parallel figures are only as good as this one."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    data = b'x' * (8 << 20)

    def rate(threads: int) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: hashlib.sha256(data).digest(), range(16)))
        return 16 / (time.perf_counter() - start)

    return statistics.median(rate(2) / rate(1) for _ in range(rounds))


def rounds(cases: dict[str, Callable[[], int | tuple[int, float]]], repeats: int) -> dict[str, list[float]]:
    """Clips/s of every case, once per round, the cases interleaved (after a round that warms imports and caches).

    A case returns the clips it read, timed here, or ``(clips, seconds)`` when it times itself (a child process).
    """
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for name, run in cases.items():
        if not name.endswith(SELF_TIMED):
            run()
    for _ in range(repeats):
        for name, run in cases.items():
            start = time.perf_counter()
            done = run()
            clips, seconds = done if isinstance(done, tuple) else (done, time.perf_counter() - start)
            rates[name].append(clips / seconds)
    return rates


def table(title: str, rates: dict[str, list[float]], ours: str) -> str:
    lines = [f'### {title}', '', '| case | clips/s (median) | ours / case (median of rounds) |', '|---|---:|---:|']
    for name, values in rates.items():
        ratios = [o / v for o, v in zip(rates[ours], values, strict=True)]
        lines.append(f'| {name} | {statistics.median(values):.0f} | {statistics.median(ratios):.2f}x |')
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='few clips, one round')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--audio-clips', type=int, default=640)
    parser.add_argument('--video-clips', type=int, default=96)
    parser.add_argument('--only', choices=['audio', 'video'])
    parser.add_argument('--process-pool', action='store_true',
                        help="also read with reader_pool_type='process' (each round starts its worker processes)")
    parser.add_argument('--one-worker', action='store_true', help="also read with 1 worker ('ours, 1 worker')")
    parser.add_argument('--datasets-python', default=os.environ.get('MEDIA_BENCH_DATASETS_PYTHON'),
                        help="the Python of a side venv with datasets 3.x: adds its Audio and Video features' clips/s "
                             "(default: $MEDIA_BENCH_DATASETS_PYTHON)")
    parser.add_argument('--side', nargs=2, help=argparse.SUPPRESS)  # the child run by the side venv's Python
    args = parser.parse_args()
    if args.side:
        side_main(*args.side)
        return
    if args.quick:
        args.repeats, args.audio_clips, args.video_clips = 1, 64, 16
    import datasets

    datasets.disable_progress_bars()
    print(f'{os.cpu_count()} CPUs, {args.workers} workers, {args.repeats} rounds; torchcodec loads: '
          f'{_torchcodec_loads()}; 2 threads hash at {free_cores():.2f}x one thread now (2.00: both cores free)')
    with tempfile.TemporaryDirectory() as root:
        if args.only != 'video':
            path = write_hf_store(os.path.join(root, 'audio.parquet'), 'audio', audio_clips(args.audio_clips),
                                  datasets.Audio(sampling_rate=16000), rows_per_group=64)
            name, hf = datasets_audio(path)
            cases = {'ours': lambda: ours_audio(path, args.workers),
                     'PyAV loop (the limit)': lambda: loop_clips(path, 'audio', pyav_audio),
                     'soundfile loop': lambda: loop_clips(path, 'audio', soundfile_audio), name: hf}
            if args.process_pool:
                cases['ours, process pool'] = lambda: ours_audio(path, args.workers, 'process')
            if args.one_worker:
                cases['ours, 1 worker'] = lambda: ours_audio(path, 1)
            if args.datasets_python:
                side = f'datasets {side_datasets_version(args.datasets_python)} Audio, with_format(torch) {SELF_TIMED}'
                cases[side] = lambda: side_datasets(args.datasets_python, 'audio', path)
            print(table(f'Audio: {args.audio_clips} FLAC clips of 3 s at 16 kHz', rounds(cases, args.repeats),
                        'ours'), f'\n\nfree cores after: {free_cores():.2f}\n', flush=True)
        if args.only != 'audio':
            path = write_hf_store(os.path.join(root, 'video.parquet'), 'video', video_clips(args.video_clips),
                                  datasets.Video(), rows_per_group=8)
            name, hf = datasets_video(path)
            cases = {'ours': lambda: ours_video(path, args.workers),
                     'PyAV seek, 1 thread': lambda: loop_video(path, pyav_seek_clip),
                     'PyAV from start, 1 thread': lambda: loop_video(path, pyav_start_clip), name: hf}
            if args.process_pool:
                cases['ours, process pool'] = lambda: ours_video(path, args.workers, 'process')
            if args.one_worker:
                cases['ours, 1 worker'] = lambda: ours_video(path, 1)
            if _torchcodec_loads():
                cases['torchcodec, 1 thread'] = lambda: loop_video(path, torchcodec_clip)
            if args.datasets_python:
                side = f'datasets {side_datasets_version(args.datasets_python)} Video, with_format(torch) {SELF_TIMED}'
                cases[side] = lambda: side_datasets(args.datasets_python, 'video', path)
            print(table(f'Video: {args.video_clips} H.264 clips of 4 s, 320x240, GOP 30; 8 of 120 frames each',
                        rounds(cases, args.repeats), 'ours'), f'\n\nfree cores after: {free_cores():.2f}', flush=True)


if __name__ == '__main__':
    main()
