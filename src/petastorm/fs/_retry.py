"""Retrying idempotent storage calls on transient errors, with capped exponential backoff and jitter.

The cloud clients retry their own requests (s3fs and botocore are configured to); this is the outer layer for
what they give up on or never see, such as a body cut short after its headers arrived.

Throttling (a 503 ``SlowDown``, a 429) is not a failure but the storage asking for fewer requests: it is retried
for as long as :data:`THROTTLED_PATIENCE` seconds, each wait drawn at random up to a cap that doubles (full jitter,
so that the threads and ranks that were refused together do not come back together), and each attempt holds a
slot of the bucket's :class:`~petastorm.fs._throttle.AdaptiveLimit`, which a throttled answer shrinks.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from petastorm.errors import PetastormError
from petastorm.fs._errors import is_throttling, is_transient, redact
from petastorm.fs._throttle import AdaptiveLimit

logger = logging.getLogger(__name__)

T = TypeVar('T')

#: seconds a throttled call keeps being retried before it fails (read at each call: tests shorten it).
THROTTLED_PATIENCE = 600.0
#: the cap of one wait after a throttled answer (the caps double from ``base_delay`` up to it).
THROTTLED_MAX_DELAY = 20.0


class RetriesExhausted(PetastormError, OSError):
    """Carries the last transient error and the number of attempts made.

    Our callers translate it into a :class:`~petastorm.errors.StorageError` that names the URL; a caller of
    :meth:`RetryPolicy.call` catches it as an ``OSError``: the storage failed.
    """

    def __init__(self, error: BaseException, attempts: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.attempts = attempts


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient failure is retried.

    Attributes:
        attempts: calls in total, the first included (1 disables retrying).
        base_delay: seconds before the first retry; doubled for each further retry.
        max_delay: cap on one delay.
    """

    attempts: int = 3
    base_delay: float = 0.1
    max_delay: float = 5.0
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f'{self.attempts=} should be at least 1')
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f'{self.base_delay=} and {self.max_delay=} should not be negative')

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based): full backoff, jittered down to half."""
        return min(self.max_delay, self.base_delay * 2 ** (retry - 1)) * self._rng.uniform(0.5, 1.0)

    def throttled_delay(self, throttles: int) -> float:
        """Seconds to wait after the ``throttles``-th throttled answer: anywhere up to a doubling cap."""
        return self._rng.uniform(0, min(THROTTLED_MAX_DELAY, self.base_delay * 2 ** throttles))

    def call(self, func: Callable[[], T], what: str, secrets: Iterable[str] = (),
             limit: AdaptiveLimit | None = None) -> T:
        """``func()``, retried while it raises transient errors; each retry is logged at WARNING with ``what``.

        Throttled answers are retried apart from the other transient errors, for :data:`THROTTLED_PATIENCE`
        seconds (see the module docstring).

        Args:
            func: the storage call.
            what: the operation and URL, for the log.
            secrets: texts never to log (credentials of the filesystem).
            limit: the slots of the bucket the call goes to: each attempt holds one, and tells it what it met.

        Raises:
            RetriesExhausted: the last attempt failed with a transient error too.
            Exception: a non-transient error, at once and unchanged.
        """
        attempt = throttles = 0
        started = time.monotonic()
        while True:
            try:
                with limit.slot() if limit is not None else contextlib.nullcontext():
                    result = func()
            except Exception as err:
                if not is_transient(err):
                    raise
                if is_throttling(err):
                    throttles += 1
                    if limit is not None:
                        limit.throttled()
                    waited = time.monotonic() - started
                    if throttles > 1 and waited >= THROTTLED_PATIENCE:
                        raise RetriesExhausted(err, attempt + throttles) from err
                    delay = min(self.throttled_delay(throttles), max(0.0, THROTTLED_PATIENCE - waited))
                    self._log_retry(what, err, secrets, f'throttled {throttles} time(s)', delay,
                                    logging.WARNING if throttles == 1 else logging.DEBUG)
                else:
                    attempt += 1
                    if attempt >= self.attempts:
                        raise RetriesExhausted(err, attempt + throttles) from err
                    delay = self.delay(attempt)
                    self._log_retry(what, err, secrets, f'retry {attempt} of {self.attempts - 1}', delay,
                                    logging.WARNING)
                time.sleep(delay)
                continue
            if limit is not None:
                limit.succeeded()
            return result

    @staticmethod
    def _log_retry(what: str, err: BaseException, secrets: Iterable[str], which: str, delay: float,
                   level: int) -> None:
        # WARNING: a person waiting on a slow or failing storage sees why, and which URL.
        logger.log(level, '%s failed with a transient error (%s: %s); %s, again in %.2fs', what,
                   type(err).__name__, redact(str(err), secrets), which, delay)

    def __reduce__(self) -> tuple:
        return RetryPolicy, (self.attempts, self.base_delay, self.max_delay)


DEFAULT_RETRY = RetryPolicy()
