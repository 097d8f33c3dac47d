"""A take in progress (:class:`TakeJob`): how it ended, reported once, and waited for at exit.

The engine (:mod:`snapshotkit._take.engine`) makes one per take and settles it with
:meth:`TakeJob._finish` (on the coordinator thread for ``async_take``), which emits
``take_committed`` (with an INFO line) or ``take_failed`` and then wakes :meth:`TakeJob.wait`.
At interpreter exit every pending take is finished (or fails) before the thread pools stop, and
background takes whose failure nobody saw through ``wait()`` are logged.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref

from snapshotkit._events import emit, format_bytes, transfer_summary
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._runtime.interrupt import wait_interruptibly
from snapshotkit._runtime.progress import ByteProgress
from snapshotkit._take.executors import shutdown_writers
from snapshotkit.errors import WaitTimeoutError

logger = logging.getLogger("snapshotkit.take")

_pending: weakref.WeakSet[TakeJob] = weakref.WeakSet()
#: Background takes that failed and whose error no ``wait()`` raised yet (logged at exit).
_unseen_failures: set[TakeJob] = set()


class TakeJob:
    """A take in progress: :meth:`wait` returns rank 0's committed metadata (None on other ranks).

    Args:
        path: rank 0's path, which every rank writes to.
        rank: this rank, and ``world_size`` ranks in all (for events and the log line).
        nbytes: the bytes this rank stages and writes.
        entries: the manifest entries this rank writes.
        progress: the bar the written bytes are counted into (closed when the take ends).
        step: the step the take's events carry (captured on the caller's thread).
        started_s: when the take started (``time.perf_counter()``; default: now).
    """

    def __init__(
        self,
        path: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        nbytes: int = 0,
        entries: int = 0,
        progress: ByteProgress | None = None,
        step: int | None = None,
        started_s: float | None = None,
    ) -> None:
        self.path = path
        self.entries = entries
        self.progress = progress if progress is not None else ByteProgress(path, enabled=False)
        #: ``async_take``: how long the caller was blocked (staging); None for ``take``.
        self.blocked_s: float | None = None
        self.rank = rank
        self.world_size = world_size
        self.nbytes = nbytes
        self.step = step
        self.referenced_bytes = 0
        #: Written by a background writer (``async_take``): a failure is also logged as a warning.
        self.background = False
        self.started_s = time.perf_counter() if started_s is None else started_s
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._metadata: SnapshotMetadata | None = None
        _pending.add(self)

    def done(self) -> bool:
        """Whether the take finished (committed, or failed)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> SnapshotMetadata | None:
        """Block until the take is committed; raise what went wrong.

        Raises:
            WaitTimeoutError: ``timeout`` seconds passed first; the take goes on.
        """
        if not wait_interruptibly(self._done.wait, timeout):
            raise WaitTimeoutError(
                f"the snapshot at {self.path!r} is still being written after {timeout} s; nothing was lost: "
                "call wait() again, or check done()"
            )
        if self._error is not None:
            _unseen_failures.discard(self)
            raise self._error
        return self._metadata

    def _staged(self) -> None:
        """Report that this rank's data is staged (``take_staged``)."""
        seconds = time.perf_counter() - self.started_s
        emit("take_staged", path=self.path, rank=self.rank, nbytes=self.nbytes, seconds=seconds, step=self.step)

    def _finish(self, error: BaseException | None, metadata: SnapshotMetadata | None = None) -> None:
        """Settle the take: report how it ended, then wake :meth:`wait` (so a caller that waited
        has seen the take's last event)."""
        try:
            self.progress.close()
            seconds = time.perf_counter() - self.started_s
            if error is not None:
                emit("take_failed", path=self.path, rank=self.rank, seconds=seconds, error=error, step=self.step)
                if self.background:  # reported at interpreter exit unless wait() raises it first
                    _unseen_failures.add(self)
            else:
                where = f"rank {self.rank} of {self.world_size}"
                if self.referenced_bytes:
                    where += f", {format_bytes(self.referenced_bytes)} referenced in base snapshots"
                if self.blocked_s is not None:
                    where += f", caller blocked {self.blocked_s:.2f} s"
                moved = transfer_summary(self.nbytes, seconds)
                logger.info("took snapshot %s: %d entries, %s, %s", self.path, self.entries, moved, where)
                emit(
                    "take_committed",
                    path=self.path,
                    rank=self.rank,
                    nbytes=self.nbytes,
                    seconds=seconds,
                    step=self.step,
                    referenced_bytes=self.referenced_bytes,
                )
        finally:
            self._error, self._metadata = error, metadata
            self._done.set()


def _wait_for_pending() -> None:
    for pending in list(_pending):
        pending._done.wait()


def _wait_for_pending_at_exit() -> None:
    """At interpreter exit, finish what is pending (or let it fail): never leave a half take; and say
    which background takes failed without anyone seeing it."""
    _wait_for_pending()
    shutdown_writers()
    for job in list(_unseen_failures):
        logger.warning("async_take of %s failed, and no wait() raised it: %s", job.path, job._error)
    _unseen_failures.clear()


# Interpreter exit first runs threading's exit hooks, newest first: concurrent.futures' hook
# stops every thread pool (including the I/O loop's), so pending snapshots must finish before
# it. Registered after concurrent.futures was imported, this hook runs before that one.
_register_threading_atexit = getattr(threading, "_register_atexit", None)
if _register_threading_atexit is not None:
    _register_threading_atexit(_wait_for_pending)
atexit.register(_wait_for_pending_at_exit)
