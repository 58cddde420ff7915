"""Progress of long work where a person waits: a ``tqdm`` bar on a terminal, else lines through :mod:`logging`.

``tqdm`` is optional (``pip install 'neo-petastorm[progress]'``). Every function that uses this module takes a
``progress`` argument:

* ``None`` (the default): a bar when ``tqdm`` is installed and stderr is a terminal (drawn once the work has
  taken a couple of seconds); otherwise an INFO line every few seconds on the ``petastorm`` loggers (visible
  once logging is configured, as the command-line tools do);
* ``True``: a bar whenever ``tqdm`` is installed (even without a terminal), else the INFO lines;
* ``False``: neither.

Example::

    with ProgressMeter('writing file:///tmp/ds', total=1000, unit='rows', enabled=progress) as meter:
        for chunk in chunks:
            meter.update(len(chunk))
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

__all__ = ['ProgressMeter', 'SparkJobProgress', 'check_progress_argument']

_logger = logging.getLogger('petastorm.progress')
#: Seconds between two INFO lines when there is no bar.
LOG_EVERY_SECONDS = 5.0
#: Seconds an automatic bar waits before it is drawn.
BAR_DELAY_SECONDS = 2.0
#: Seconds between two looks at Spark's status tracker.
SPARK_POLL_SECONDS = 0.5


def check_progress_argument(progress: Any) -> bool | None:
    """``progress`` itself when it is None, True or False.

    Raises:
        ValueError: anything else.
    """
    if progress is None or isinstance(progress, bool):
        return progress
    raise ValueError(f'progress must be None (automatic), True or False, got {progress!r}')


def _is_connect_session(spark: Any) -> bool:
    # Recognised by module, so that pyspark is not imported here (petastorm.spark.session does the same).
    return type(spark).__module__.startswith('pyspark.sql.connect')


def _tqdm_class() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


class ProgressMeter:
    """Counts the units of one long task done so far and shows them (see the module doc for ``enabled``).

    Args:
        description: what is being done, e.g. ``'writing file:///tmp/ds'``; starts every line and the bar.
        total: units the task has, when known in advance (the bar then shows a percentage and a time left).
        unit: what is counted (``'rows'``, ``'files'``, ``'tasks'``...).
        enabled: None, True or False, as the ``progress`` argument of the public functions.
        logger: where the lines go (default ``petastorm.progress``).
        log_every: seconds between two lines when there is no bar (default :data:`LOG_EVERY_SECONDS`).
    """

    def __init__(self, description: str, total: int | None = None, unit: str = 'rows', enabled: bool | None = None,
                 logger: logging.Logger | None = None, log_every: float | None = None) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0
        self._logger = logger or _logger
        self._log_every = LOG_EVERY_SECONDS if log_every is None else log_every
        self._logs = enabled is not False
        self._started = self._last_line = time.monotonic()
        self._bar: Any = None
        if enabled is not False:
            tqdm = _tqdm_class()
            if tqdm is not None and (enabled or _stderr_is_terminal()):
                # Automatic bars wait a moment, so that short work draws nothing.
                self._bar = tqdm(total=total, desc=description, unit=f' {unit}', file=sys.stderr, leave=True,
                                 dynamic_ncols=True, mininterval=0.2, delay=0 if enabled else BAR_DELAY_SECONDS)

    @property
    def shows_bar(self) -> bool:
        """True when a ``tqdm`` bar is drawn (no lines are logged then)."""
        return self._bar is not None

    def set_total(self, total: int | None) -> None:
        """Change the number of units the task has (it may grow as the work is discovered)."""
        if total == self.total:
            return
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, count: int = 1) -> None:
        """Count ``count`` more units as done."""
        self.update_to(self.done + count)

    def update_to(self, done: int) -> None:
        """Set the number of units done so far."""
        if self._bar is not None:
            self._bar.update(done - self.done)
            self.done = done
            return
        self.done = done
        now = time.monotonic()
        if self._logs and now - self._last_line >= self._log_every:
            self._last_line = now
            self._log_line(now)

    def _log_line(self, now: float) -> None:
        rate = self.done / max(now - self._started, 1e-9)
        if self.total:
            self._logger.info('%s: %d/%d %s (%.0f%%), %.1f %s/s', self.description, self.done, self.total, self.unit,
                              100.0 * self.done / self.total, rate, self.unit)
        else:
            self._logger.info('%s: %d %s, %.1f %s/s', self.description, self.done, self.unit, rate, self.unit)

    def close(self) -> None:
        """Finish the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._logs = False

    def __enter__(self) -> ProgressMeter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class SparkJobProgress:
    """Shows the tasks of the Spark jobs started while the ``with`` block runs, done out of known.

    A thread looks at the ``SparkContext``'s status tracker twice a second and feeds a :class:`ProgressMeter`
    (unit ``tasks``); it is stopped and joined when the block ends. A Spark Connect session has no
    ``SparkContext``: there the server's progress reports of the block's operations feed the meter instead,
    through a handler registered for the block (``registerProgressHandler``). Unless ``enabled`` is True, nothing
    is shown when a classic session draws its own console progress bar (``spark.ui.showConsoleProgress``).

    Args:
        spark: a ``SparkSession`` or ``SparkContext``.
        description: what the jobs do.
        enabled: as the ``progress`` argument of the public functions.
        logger: where the lines go when there is no bar.
    """

    def __init__(self, spark: Any, description: str, enabled: bool | None = None,
                 logger: logging.Logger | None = None) -> None:
        self._description = description
        self._enabled = enabled
        self._logger = logger
        self._group: str | None = None
        self._connect_session = spark if enabled is not False and _is_connect_session(spark) else None
        self._connect_stages: dict[tuple[str | None, int], tuple[int, int]] = {}
        self._connect_handler = self._on_connect_progress  # one bound method, so that the same one is removed
        self._tracker = self._status_tracker(spark) if enabled is not False and self._connect_session is None \
            else None
        self._meter: ProgressMeter | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._before: set[int] = set()
        self._jobs: set[int] = set()

    def _status_tracker(self, spark: Any) -> Any:
        try:
            context = getattr(spark, 'sparkContext', spark)
            if self._enabled is None and context.getConf().get('spark.ui.showConsoleProgress', 'false') == 'true':
                return None  # Spark draws its own bar on the same stderr
            # The jobs this thread starts belong to its job group (None when unset); it is a thread-local setting,
            # so it is read here, in the caller's thread.
            self._group = context.getLocalProperty('spark.jobGroup.id')
            return context.statusTracker()
        except Exception:  # noqa: BLE001 - Spark Connect (no SparkContext) or a stand-in object: no progress
            return None

    def _known_jobs(self, tracker: Any) -> set[int]:
        # A job that ran between two looks is no longer active, but is still listed in its group.
        return set(tracker.getActiveJobsIds()) | set(tracker.getJobIdsForGroup(self._group))

    def __enter__(self) -> SparkJobProgress:
        if self._connect_session is not None:
            return self._watch_connect(self._connect_session)
        if self._tracker is None:
            return self
        self._before = self._known_jobs(self._tracker)
        self._meter = ProgressMeter(self._description, None, 'tasks', self._enabled, self._logger)
        self._thread = threading.Thread(target=self._watch, name='petastorm-spark-progress', daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(SPARK_POLL_SECONDS):
            self._poll()

    def _poll(self) -> None:
        tracker, meter = self._tracker, self._meter
        if tracker is None or meter is None:
            return
        try:
            self._jobs.update(self._known_jobs(tracker) - self._before)
            total = done = 0
            for job_id in sorted(self._jobs):
                job = tracker.getJobInfo(job_id)
                # A finished job's stages count as done: a stage it skipped (its shuffle output was already
                # there) never completes a task.
                finished = job is not None and str(job.status) == 'SUCCEEDED'
                for stage_id in job.stageIds if job is not None else ():
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None:
                        total += stage.numTasks
                        done += stage.numTasks if finished else stage.numCompletedTasks
        except Exception:  # noqa: BLE001 - the session stopped under us: progress is only a display
            return
        if total:
            meter.set_total(total)
            meter.update_to(done)

    def _watch_connect(self, session: Any) -> SparkJobProgress:
        # The server's spark.ui.showConsoleProgress draws on the server's console, not here: it is not looked at.
        try:
            self._meter = ProgressMeter(self._description, None, 'tasks', self._enabled, self._logger)
            session.registerProgressHandler(self._connect_handler)
        except Exception:  # noqa: BLE001 - an older client without progress reports: show nothing
            if self._meter is not None:
                self._meter.close()
                self._meter = None
            self._connect_session = None
        return self

    def _on_connect_progress(self, stages: Any, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        """Called by the Spark Connect client (in the thread running the operation) with the server's report."""
        meter = self._meter
        if meter is None:
            return
        for stage in stages or ():
            completed = stage.num_tasks if stage.done else stage.num_completed_tasks
            self._connect_stages[(operation_id, stage.stage_id)] = (stage.num_tasks, completed)
        if done:  # the operation finished: its stages ran every task (the last report may predate that)
            for key, (tasks, _) in list(self._connect_stages.items()):
                if key[0] == operation_id:
                    self._connect_stages[key] = (tasks, tasks)
        total = sum(tasks for tasks, _ in self._connect_stages.values())
        if total:
            meter.set_total(total)
            meter.update_to(sum(completed for _, completed in self._connect_stages.values()))

    def __exit__(self, *exc_info: Any) -> None:
        if self._connect_session is not None:
            try:
                self._connect_session.removeProgressHandler(self._connect_handler)
            except Exception:  # noqa: BLE001 - the session was stopped under us: progress is only a display
                pass
            self._connect_session = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            if exc_info[0] is None:
                self._poll()
        if self._meter is not None:
            self._meter.close()
            self._meter = None
