"""Measure how fast a reader delivers samples, with the process's memory and CPU use.

Importing this module needs neither TensorFlow nor psutil: TensorFlow is imported only for
``read_method=ReadMethod.TF``, and psutil (when installed) only while measuring. Without psutil, memory is the
peak RSS and CPU the user+system time from :mod:`resource`.

Example:
    >>> result = reader_throughput('file:///tmp/dataset', warmup_cycles_count=100, measure_cycles_count=500)
    >>> print(f'{result.samples_per_second:.1f} samples/sec')  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from enum import Enum
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

__all__ = ['BenchmarkResult', 'ReadMethod', 'WorkerPoolType', 'reader_throughput']

#: ``on_progress(phase, done, total)``; ``phase`` is ``'warmup'`` or ``'measure'``.
ProgressCallback = Callable[[str, int, int], None]

_PROGRESS_EVERY_SECONDS = 0.25
_DEBUG_EVERY_CYCLES = 1000


class WorkerPoolType(Enum):
    """Kinds of reader worker pool; the value is the ``reader_pool_type`` string."""

    THREAD = 'thread'
    PROCESS = 'process'
    NONE = 'dummy'

    def __str__(self) -> str:
        return self.value


class ReadMethod(Enum):
    """How samples are pulled: ``next(reader)`` in Python, or through a TensorFlow dataset."""

    PYTHON = 'python'
    TF = 'tf'

    def __str__(self) -> str:
        return self.value


class BenchmarkResult(NamedTuple):
    """What :func:`reader_throughput` measured.

    Attributes:
        time_mean: seconds per measured cycle (one ``next()`` call: a row, or a batch for a batch reader).
        samples_per_second: rows per second (``1 / time_mean`` for a row reader).
        memory_info: the process's memory after measuring: psutil's ``memory_full_info()`` (or
            ``memory_info()``) when psutil is installed, else a ``MemoryInfo`` with the peak ``rss``; bytes.
        cpu: CPU use of the process during the measurement, in percent of one core (may exceed 100).
    """

    time_mean: float
    samples_per_second: float
    memory_info: Any
    cpu: float


class MemoryInfo(NamedTuple):
    """Memory of the process when psutil is not installed: the peak resident set size, in bytes."""

    rss: int


class _ResourceMeter:
    """CPU time and memory of this process, from psutil when installed, else from :mod:`resource`."""

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:
            self._process = None
        else:
            self._process = psutil.Process()
        self._wall = 0.0
        self._cpu_time = 0.0

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._cpu_time = self._process_cpu_seconds()

    def cpu_percent(self) -> float:
        wall = time.perf_counter() - self._wall
        return 100.0 * (self._process_cpu_seconds() - self._cpu_time) / wall if wall > 0 else 0.0

    def _process_cpu_seconds(self) -> float:
        if self._process is not None:
            times = self._process.cpu_times()
            return float(times.user + times.system)
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def memory(self) -> Any:
        if self._process is not None:
            try:
                return self._process.memory_full_info()
            except Exception:  # psutil.AccessDenied on some platforms: the basic counters still work
                return self._process.memory_info()
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return MemoryInfo(peak if sys.platform == 'darwin' else peak * 1024)


def reader_throughput(dataset_url: str, field_regex: list[str] | None = None, warmup_cycles_count: int = 300,
                      measure_cycles_count: int = 1000, pool_type: WorkerPoolType | str = WorkerPoolType.THREAD,
                      loaders_count: int = 3, profile_threads: bool = False,
                      read_method: ReadMethod | str = ReadMethod.PYTHON, shuffling_queue_size: int = 500,
                      min_after_dequeue: int = 400, reader_extra_args: dict[str, Any] | None = None,
                      spawn_new_process: bool = True, *, batch: bool = False,
                      on_progress: ProgressCallback | None = None) -> BenchmarkResult:
    """Read ``warmup_cycles_count`` samples, then time ``measure_cycles_count`` more.

    The reader loops over the data forever (``num_epochs=None``), so the cycle counts may exceed the dataset size.

    Args:
        dataset_url: dataset URL, passed to ``make_reader`` / ``make_batch_reader``.
        field_regex: read only fields whose whole name matches one of these regular expressions (None: all).
        warmup_cycles_count: ``next()`` calls before measuring (fills the worker queues).
        measure_cycles_count: measured ``next()`` calls.
        pool_type: a :class:`WorkerPoolType` or its value.
        loaders_count: ``workers_count`` of the reader.
        profile_threads: accepted for compatibility with Petastorm; has no effect.
        read_method: :class:`ReadMethod`; ``TF`` pulls samples through ``petastorm.tf_utils.make_petastorm_dataset``
            (needs ``pip install 'petastorm[tf]'``).
        shuffling_queue_size: with ``TF``, the size of the ``tf.data`` shuffle buffer (0: no shuffling).
        min_after_dequeue: accepted for compatibility; ``tf.data`` shuffling has no such setting.
        reader_extra_args: more keyword arguments for the reader factory (they override the ones above).
        spawn_new_process: measure in a fresh child process, so that memory reflects this benchmark only.
        batch: use ``make_batch_reader``: a cycle is one batch and ``samples_per_second`` counts its rows.
        on_progress: called as ``on_progress(phase, done, total)`` a few times per second; it must be picklable
            (a module-level function) when ``spawn_new_process`` is True.

    Returns:
        A :class:`BenchmarkResult`.

    Raises:
        ValueError: a cycle count is negative or ``measure_cycles_count`` is 0, or an unknown pool/read method.
        MissingDependencyError: ``read_method`` is ``TF`` and TensorFlow is not installed.
        RuntimeError: the benchmark failed in the child process (the message carries the original error).
    """
    pool_type = WorkerPoolType(str(pool_type))
    read_method = ReadMethod(str(read_method))
    if warmup_cycles_count < 0 or measure_cycles_count < 1:
        raise ValueError(f'warmup_cycles_count={warmup_cycles_count} must be >= 0 and '
                         f'measure_cycles_count={measure_cycles_count} must be >= 1')
    arguments: dict[str, Any] = dict(
        dataset_url=dataset_url, field_regex=field_regex, warmup_cycles_count=warmup_cycles_count,
        measure_cycles_count=measure_cycles_count, pool_type=pool_type, loaders_count=loaders_count,
        profile_threads=profile_threads, read_method=read_method, shuffling_queue_size=shuffling_queue_size,
        min_after_dequeue=min_after_dequeue, reader_extra_args=reader_extra_args, batch=batch,
        on_progress=on_progress)
    if not spawn_new_process:
        return _measure(**arguments)
    import multiprocessing

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn')) as executor:
        return executor.submit(_measure_in_child, arguments, logging.getLogger().getEffectiveLevel()).result()


def _measure_in_child(arguments: dict[str, Any], log_level: int) -> BenchmarkResult:
    if log_level < logging.WARNING:  # a spawned child starts with no logging set up: mirror the parent's level
        logging.basicConfig(format='%(asctime)s %(levelname)s %(name)s: %(message)s', level=log_level)
    # Exceptions travel back pickled: keep the message, drop what may not pickle (locks, readers, frames).
    try:
        return _measure(**arguments)
    except Exception as err:
        raise RuntimeError(f'{type(err).__name__}: {err}') from None


def _measure(dataset_url: str, field_regex: list[str] | None, warmup_cycles_count: int, measure_cycles_count: int,
             pool_type: WorkerPoolType, loaders_count: int, profile_threads: bool, read_method: ReadMethod,
             shuffling_queue_size: int, min_after_dequeue: int, reader_extra_args: dict[str, Any] | None,
             batch: bool, on_progress: ProgressCallback | None) -> BenchmarkResult:
    from petastorm.reader import make_batch_reader, make_reader

    if read_method is ReadMethod.TF:
        from petastorm._optional import import_optional

        import_optional('tensorflow', '--read-method tf')
    fields = _matching_fields(dataset_url, field_regex, batch)
    logger.info('Fields used in the benchmark: %s', [f.name for f in fields] if fields else 'all')
    factory = make_batch_reader if batch else make_reader
    reader_args: dict[str, Any] = dict(num_epochs=None, reader_pool_type=pool_type.value,
                                       workers_count=loaders_count, schema_fields=fields or None)
    reader_args.update(reader_extra_args or {})
    meter = _ResourceMeter()
    with factory(dataset_url, **reader_args) as reader:
        samples = _python_samples(reader) if read_method is ReadMethod.PYTHON else _tf_samples(
            reader, shuffling_queue_size)
        _run_cycles(samples, 'warmup', warmup_cycles_count, reader, on_progress)
        logger.info('Done warmup')
        meter.start()
        started = time.perf_counter()
        rows = _run_cycles(samples, 'measure', measure_cycles_count, reader, on_progress)
        duration = time.perf_counter() - started
        cpu = meter.cpu_percent()
        memory = meter.memory()
    result = BenchmarkResult(time_mean=duration / measure_cycles_count,
                             samples_per_second=rows / duration if duration > 0 else float('inf'),
                             memory_info=memory, cpu=cpu)
    logger.info('Done measuring: %s', result)
    return result


def _matching_fields(dataset_url: str, field_regex: list[str] | None, batch: bool) -> list[Any]:
    if not field_regex:
        return []
    from petastorm.etl.dataset_metadata import infer_or_load_unischema, open_dataset
    from petastorm.metadata.store import stored_schema
    from petastorm.unischema import match_unischema_fields

    store = open_dataset(dataset_url)
    schema = infer_or_load_unischema(store) if batch else stored_schema(store)
    fields = match_unischema_fields(schema, field_regex)
    if not fields:
        raise ValueError(f'--field-regex {field_regex} matches no field of {dataset_url} '
                         f'(fields: {", ".join(schema.fields)})')
    return fields


def _rows_in(sample: Any, batched: bool) -> int:
    if not batched:
        return 1
    first = sample[0]
    return int(first.shape[0]) if hasattr(first, 'shape') and first.shape else len(first)


def _python_samples(reader: Any) -> Iterator[int]:
    batched = reader.batched_output
    for sample in reader:
        yield _rows_in(sample, batched)


def _tf_samples(reader: Any, shuffling_queue_size: int) -> Iterator[int]:
    from petastorm.tf_utils import make_petastorm_dataset

    dataset = make_petastorm_dataset(reader)
    if shuffling_queue_size > 0 and not reader.batched_output:
        dataset = dataset.shuffle(shuffling_queue_size)
    batched = reader.batched_output
    for sample in dataset:
        yield _rows_in([t.numpy() for t in sample], batched)


def _run_cycles(samples: Iterator[int], phase: str, count: int, reader: Any,
                on_progress: ProgressCallback | None) -> int:
    rows = 0
    phase_start = last_report = time.perf_counter()
    window_start, window_rows = phase_start, 0
    for done in range(1, count + 1):
        got = next(samples)
        rows += got
        window_rows += got
        if done % _DEBUG_EVERY_CYCLES == 0 and logger.isEnabledFor(logging.DEBUG):
            now = time.perf_counter()
            logger.debug('%.2f (mean: %.2f) samples/sec. diags: %s', window_rows / max(now - window_start, 1e-9),
                         rows / max(now - phase_start, 1e-9), reader.diagnostics)
            window_start, window_rows = now, 0
        if on_progress is not None and (done == count or time.perf_counter() - last_report >= _PROGRESS_EVERY_SECONDS):
            on_progress(phase, done, count)
            last_report = time.perf_counter()
    return rows
