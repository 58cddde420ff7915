"""Measure how fast a reader delivers samples, with the process's memory and CPU use.

Importing this module needs neither TensorFlow, torch nor psutil: TensorFlow is imported only for
``read_method=ReadMethod.TF``, torch only for a torch :class:`Loader`, and psutil (when installed) only while
measuring. Without psutil, memory is the peak RSS and CPU the user+system time from :mod:`resource`.

:func:`measure_throughput` also measures through a torch loader and tells which stage (I/O, decode, transform,
collate, queue wait) bounds the rate; :func:`reader_throughput` is Petastorm's function.

Example:
    >>> result = reader_throughput('file:///tmp/dataset', warmup_cycles_count=100, measure_cycles_count=500)
    >>> print(f'{result.samples_per_second:.1f} samples/sec')  # doctest: +SKIP
    >>> report = measure_throughput('file:///tmp/dataset', loader=Loader.TORCH, time_stages=True)
    >>> print(report.stages.format())  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from petastorm.benchmark.stages import StageBreakdown, stage_breakdown
from petastorm.errors import PetastormError

logger = logging.getLogger(__name__)

__all__ = ['BenchmarkProcessError', 'BenchmarkResult', 'Loader', 'ReadMethod', 'ThroughputReport', 'WorkerPoolType',
           'measure_throughput', 'reader_throughput']

#: ``on_progress(phase, done, total)``; ``phase`` is ``'warmup'`` or ``'measure'``.
ProgressCallback = Callable[[str, int, int], None]

_PROGRESS_EVERY_SECONDS = 0.25
_DEBUG_EVERY_CYCLES = 1000
# The reader's own warning for make_reader on plain Parquet; the benchmark says it with the option to pass instead.


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


class Loader(Enum):
    """What the samples are read through.

    The reader itself (``NONE``), ``petastorm.pytorch.DataLoader`` (``TORCH``) or
    ``petastorm.pytorch.BatchedDataLoader`` (``TORCH_BATCHED``).
    """

    NONE = 'none'
    TORCH = 'torch'
    TORCH_BATCHED = 'torch-batched'

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


@dataclass(frozen=True)
class ThroughputReport:
    """What :func:`measure_throughput` measured.

    Attributes:
        result: rate, memory and CPU, as :func:`reader_throughput` returns them.
        stages: where the time went and which stage bounds the rate (None unless ``time_stages``).
    """

    result: BenchmarkResult
    stages: StageBreakdown | None


class BenchmarkProcessError(PetastormError, RuntimeError):
    """The benchmark failed in the child process that measured it.

    The message is the original error's; ``error_type`` is the class name of the original exception (the
    exception itself may not survive the trip between processes).
    """

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.error_type, str(self))


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

    The arguments are those of :func:`measure_throughput`; this is Petastorm's entry point, without the loader
    and the stage breakdown.

    Returns:
        A :class:`BenchmarkResult`.
    """
    return measure_throughput(
        dataset_url, field_regex, warmup_cycles_count, measure_cycles_count, pool_type, loaders_count,
        profile_threads, read_method, shuffling_queue_size, min_after_dequeue, reader_extra_args, spawn_new_process,
        batch=batch, on_progress=on_progress).result


def measure_throughput(dataset_url: str, field_regex: list[str] | None = None, warmup_cycles_count: int = 300,
                       measure_cycles_count: int = 1000, pool_type: WorkerPoolType | str = WorkerPoolType.THREAD,
                       loaders_count: int = 3, profile_threads: bool = False,
                       read_method: ReadMethod | str = ReadMethod.PYTHON, shuffling_queue_size: int = 500,
                       min_after_dequeue: int = 400, reader_extra_args: dict[str, Any] | None = None,
                       spawn_new_process: bool = True, *, batch: bool = False, loader: Loader | str = Loader.NONE,
                       loader_batch_size: int = 64, time_stages: bool = False,
                       on_progress: ProgressCallback | None = None) -> ThroughputReport:
    """Read ``warmup_cycles_count`` samples, then time ``measure_cycles_count`` more.

    The reader loops over the data forever (``num_epochs=None``), so the cycle counts may exceed the dataset size.

    Args:
        dataset_url: dataset URL, passed to ``make_reader`` / ``make_batch_reader``.
        field_regex: read only fields whose whole name matches one of these regular expressions (None: all).
        warmup_cycles_count: cycles before measuring (fills the worker queues).
        measure_cycles_count: measured cycles. A cycle is one ``next()`` on what is read: a row, a batch of a
            batch reader, or a loader batch.
        pool_type: a :class:`WorkerPoolType` or its value.
        loaders_count: ``workers_count`` of the reader.
        profile_threads: accepted for compatibility with Petastorm; has no effect (see ``time_stages``).
        read_method: :class:`ReadMethod`; ``TF`` pulls samples through ``petastorm.tf_utils.make_petastorm_dataset``
            (needs ``pip install 'neo-petastorm[tf]'``).
        shuffling_queue_size: with ``TF``, the size of the ``tf.data`` shuffle buffer (0: no shuffling).
        min_after_dequeue: accepted for compatibility; ``tf.data`` shuffling has no such setting.
        reader_extra_args: more keyword arguments for the reader factory (they override the ones above).
        spawn_new_process: measure in a fresh child process, so that memory reflects this benchmark only.
        batch: use ``make_batch_reader`` instead of ``make_reader``.
        loader: read through a torch loader (:class:`Loader`; needs ``pip install 'neo-petastorm[torch]'``) with
            ``loader_batch_size`` rows per batch; only with ``ReadMethod.PYTHON``.
        loader_batch_size: rows per loader batch.
        time_stages: measure the seconds of every stage and report which one bounds the rate.
        on_progress: called as ``on_progress(phase, done, total)`` a few times per second; it must be picklable
            (a module-level function) when ``spawn_new_process`` is True.

    Returns:
        A :class:`ThroughputReport`; ``samples_per_second`` always counts rows.

    Raises:
        ValueError: a cycle count is negative or ``measure_cycles_count`` is 0, an unknown pool/read method/loader,
            a loader with ``ReadMethod.TF``, or ``loader_batch_size`` < 1.
        MissingDependencyError: TensorFlow or torch is needed and not installed.
        BenchmarkProcessError: the benchmark failed in the child process (a ``RuntimeError`` with the original
            error's message; ``error_type`` names its class).
    """
    pool_type = WorkerPoolType(str(pool_type))
    read_method = ReadMethod(str(read_method))
    loader = Loader(str(loader))
    if warmup_cycles_count < 0 or measure_cycles_count < 1:
        raise ValueError(f'warmup_cycles_count={warmup_cycles_count} must be >= 0 and '
                         f'measure_cycles_count={measure_cycles_count} must be >= 1')
    if loader is not Loader.NONE and read_method is not ReadMethod.PYTHON:
        raise ValueError(f'loader={loader.value!r} reads through torch; it cannot be combined with '
                         f'read_method={read_method.value!r}')
    if loader_batch_size < 1:
        raise ValueError(f'loader_batch_size={loader_batch_size} must be >= 1')
    arguments: dict[str, Any] = dict(
        dataset_url=dataset_url, field_regex=field_regex, warmup_cycles_count=warmup_cycles_count,
        measure_cycles_count=measure_cycles_count, pool_type=pool_type, loaders_count=loaders_count,
        read_method=read_method, shuffling_queue_size=shuffling_queue_size, reader_extra_args=reader_extra_args,
        batch=batch, loader=loader, loader_batch_size=loader_batch_size, time_stages=time_stages,
        on_progress=on_progress)
    if not spawn_new_process:
        return _measure(**arguments)
    import multiprocessing

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn')) as executor:
        return executor.submit(_measure_in_child, arguments, logging.getLogger().getEffectiveLevel()).result()


def _measure_in_child(arguments: dict[str, Any], log_level: int) -> ThroughputReport:
    if log_level < logging.WARNING:  # a spawned child starts with no logging set up: mirror the parent's level
        logging.basicConfig(format='%(asctime)s %(levelname)s %(name)s: %(message)s', level=log_level)
    # Exceptions travel back pickled: keep the message, drop what may not pickle (locks, readers, frames).
    try:
        return _measure(**arguments)
    except Exception as err:
        raise BenchmarkProcessError(getattr(err, 'error_type', type(err).__name__), str(err)) from None


def _measure(dataset_url: str, field_regex: list[str] | None, warmup_cycles_count: int, measure_cycles_count: int,
             pool_type: WorkerPoolType, loaders_count: int, read_method: ReadMethod, shuffling_queue_size: int,
             reader_extra_args: dict[str, Any] | None, batch: bool, loader: Loader, loader_batch_size: int,
             time_stages: bool, on_progress: ProgressCallback | None) -> ThroughputReport:
    from petastorm._optional import import_optional

    if read_method is ReadMethod.TF:
        import_optional('tensorflow', '--read-method tf')
    if loader is not Loader.NONE:
        import_optional('torch', f'--loader {loader.value}')
    fields = _matching_fields(dataset_url, field_regex, batch, reader_extra_args or {})
    logger.info('Fields used in the benchmark: %s', [f.name for f in fields] if fields else 'all')
    reader_args: dict[str, Any] = dict(num_epochs=None, reader_pool_type=pool_type.value,
                                       workers_count=loaders_count, schema_fields=fields or None)
    reader_args.update(reader_extra_args or {})
    if not batch:
        _warn_if_plain_parquet(dataset_url, reader_args)
    reader = _open_reader(dataset_url, batch, reader_args, time_stages)
    meter = _ResourceMeter()
    with _wrap_in_loader(reader, loader, loader_batch_size) as source:
        if read_method is ReadMethod.TF:
            samples = _tf_samples(reader, shuffling_queue_size)
        else:
            samples = _python_samples(source, batched=reader.batched_output or loader is not Loader.NONE)
        _run_cycles(samples, 'warmup', warmup_cycles_count, reader, on_progress)
        logger.info('Done warmup')
        before = reader.diagnostics.get('stages')
        meter.start()
        started = time.perf_counter()
        rows = _run_cycles(samples, 'measure', measure_cycles_count, reader, on_progress)
        duration = time.perf_counter() - started
        cpu = meter.cpu_percent()
        memory = meter.memory()
        after = reader.diagnostics.get('stages')
        samples.close()  # a tf.data iterator holds the reader: release it before the reader stops
    result = BenchmarkResult(time_mean=duration / measure_cycles_count,
                             samples_per_second=rows / duration if duration > 0 else float('inf'),
                             memory_info=memory, cpu=cpu)
    stages = None
    if before is not None and after is not None:
        # From the arguments the reader got: reader_extra_args may override the pool's kind and size.
        stages = stage_breakdown(before, after, duration, rows, reader_args['workers_count'],
                                 inline=reader_args['reader_pool_type'] == WorkerPoolType.NONE.value)
    logger.info('Done measuring: %s', describe_result(result, measure_cycles_count, rows, duration))
    return ThroughputReport(result=result, stages=stages)


def describe_result(result: BenchmarkResult, cycles: int | None = None, rows: int | None = None,
                    seconds: float | None = None) -> str:
    """One readable line for a result.

    For example ``1000 cycles (1000 rows) in 0.25 s: 4000.00 samples/sec, RSS 95.1 MB, CPU 101.3%``; the part
    before the colon only when ``cycles``, ``rows`` and ``seconds`` are given.
    """
    measured = ''
    if cycles is not None and rows is not None and seconds is not None:
        measured = f'{cycles} cycles ({rows} rows) in {seconds:.2f} s: '
    return (f'{measured}{result.samples_per_second:.2f} samples/sec, RSS {result.memory_info.rss / 2**20:.1f} MB, '
            f'CPU {result.cpu:.1f}%')


def _warn_if_plain_parquet(dataset_url: str, reader_args: dict[str, Any]) -> None:
    """Say, naming the option, that ``make_reader`` is measured on a store without Petastorm metadata."""
    from petastorm.fs import resolve_location
    from petastorm.metadata.schemas import has_petastorm_metadata
    from petastorm.store.opening import open_store

    store = open_store(resolve_location(dataset_url, reader_args.get('storage_options'), reader_args.get('filesystem')))
    if has_petastorm_metadata(store):
        return
    logger.warning('%s is a plain Parquet store (no Petastorm metadata): make_reader reads it one row per cycle, '
                   'with a schema inferred from the files. Pass --batch (batch=True) to measure make_batch_reader, '
                   'which is made for plain Parquet stores.', dataset_url)


def _open_reader(dataset_url: str, batch: bool, reader_args: dict[str, Any], time_stages: bool) -> Any:
    """``make_reader``/``make_batch_reader`` with the same arguments, optionally timing its stages."""
    from petastorm.reader import Reader, normalize_dataset_url_or_urls
    from petastorm.reading.options import validate_options

    options = validate_options(dataset_url_or_urls=normalize_dataset_url_or_urls(dataset_url), batched_output=batch,
                               **reader_args)
    return Reader(options, time_stages=time_stages)


def _wrap_in_loader(reader: Any, loader: Loader, batch_size: int) -> Any:
    """The reader itself, or a torch loader over it; either stops and joins the reader on exit."""
    if loader is Loader.NONE:
        return reader
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    loader_class = DataLoader if loader is Loader.TORCH else BatchedDataLoader
    return loader_class(reader, batch_size=batch_size)


def _matching_fields(dataset_url: str, field_regex: list[str] | None, batch: bool,
                     reader_args: dict[str, Any]) -> list[Any]:
    if not field_regex:
        return []
    from petastorm.fs import resolve_location
    from petastorm.metadata.schemas import stored_or_inferred_schema
    from petastorm.store.opening import open_store
    from petastorm.unischema import match_unischema_fields

    # The schema is read with the same storage settings the reader gets (credentials, endpoint).
    store = open_store(resolve_location(dataset_url, reader_args.get('storage_options'), reader_args.get('filesystem')))
    # make_reader falls back to the inferred schema on a plain Parquet store too.
    schema = stored_or_inferred_schema(store).schema
    fields = match_unischema_fields(schema, field_regex)
    if not fields:
        raise ValueError(f'--field-regex {field_regex} matches no field of {dataset_url} '
                         f'(fields: {", ".join(schema.fields)})')
    return fields


def _rows_in(sample: Any, batched: bool) -> int:
    """Rows in one sample: 1 for a row, else the length of its first column (a loader batch may be a dict)."""
    if not batched:
        return 1
    first = next(iter(sample.values())) if isinstance(sample, dict) else sample[0]
    return int(first.shape[0]) if hasattr(first, 'shape') and len(first.shape) else len(first)


def _python_samples(source: Any, batched: bool) -> Generator[int, None, None]:
    for sample in source:
        yield _rows_in(sample, batched)


def _tf_samples(reader: Any, shuffling_queue_size: int) -> Generator[int, None, None]:
    from petastorm.tf_utils import make_petastorm_dataset

    dataset = make_petastorm_dataset(reader)
    if shuffling_queue_size > 0 and not reader.batched_output:
        dataset = dataset.shuffle(shuffling_queue_size)
    batched = reader.batched_output
    for sample in dataset:  # eager tensors: already computed, no conversion needed to count rows
        yield _rows_in(sample, batched)


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
