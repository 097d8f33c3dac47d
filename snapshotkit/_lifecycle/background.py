"""Rank 0's retention after each save, in a background thread that never blocks the caller."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from snapshotkit._lifecycle.janitor import RootJanitor
from snapshotkit._lifecycle.retention import RetentionPolicy, StepRecord

__all__ = ["BackgroundRetention"]

_log = logging.getLogger("snapshotkit.manager")


class BackgroundRetention:
    """Retention run after each save once it committed, one at a time, in a thread of its own.

    A failure is logged at WARNING and kept (the first one) for :meth:`wait` to raise.
    ``closed()`` says whether the manager closed meanwhile (then nothing more is deleted).
    """

    def __init__(self, janitor: RootJanitor, policy: RetentionPolicy, closed: Callable[[], bool]) -> None:
        self._janitor, self._policy, self._closed = janitor, policy, closed
        self._future: concurrent.futures.Future[None] | None = None
        self._error: BaseException | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(self, pending: Any | None, record: StepRecord) -> None:
        """Retain after the save of ``record.step`` (``pending``: its PendingSnapshot, if async)."""
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshotkit-retention")
        self._future = self._worker.submit(self._retain_after, pending, record)

    def settle(self) -> None:
        """Wait for the retention in flight (raising only if it could not run at all)."""
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def wait(self) -> None:
        """:meth:`settle`, then raise the first failure kept."""
        self.settle()
        failed, self._error = self._error, None
        if failed is not None:
            raise failed

    def close(self, *, wait: bool = True) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=wait, cancel_futures=not wait)

    def _retain_after(self, pending: Any | None, record: StepRecord) -> None:
        if pending is not None:
            try:
                pending.wait()
            except BaseException:
                return  # the caller learns of the failure from wait() or the next save()
        if self._closed():
            return
        try:
            self._janitor.remember(record)
            self._janitor.retain(self._policy)
        except Exception as exc:
            _log.warning("retention after the save of step %d failed: %s", record.step, exc, exc_info=exc)
            if self._error is None:
                self._error = exc
