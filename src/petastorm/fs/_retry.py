"""Retrying idempotent storage calls on transient errors, with capped exponential backoff and jitter.

The cloud clients retry their own requests (s3fs and botocore are configured to); this is the outer layer for
what they give up on or never see, such as a body cut short after its headers arrived.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from petastorm.errors import PetastormError
from petastorm.fs._errors import is_transient, redact

logger = logging.getLogger(__name__)

T = TypeVar('T')


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

    def call(self, func: Callable[[], T], what: str, secrets: Iterable[str] = ()) -> T:
        """``func()``, retried while it raises transient errors; each retry is logged at WARNING with ``what``.

        Args:
            func: the storage call.
            what: the operation and URL, for the log.
            secrets: texts never to log (credentials of the filesystem).

        Raises:
            RetriesExhausted: the last attempt failed with a transient error too.
            Exception: a non-transient error, at once and unchanged.
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return func()
            except Exception as err:
                if not is_transient(err):
                    raise
                if attempt == self.attempts:
                    raise RetriesExhausted(err, attempt) from err
                delay = self.delay(attempt)
                # WARNING: a person waiting on a slow or failing storage sees why, and which URL.
                logger.warning('%s failed with a transient error (%s: %s); retry %d of %d in %.2fs', what,
                               type(err).__name__, redact(str(err), secrets), attempt, self.attempts - 1, delay)
                time.sleep(delay)
        raise AssertionError('unreachable')  # pragma: no cover

    def __reduce__(self) -> tuple:
        return RetryPolicy, (self.attempts, self.base_delay, self.max_delay)


DEFAULT_RETRY = RetryPolicy()
