"""Retrying transient storage failures: exponential backoff with full jitter, bounded and logged.

Object stores fail transiently (connection resets, 5xx, throttling) often enough that a large
take or restore would otherwise die of one bad request. :class:`RetryPolicy` says how hard to
try; :func:`call_with_retries` (blocking) and :func:`retry_async` run one idempotent call under
it. Each retry is logged at WARNING on the ``snapshotkit.storage`` logger with the error and the
delay; when the attempts or the time run out, :class:`~snapshotkit.errors.RetriesExhaustedError`
says how many attempts were made over how long, with the last error as its ``__cause__``.

Whether an error is transient is the plugin's call (it knows its backend's error codes:
:meth:`~snapshotkit.storage.StoragePlugin.is_transient`); :func:`is_transient_error` is the
default, covering what every network backend shares.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from snapshotkit.errors import ConfigError, RetriesExhaustedError

logger = logging.getLogger("snapshotkit.storage")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a plugin retries a request that failed transiently.

    Attempt ``n`` (``n >= 1``) that fails transiently is retried after a delay drawn uniformly
    from ``[0, min(max_delay_seconds, initial_delay_seconds * 2 ** (n - 1))]`` ("full jitter",
    so many clients backing off at once spread out), unless ``max_attempts`` attempts were made
    or the next attempt would start more than ``deadline_seconds`` after the first one.

    Attributes:
        max_attempts: total attempts per request, the first included (1 disables retries).
        initial_delay_seconds: the cap on the first backoff delay.
        max_delay_seconds: the cap on any backoff delay.
        deadline_seconds: no retry starts later than this after the first attempt.
    """

    max_attempts: int = 6
    initial_delay_seconds: float = 0.2
    max_delay_seconds: float = 10.0
    deadline_seconds: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("initial_delay_seconds", "max_delay_seconds", "deadline_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"RetryPolicy.{name} must not be negative, got {getattr(self, name)}")

    @classmethod
    def from_option(cls, value: RetryPolicy | Mapping[str, Any] | int | None) -> RetryPolicy:
        """The policy a ``retry`` storage option describes: a policy, a dict of its fields,
        an int (``max_attempts``), or None for the default."""
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, bool):
            raise ConfigError(f"the retry storage option must be a RetryPolicy, a dict or an int, got {value!r}")
        if isinstance(value, int):
            return cls(max_attempts=value)
        if isinstance(value, Mapping):
            known = {field.name for field in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigError(f"unknown retry option(s) {unknown}; known: {sorted(known)}")
            return cls(**value)
        raise ConfigError(f"the retry storage option must be a RetryPolicy, a dict or an int, got {value!r}")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The backoff delay before each retry (``max_attempts - 1`` of them)."""
        draw = (rng or random).uniform
        for attempt in range(1, self.max_attempts):
            yield draw(0.0, min(self.max_delay_seconds, self.initial_delay_seconds * 2 ** (attempt - 1)))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, without cycles."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


#: Exception class names (any module) of network-level failures worth retrying.
_TRANSIENT_NAMES = frozenset(
    {
        "ConnectionClosedError",  # botocore
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ClientConnectionError",  # aiohttp
        "ClientOSError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
    }
)


def is_transient_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its chain) is a connection reset, refusal or timeout."""
    for item in _chain(exc):
        if isinstance(item, (ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(item).__mro__):
            return True
    return False


#: HTTP statuses of a request that may succeed when sent again: timeout, throttling, server errors.
TRANSIENT_HTTP_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: errno values of network failures (plain ``OSError`` from some clients).
_TRANSIENT_ERRNOS = frozenset(
    code
    for code in (
        getattr(errno, name, None)
        for name in ("ECONNRESET", "ECONNABORTED", "ECONNREFUSED", "ETIMEDOUT", "EPIPE", "ENETRESET", "EHOSTUNREACH")
    )
    if code is not None
)
#: Errors that are answers, not failures: never transient, whatever their chain holds.
_ANSWERS = (FileNotFoundError, FileExistsError, EOFError, PermissionError, NotADirectoryError, IsADirectoryError)


def _http_status(exc: BaseException) -> int | None:
    for name in ("status", "status_code", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def is_transient_error(exc: BaseException) -> bool:
    """The default answer to "may this failure succeed when retried?".

    True for connection resets, refusals and aborts, timeouts (``ConnectionError``,
    ``TimeoutError``, the transport errors of botocore and aiohttp, ``errno`` ``ECONNRESET``,
    ``ETIMEDOUT`` and friends) and HTTP 408/429/5xx (an exception with an integer ``status``,
    ``status_code`` or ``code``), anywhere in the exception's chain. False for the contract's
    answers (``FileNotFoundError``, ``FileExistsError``, ``EOFError``, ``PermissionError``) and
    for :class:`~snapshotkit.errors.RetriesExhaustedError` (someone already retried).
    """
    if isinstance(exc, (*_ANSWERS, RetriesExhaustedError)):
        return False
    if is_transient_connection_error(exc):
        return True
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno in _TRANSIENT_ERRNOS:
            return True
        if _http_status(item) in TRANSIENT_HTTP_STATUSES:
            return True
    return False


class _Attempts:
    """The retry bookkeeping of one call: decides, after each failure, to retry (and how long to
    wait first) or to give up."""

    def __init__(self, policy: RetryPolicy, describe: str) -> None:
        self.policy = policy
        self.describe = describe
        self.started = time.monotonic()
        self.count = 0
        self._delays = policy.delays()

    def delay_after(self, exc: Exception) -> float:
        """The delay before the next attempt (logged), or raise :class:`RetriesExhaustedError`."""
        elapsed = time.monotonic() - self.started
        delay = next(self._delays, None)
        if delay is None or elapsed + delay > self.policy.deadline_seconds:
            raise RetriesExhaustedError(
                f"{self.describe} failed {self.count} time(s) over {elapsed:.1f} s with transient errors, the "
                f"last: {type(exc).__name__}: {exc}. The storage service is unavailable or throttling; retry "
                "later, or allow more with storage_options={'retry': {'max_attempts': ..., "
                "'deadline_seconds': ...}}"
            ) from exc
        logger.warning(
            "%s failed (attempt %d of %d): %s: %s; retrying in %.2f s",
            self.describe,
            self.count,
            self.policy.max_attempts,
            type(exc).__name__,
            exc,
            delay,
        )
        return delay


def call_with_retries(
    function: Callable[[], T],
    *,
    describe: str,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``function`` (an idempotent request, blocking) until it succeeds or may not retry.

    Non-transient errors propagate at once, unchanged. ``describe`` names the request in logs
    and errors (``"PUT s3://bucket/key"``).
    """
    attempts = _Attempts(policy, describe)
    while True:
        attempts.count += 1
        try:
            return function()
        except Exception as exc:
            if not is_transient(exc):
                raise
            sleep(attempts.delay_after(exc))


async def retry_async(
    function: Callable[[], Awaitable[T]],
    *,
    describe: str,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """:func:`call_with_retries` for a coroutine function; backs off with ``asyncio.sleep``.

    ``on_retry(exc)`` is called before each retry with the transient error that caused it.
    """
    attempts = _Attempts(policy, describe)
    while True:
        attempts.count += 1
        try:
            return await function()
        except Exception as exc:
            if not is_transient(exc):
                raise
            delay = attempts.delay_after(exc)
            if on_retry is not None:
                on_retry(exc)
            await asyncio.sleep(delay)
